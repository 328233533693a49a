"""A driver that is gone is marked: the rule of when a node's agent is gone (``agents``, an
injected clock), DeviceTaintRules as the view and the explanations read them (``taintrules``),
and the leader's part (``absences.DriverGone``) against a scripted API server on loopback that
keeps DeviceTaintRules as the real one would (409 for a name taken, 404 for one not there)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dra_gpu.controller import absences, agents, explain, taintrules
from dra_gpu.controller.absences import DriverGone
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.view import ClusterView
from dra_gpu.resource import labels, names
from dra_gpu.serving import metrics
from tests.support.api_servers import scripted_api, status
from tests.unit.controller.test_explain import (
    explain_tutorial,
    gpu_slice,
    pending_pod,
    ready_node,
    tutorial_slice,
)

DRIVER = "gpu.example.com"
NS = "dra-gpu"
SELECTOR = "app.kubernetes.io/name=dra-gpu,app.kubernetes.io/component=agent"
WALL = datetime.datetime(2030, 1, 1, 10, 0, 0, tzinfo=datetime.UTC)
V1 = "/apis/resource.k8s.io/v1"
RULES = f"{V1}/devicetaintrules"

Body = dict[str, Any]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def agent_pod(
    node: str, *, ready: bool | None = True, name: str | None = None, since: str | None = None
) -> Body:
    status: Body = {"phase": "Running"}
    if ready is not None:
        condition: Body = {"type": "Ready", "status": "True" if ready else "False"}
        if since:
            condition["lastTransitionTime"] = since
        status["conditions"] = [condition]
    return {
        "metadata": {
            "name": name or f"dra-gpu-agent-{node}",
            "namespace": NS,
            "uid": f"uid-{name or node}",
            "labels": {
                "app.kubernetes.io/name": "dra-gpu",
                "app.kubernetes.io/component": "agent",
                "controller-revision-hash": "abc",
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
        "status": status,
    }


def rule_body(name: str, *, ours: bool = True, **selector: str) -> Body:
    meta: Body = {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"}
    if ours:
        meta["labels"] = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY_VALUE}
    return {
        "metadata": meta,
        "spec": {
            "deviceSelector": selector or {"driver": DRIVER, "pool": "node-02"},
            "taint": {"key": absences.taint_key(DRIVER), "effect": "NoSchedule"},
        },
    }


# --- who is an agent --------------------------------------------------------------------------


def test_the_agent_selector_matches_labels_and_namespace() -> None:
    selector = agents.AgentSelector(SELECTOR, NS)
    assert selector(agent_pod("node-01"))
    assert not selector({**agent_pod("node-01"), "metadata": {"namespace": "other"}})
    other = agent_pod("node-01")
    other["metadata"]["labels"]["app.kubernetes.io/component"] = "controller"
    assert not selector(other)
    assert agents.AgentSelector("a==b").labels == {"a": "b"}
    assert agents.AgentSelector("a=b", "")({"metadata": {"namespace": "x", "labels": {"a": "b"}}})
    for bad in ("", "a", "a!=b", "a in (b)", ","):
        with pytest.raises(ValueError, match="agent pod selector"):
            agents.AgentSelector(bad)


# --- the rule: gone since, the grace, back ----------------------------------------------------


def test_an_agent_gone_longer_than_the_grace_is_gone_and_back_when_ready() -> None:
    clock = Clock()
    seen = agents.Absences(10.0, clock, lambda: WALL)
    assert not seen.update("node-02", [agent_pod("node-02")], has_pool=True)
    assert seen.gone() == {}
    assert seen.due_in() is None
    assert seen.update("node-02", [], has_pool=True)  # the pod went
    assert seen.gone() == {}
    assert seen.due_in() == 10.0
    clock.now += 9.9
    assert seen.gone() == {}
    assert seen.due_in() == pytest.approx(0.1)
    clock.now += 0.1
    (gone,) = seen.gone().values()
    assert gone == agents.Absence(
        "node-02", 1000.0, "2030-01-01T10:00:00Z", "no agent pod on node-02"
    )
    assert seen.due_in() is None
    # A new pod, not Ready yet: still the same absence (its time kept), now with its reason.
    seen.update(
        "node-02", [agent_pod("node-02", ready=False, since="2030-01-01T10:00:30Z")], has_pool=True
    )
    (still,) = seen.gone().values()
    assert still.observed == 1000.0
    assert still.why == f"agent pod {NS}/dra-gpu-agent-node-02 is not Ready"
    assert still.since == "2030-01-01T10:00:30Z"
    assert seen.update("node-02", [agent_pod("node-02")], has_pool=True)  # Ready: back
    assert seen.gone() == {}
    assert seen.absent() == {}


def test_a_not_ready_pod_says_since_when_from_its_ready_condition() -> None:
    clock = Clock()
    seen = agents.Absences(5.0, clock, lambda: WALL)
    pod = agent_pod("node-01", ready=False, since="2030-01-01T09:59:00Z")
    seen.update("node-01", [pod], has_pool=True)
    clock.now += 5
    assert seen.gone()["node-01"].since == "2030-01-01T09:59:00Z"
    no_condition = agent_pod("node-03", ready=None)  # Pending: no Ready condition at all
    seen.update("node-03", [no_condition], has_pool=True)
    assert seen.absent()["node-03"].since == "2030-01-01T10:00:00Z"


def test_a_node_without_our_pool_is_never_gone() -> None:
    clock = Clock()
    seen = agents.Absences(0.0, clock, lambda: WALL)
    assert not seen.update("cpu-node", [], has_pool=False)
    assert seen.gone() == {}
    seen.update("node-02", [], has_pool=True)
    assert list(seen.gone()) == ["node-02"]
    assert seen.update("node-02", [], has_pool=False)  # its pool went: nothing to mark
    assert seen.gone() == {}


def test_during_a_rollout_any_ready_pod_means_present() -> None:
    clock = Clock()
    seen = agents.Absences(0.0, clock, lambda: WALL)
    old = agent_pod("node-01", name="agent-old")
    new = agent_pod("node-01", name="agent-new", ready=False)
    seen.update("node-01", [old, new], has_pool=True)
    assert seen.gone() == {}
    old_going = agent_pod("node-01", name="agent-old", ready=False)
    seen.update("node-01", [old_going, agent_pod("node-01", name="agent-new")], has_pool=True)
    assert seen.gone() == {}
    seen.update("node-01", [old_going, new], has_pool=True)  # neither Ready
    assert seen.gone()["node-01"].why == (
        f"agent pods {NS}/agent-old, {NS}/agent-new are not Ready"
    )


# --- DeviceTaintRules, as the scheduler reads them --------------------------------------------


def test_a_rule_adds_its_taint_to_the_devices_it_selects_only() -> None:
    slices = [gpu_slice("node-01", {"gpu-0": "24Gi"}), gpu_slice("node-02", {"gpu-0": "24Gi"})]
    rule = taintrules.Rule.read(rule_body("r"))
    assert rule is not None
    tainted = taintrules.tainted_slices(slices, [rule])
    assert tainted[0] is slices[0]  # node-01's pool: not selected, the same object
    (device,) = tainted[1]["spec"]["devices"]
    assert device["taints"] == [
        {"key": f"{DRIVER}/agent-gone", "effect": "NoSchedule", "rule": "r"}
    ]
    assert "taints" not in slices[1]["spec"]["devices"][0]  # the input is left as it was
    one_device = taintrules.Rule.read(rule_body("d", driver=DRIVER, device="gpu-1"))
    assert taintrules.tainted_slices(slices, [one_device]) == slices  # type: ignore[list-item]
    # No selector selects nothing; a class or CEL selector (v1alpha3) is not understood.
    assert (
        taintrules.Rule.read(
            {"metadata": {"name": "x"}, "spec": {"taint": {"key": "k", "effect": "NoSchedule"}}}
        )
        is None
    )
    cel = rule_body("c", driver=DRIVER)
    cel["spec"]["deviceSelector"]["selectors"] = [{"cel": {"expression": "true"}}]
    assert taintrules.Rule.read(cel) is None


def test_the_view_taints_a_pool_when_a_rule_comes_and_untaints_it_when_it_goes() -> None:
    view = ClusterView(pods_without_claims=False)
    view.apply("ResourceSlice", "ADDED", gpu_slice("node-02", {"gpu-0": "24Gi"}))
    view.take_changes()
    key = (DRIVER, "node-02")
    assert view.pools[key].devices[0].taints == ()
    view.apply("DeviceTaintRule", "ADDED", rule_body(f"{DRIVER}-node-02-agent-gone"))
    changes = view.take_changes()
    assert changes.rules == {f"{DRIVER}-node-02-agent-gone"}
    assert key in changes.pools  # a change of the pool: explanations and tallies look again
    (taint,) = view.pools[key].devices[0].taints
    assert taint["key"] == f"{DRIVER}/agent-gone"
    view.apply("DeviceTaintRule", "DELETED", rule_body(f"{DRIVER}-node-02-agent-gone"))
    assert key in view.take_changes().pools
    assert view.pools[key].devices[0].taints == ()


def test_the_view_keeps_agent_pods_without_claims_by_node() -> None:
    view = ClusterView(pods_without_claims=False, agent_pods=agents.AgentSelector(SELECTOR, NS))
    view.apply("Pod", "ADDED", agent_pod("node-01"))
    other = agent_pod("node-01", name="web")
    other["metadata"]["labels"] = {"app": "web"}
    view.apply("Pod", "ADDED", other)
    assert [p["metadata"]["name"] for p in view.agents_on("node-01")] == ["dra-gpu-agent-node-01"]
    assert f"{NS}/web" not in view.pods  # other pods without claims: not kept, as before
    assert view.take_changes().agents == {"node-01"}
    view.apply("Pod", "DELETED", agent_pod("node-01"))
    assert view.agents_on("node-01") == []
    assert view.agent_nodes() == set()
    assert view.take_changes().agents == {"node-01"}


# --- explanations show the taint and why ------------------------------------------------------


def test_an_explanation_names_the_rule_and_why_the_devices_are_tainted() -> None:
    view = ClusterView(pods_without_claims=False)
    view.apply("ResourceSlice", "ADDED", tutorial_slice())
    body = rule_body(f"{DRIVER}-node-01-agent-gone", driver=DRIVER, pool="node-01")
    body["spec"]["taint"]["timeAdded"] = "2030-01-01T10:00:10Z"
    body["metadata"]["annotations"] = {
        taintrules.DESCRIPTION_ANNOTATION: "the agent of gpu.example.com on node-01 has not "
        "been ready since 2030-01-01T10:00:00Z: no agent pod on node-01"
    }
    view.apply("DeviceTaintRule", "ADDED", body)
    tainted = [dict(s) for s in view.tainted_slices()]
    result = explain_tutorial(slices=tainted, nodes={"node-01": ready_node()})
    assert result.reason == explain.Reason.DEVICES_TAINTED
    assert result.message == (
        "request gpu: no device fits: node-01/gpu-1 has memory 8Gi, needs >= 24Gi; "
        "node-01/gpu-0 is tainted gpu.example.com/agent-gone:NoSchedule since 10:00 "
        "(DeviceTaintRule gpu.example.com-node-01-agent-gone: the agent of gpu.example.com on "
        "node-01 has not been ready since 2030-01-01T10:00:00Z: no agent pod on node-01)"
    )


# --- the leader's part, against a scripted API server -----------------------------------------


@dataclasses.dataclass
class FakeApi:
    objects: dict[str, Body] = dataclasses.field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = dataclasses.field(default_factory=list)
    served: bool = True
    version: int = 10

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.requests if m in ("POST", "DELETE")]

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and path.startswith("/apis/resource.k8s.io/"):
            if not self.served or path != V1:
                return 404, status(404, "NotFound")
            return 200, {"kind": "APIResourceList", "resources": [{"name": "devicetaintrules"}]}
        if method == "POST" and path.endswith("/events"):
            return 201, body
        if method == "POST" and path == RULES:
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return 409, status(409, "AlreadyExists")
            self.version += 1
            stored = json.loads(json.dumps(body))
            stored["metadata"].update(uid=f"uid-{self.version}", resourceVersion=str(self.version))
            self.objects[target] = stored
            return 201, stored
        if method == "DELETE":
            current = self.objects.get(path)
            if current is None:
                return 404, status(404, "NotFound")
            uid = ((body or {}).get("preconditions") or {}).get("uid")
            if uid and uid != current["metadata"]["uid"]:
                return 409, status(409, "Conflict")
            del self.objects[path]
            return 200, current
        return 405, status(405, "MethodNotAllowed")


@dataclasses.dataclass
class Cluster:
    """A view with node-01 and node-02 (each a pool of ours, an agent pod Ready), the part."""

    view: ClusterView
    part: DriverGone
    clock: Clock
    fake: FakeApi
    woken: list[float]

    def agent(self, node: str, **options: Any) -> None:
        self.view.apply("Pod", "MODIFIED", agent_pod(node, **options))

    def agent_gone(self, node: str) -> None:
        self.view.apply("Pod", "DELETED", agent_pod(node))

    def watch_rules(self) -> None:
        """What the watch would bring: the API server's rules into the view."""
        for name in list(self.view.taint_rules):
            if f"{RULES}/{name}" not in self.fake.objects:
                self.view.apply("DeviceTaintRule", "DELETED", self.view.taint_rules[name])
        for body in self.fake.objects.values():
            self.view.apply("DeviceTaintRule", "ADDED", body)

    async def pass_(self) -> None:
        """One pass of the controller, as leader."""
        changes = self.view.take_changes()
        self.part.track(changes)
        self.part.note(changes)
        await self.part.run_once()


@contextlib.asynccontextmanager
async def cluster(fake: FakeApi, grace: float = 10.0) -> AsyncIterator[Cluster]:
    view = ClusterView(pods_without_claims=False, agent_pods=agents.AgentSelector(SELECTOR, NS))
    for node in ("node-01", "node-02"):
        view.apply("Node", "ADDED", {"metadata": {"name": node, "uid": f"uid-{node}"}})
        view.apply("ResourceSlice", "ADDED", gpu_slice(node, {"gpu-0": "24Gi", "gpu-1": "8Gi"}))
        view.apply("Pod", "ADDED", agent_pod(node))
    clock = Clock()
    woken: list[float] = []
    async with scripted_api(fake) as api:
        part = DriverGone(
            view,
            api,
            Reporter(api, "test"),
            DRIVER,
            grace,
            lambda: woken.append(clock.now),
            clock=clock,
            wall=lambda: WALL,
        )
        part.sweep()
        yield Cluster(view, part, clock, fake, woken)


async def test_the_leader_taints_a_node_whose_agent_is_gone_and_lifts_it_when_back() -> None:
    fake = FakeApi()
    async with cluster(fake) as c:
        await c.pass_()
        assert fake.writes() == []
        c.agent_gone("node-02")
        await c.pass_()
        assert fake.writes() == []  # within the grace
        assert c.part._timer is not None  # a pass is due when the grace is over
        c.clock.now += 10
        await c.pass_()
        name = "gpu.example.com-node-02-agent-gone"
        assert fake.writes() == [("POST", RULES)]
        assert fake.objects[f"{RULES}/{name}"] == {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY_VALUE},
                "annotations": {
                    taintrules.DESCRIPTION_ANNOTATION: "the agent of gpu.example.com on node-02 "
                    "has not been ready since 2030-01-01T10:00:00Z: no agent pod on node-02"
                },
                "uid": "uid-11",
                "resourceVersion": "11",
            },
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": "node-02"},
                "taint": {
                    "key": "gpu.example.com/agent-gone",
                    "effect": "NoSchedule",
                    "timeAdded": "2030-01-01T10:00:00Z",
                },
            },
        }
        assert metrics.NODES_DRIVER_GONE._value.get() == 1
        c.watch_rules()
        await c.pass_()
        assert fake.writes() == [("POST", RULES)]  # there: nothing more to write
        c.agent("node-02", ready=False)  # back, not Ready yet: still gone
        await c.pass_()
        assert len(fake.writes()) == 1
        c.agent("node-02")
        await c.pass_()
        assert fake.writes() == [("POST", RULES), ("DELETE", f"{RULES}/{name}")]
        _, _, delete = fake.requests[-1]
        assert delete["preconditions"] == {"uid": "uid-11"}
        assert metrics.NODES_DRIVER_GONE._value.get() == 0
        c.part._wake_when_due()
        assert c.part._timer is None


async def test_rules_not_ours_are_left_alone_and_a_new_leader_reconciles_ours() -> None:
    fake = FakeApi()
    async with cluster(fake) as c:
        foreign = {
            "admins-node-02": rule_body("admins-node-02", ours=False),  # no managed-by label
            "other-driver": rule_body("other-driver", driver="other.example.com", pool="node-01"),
            "other-key": rule_body("other-key"),
        }
        foreign["other-key"]["spec"]["taint"]["key"] = "gpu.example.com/xid"
        left = rule_body("gpu.example.com-node-01-agent-gone", driver=DRIVER, pool="node-01")
        stale_node = rule_body("gpu.example.com-node-09-agent-gone", driver=DRIVER, pool="node-09")
        for body in (*foreign.values(), left, stale_node):
            fake.objects[f"{RULES}/{body['metadata']['name']}"] = body
        c.watch_rules()
        await c.pass_()  # a leader that took over: node-01's agent is back, node-09 is gone
        assert sorted(fake.writes()) == [
            ("DELETE", f"{RULES}/gpu.example.com-node-01-agent-gone"),
            ("DELETE", f"{RULES}/gpu.example.com-node-09-agent-gone"),
        ]
        assert sorted(n.rpartition("/")[2] for n in fake.objects) == sorted(foreign)


async def test_a_rule_whose_name_is_taken_is_not_written_twice() -> None:
    fake = FakeApi()
    async with cluster(fake, grace=0) as c:
        fake.objects[f"{RULES}/gpu.example.com-node-02-agent-gone"] = rule_body(
            "gpu.example.com-node-02-agent-gone", ours=False
        )
        c.agent_gone("node-02")
        await c.pass_()  # 409: someone's rule of that name; never deleted, never replaced
        await c.pass_()
        assert fake.writes() == [("POST", RULES), ("POST", RULES)]
        assert (
            "labels" not in fake.objects[f"{RULES}/gpu.example.com-node-02-agent-gone"]["metadata"]
        )


async def test_without_devicetaintrules_the_node_gets_one_event_each_way() -> None:
    fake = FakeApi(served=False)
    async with cluster(fake, grace=0) as c:
        c.agent_gone("node-02")
        await c.pass_()
        await c.pass_()
        events = [b for m, p, b in fake.requests if m == "POST"]
        assert [(e["reason"], e["type"], e["regarding"]["name"]) for e in events] == [
            ("DriverGone", "Warning", "node-02")
        ]
        assert events[0]["note"].startswith(
            "the agent of gpu.example.com on node-02 has not been ready since"
        )
        assert metrics.NODES_DRIVER_GONE._value.get() == 1
        c.agent("node-02")
        await c.pass_()
        events = [b for m, p, b in fake.requests if m == "POST"]
        assert [(e["reason"], e["type"]) for e in events][1:] == [("DriverBack", "Normal")]
        assert not [p for m, p, _ in fake.requests if p.startswith(RULES)]


async def test_a_node_that_is_gone_or_without_our_pool_is_not_tainted() -> None:
    fake = FakeApi()
    async with cluster(fake, grace=0) as c:
        c.view.apply("Node", "ADDED", {"metadata": {"name": "cpu-01", "uid": "u"}})
        c.view.apply("Node", "DELETED", {"metadata": {"name": "node-01", "uid": "uid-node-01"}})
        c.agent_gone("node-01")
        await c.pass_()
        assert fake.writes() == []


def test_rule_names_are_dns_subdomains() -> None:
    assert absences.rule_name(DRIVER, "node-02") == "gpu.example.com-node-02-agent-gone"
    long = absences.rule_name(DRIVER, "n" * 250)
    assert len(long) <= 253
    assert long != absences.rule_name(DRIVER, "n" * 249)
    odd = absences.rule_name(DRIVER, "Node_02")
    assert names.is_dns_subdomain(odd)
    assert odd.startswith("gpu.example.com-node-02-agent-gone-")


def test_a_pod_pinned_to_a_tainted_node_is_told_the_taint_beside_the_exclusions() -> None:
    view = ClusterView(pods_without_claims=False)
    for node in ("node-01", "node-02"):
        view.apply("ResourceSlice", "ADDED", gpu_slice(node, {"gpu-0": "24Gi"}))
    view.apply("DeviceTaintRule", "ADDED", rule_body("r", driver=DRIVER, pool="node-02"))
    pod = pending_pod()
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-02"}
    nodes = {n: ready_node(n) for n in ("node-01", "node-02")}
    result = explain_tutorial(slices=[dict(s) for s in view.tainted_slices()], nodes=nodes, pod=pod)
    node_piece = next(p for p in result.pieces if p.name == "node")
    assert node_piece.reason == (
        "request gpu: node-02/gpu-0 is tainted gpu.example.com/agent-gone:NoSchedule "
        "(DeviceTaintRule r); node-01/gpu-0: node node-01 does not match the pod's "
        "nodeSelector kubernetes.io/hostname=node-02"
    )

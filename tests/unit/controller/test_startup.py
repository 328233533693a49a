"""The controller's start: its own lists make the view complete before Kopf has handed it over,
and the leader explains nothing before they are done.

The view's rules for what the controller reads itself (``ClusterView.offer``) are pure and
tested with bodies alone: a version read stands until Kopf tells one at least as new, and
never brings back what Kopf said was deleted. The start-up's reads (``startup.StartUp``) run
against a scripted API server (``tests.support.api_servers``): each list only after Kopf's
first object of its kind, an empty kind after a probe, a 410 listed again, a failure after a
back-off (``FakeTime``: recorded, never slept), a refusal left to Kopf; a template claim's pod
read by name while Kopf still lists the Pods. Last, a leader on such a server: one Event per
waiting claim and pod, after the lists, and none when Kopf's listing catches up.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller import owners, startup
from dra_gpu.controller.main import Controller
from dra_gpu.controller.view import ClusterView
from tests.support.api_servers import (
    FakeTime,
    Reply,
    Request,
    Routed,
    gone,
    internal_error,
    listing,
    ok,
    scripted_api,
    status,
)

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
Body = dict[str, Any]


# --- bodies ------------------------------------------------------------------------------------


def gpu_class(name: str = "g", rv: str = "1") -> Body:
    expression = f'device.driver == "{DRIVER}"'
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def ready_node(name: str = "node-01", rv: str = "1") -> Body:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"kubernetes.io/hostname": name},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def gpu_slice(node: str = "node-01", count: int = 4, rv: str = "1") -> Body:
    return {
        "metadata": {"name": f"{node}-{DRIVER}", "uid": f"uid-slice-{node}", "resourceVersion": rv},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}}
                for i in range(count)
            ],
        },
    }


def claim(name: str, rv: str = "1", *, count: int = 1, owner: str | None = None) -> Body:
    body: Body = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "g", "count": count}}]
            }
        },
        "status": {},
    }
    if owner is not None:
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid"},
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner,
                "uid": f"uid-{owner}",
                "controller": True,
                "blockOwnerDeletion": True,
            },
        ]
    return body


def allocated(name: str, device: str, rv: str = "2") -> Body:
    body = claim(name, rv)
    results = [{"request": "gpu", "driver": DRIVER, "pool": "node-01", "device": device}]
    body["status"] = {"allocation": {"devices": {"results": results}}}
    return body


def waiting_pod(name: str, claim_name: str | None, rv: str = "1") -> Body:
    """A pod that waits, naming ``claim_name`` in its spec (a claim referenced by name), or,
    without one, made from a template (the status names the claim once it is written)."""
    ref: Body = {"name": "gpu"}
    if claim_name is None:
        ref["resourceClaimTemplateName"] = "t"
    else:
        ref["resourceClaimName"] = claim_name
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"resourceClaims": [ref]},
        "status": {"phase": "Pending"},
    }


def named(pod: Body, claim_name: str, rv: str) -> Body:
    """``pod`` once the resourceclaim controller wrote which claim it made for it."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["resourceVersion"] = rv
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return pod


# --- the view: what a read of the controller's own may change ----------------------------------


def test_a_version_read_stands_until_kopf_tells_one_as_new() -> None:
    view = ClusterView(pods_without_claims=False)
    view.begin_reads()
    assert view.apply("ResourceClaim", None, claim("c", "5"))  # Kopf's listing, made first
    assert view.offer("ResourceClaim", allocated("c", "gpu-0", "7"))  # read since: newer
    assert view.is_pending("ns/c") is False
    # Kopf's listing goes on and hands over what it listed before the read: not taken.
    assert not view.apply("ResourceClaim", None, claim("c", "5"))
    assert view.claims["ns/c"]["status"]["allocation"]
    assert not view.apply("ResourceClaim", "MODIFIED", claim("c", "6"))  # still older
    assert not view.apply("ResourceClaim", "MODIFIED", allocated("c", "gpu-0", "7"))  # the same
    assert view.apply("ResourceClaim", "MODIFIED", allocated("c", "gpu-1", "9"))  # newer
    assert view.claims["ns/c"]["status"]["allocation"]["devices"]["results"][0]["device"] == (
        "gpu-1"
    )
    # A read never replaces Kopf's word with an older or equal version.
    assert not view.offer("ResourceClaim", allocated("c", "gpu-0", "8"))
    assert not view.offer("ResourceClaim", allocated("c", "gpu-1", "9"))
    # The reads end while Kopf still lists claims: what was read stands all the same.
    assert view.offer("ResourceClaim", allocated("d", "gpu-2", "12"))
    view.end_reads()
    assert not view.apply("ResourceClaim", None, claim("d", "10"))
    assert view.claims["ns/d"]["status"]["allocation"]
    assert not view.apply("ResourceClaim", "MODIFIED", allocated("d", "gpu-2", "12"))  # caught up
    assert view.apply("ResourceClaim", "MODIFIED", claim("d", "11"))  # Kopf's order again


def test_a_read_does_not_bring_back_what_kopf_said_was_deleted() -> None:
    view = ClusterView()
    view.begin_reads()
    view.apply("ResourceSlice", None, gpu_slice(rv="3"))
    view.apply("ResourceSlice", "DELETED", gpu_slice(rv="8"))  # the deletion's version
    assert not view.offer("ResourceSlice", gpu_slice(rv="3"))  # a list made before it
    assert "node-01-gpu.example.com" not in view.slices
    assert view.offer("ResourceSlice", gpu_slice(rv="9"))  # created again since
    # A deletion of the object before (an older version) leaves the one read in place.
    assert not view.apply("ResourceSlice", "DELETED", gpu_slice(rv="8"))
    assert "node-01-gpu.example.com" in view.slices


def test_objects_without_a_version_are_kopfs_and_the_reads_end() -> None:
    view = ClusterView()
    view.begin_reads()
    unversioned = claim("u")
    del unversioned["metadata"]["resourceVersion"]
    assert view.offer("ResourceClaim", unversioned)  # nothing there: taken
    assert not view.offer("ResourceClaim", allocated("u", "gpu-0"))  # not comparable: Kopf's
    view.end_reads()
    # Kopf's stream alone again: its order is the truth, whatever the versions say.
    assert view.apply("ResourceClaim", "MODIFIED", claim("v", "5"))
    assert view.apply("ResourceClaim", "MODIFIED", allocated("v", "gpu-0", "3"))
    with pytest.raises(RuntimeError):
        view.offer("ResourceClaim", claim("w"))


def test_a_claim_keeps_its_controller_pod_and_a_pod_read_links_it() -> None:
    view = ClusterView(pods_without_claims=False)
    view.begin_reads()
    view.apply("ResourceClaim", None, claim("c", owner="p"))
    assert view.claims["ns/c"]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}
    ]
    assert owners.unseen(view, "ns/c") == owners.PodRef("ns", "p", "uid-p")
    pod = waiting_pod("p", None, rv="4")
    assert not view.offer("Pod", pod)  # made from a template, the claim not named yet: no use
    assert owners.unseen(view, "ns/c") is not None
    assert view.offer("Pod", named(pod, "c", "5"))
    assert view.pod_keys_of("ns/c") == ["ns/p"]
    assert owners.unseen(view, "ns/c") is None
    assert not view.apply("Pod", None, pod)  # Kopf's older listing does not unlink it
    assert view.pod_keys_of("ns/c") == ["ns/p"]


def test_only_a_controller_pod_owner_is_a_claims_pod() -> None:
    assert owners.owner_pod(claim("c", owner="p")) == owners.PodRef("ns", "p", "uid-p")
    assert owners.owner_pod(claim("c")) is None  # referenced by name: no owner
    not_controller = claim("c", owner="p")
    not_controller["metadata"]["ownerReferences"][1]["controller"] = False
    assert owners.owner_pod(not_controller) is None
    view = ClusterView()
    view.apply("ResourceClaim", "ADDED", allocated("a", "gpu-0"))
    assert owners.unseen(view, "ns/a") is None  # allocated: nothing to explain
    assert owners.unseen(view, "ns/missing") is None


# --- the start-up's reads ------------------------------------------------------------------


class FakeCluster:
    """The scripted API server's objects by list path, in pages of what the request asks
    (``limit``); ``fail``: for a path, replies sent before its real answers (one a request)."""

    PATHS: ClassVar[dict[str, str]] = {
        "DeviceClass": f"{RESOURCE}/deviceclasses",
        "ResourceSlice": f"{RESOURCE}/resourceslices",
        "ResourceClaim": f"{RESOURCE}/resourceclaims",
        "Node": "/api/v1/nodes",
        "Pod": "/api/v1/pods",
    }

    def __init__(self) -> None:
        self.objects: dict[str, list[Body]] = {kind: [] for kind in self.PATHS}
        self.pods: dict[str, Body] = {}
        """Every pod by ``ns/name`` (bound or not): read by name."""
        self.fail: dict[str, list[Reply]] = {}
        self.events: list[Body] = []
        routes: dict[tuple[str, str], Callable[[Request], Reply]] = {
            ("GET", path): self._lister(kind) for kind, path in self.PATHS.items()
        }
        routes["GET", "/api/v1/namespaces/ns/pods"] = self._pod_by_name
        routes["GET", "/api/v1/events"] = lambda request: listing([], "1")
        routes["POST", "/apis/events.k8s.io/v1/namespaces/ns/events"] = self._event
        self.api = Routed(routes)

    def listed(self, kind: str) -> list[Request]:
        return self.api.of("GET", self.PATHS[kind])

    def _lister(self, kind: str) -> Callable[[Request], Reply]:
        def reply(request: Request) -> Reply:
            failing = self.fail.get(request.path)
            if failing:
                return failing.pop(0)
            items = self.objects[kind]
            if kind == "Pod":
                assert request.query["fieldSelector"] == "spec.nodeName="
                items = [p for p in items if not p["spec"].get("nodeName")]
            start = int(request.query.get("continue") or 0)
            size = int(request.query.get("limit") or len(items) or 1)
            rest = start + size
            return listing(items[start:rest], "100", str(rest) if rest < len(items) else "")

        return reply

    def _pod_by_name(self, request: Request) -> Reply:
        name = request.query["fieldSelector"].removeprefix("metadata.name=")
        pod = self.pods.get(f"ns/{name}")
        return listing([pod] if pod is not None else [], "100")

    def _event(self, request: Request) -> Reply:
        self.events.append(request.body)
        return ok(request.body)


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup, "PAGE_SIZE", 2)


async def until(condition: Callable[[], bool], rounds: int = 2_000) -> None:
    """Loop iterations until ``condition`` holds (a scripted server answers in a few)."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_each_list_waits_for_kopfs_first_object_of_its_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(startup, "FIRST_WAIT", 60.0)
    fake = FakeCluster()
    fake.objects["DeviceClass"] = [gpu_class()]
    fake.objects["ResourceSlice"] = [gpu_slice(f"node-0{n}") for n in range(1, 4)]
    fake.objects["ResourceClaim"] = [claim("c")]
    fake.objects["Node"] = [ready_node()]
    fake.objects["Pod"] = [waiting_pod("p", "c")]
    view = ClusterView(pods_without_claims=False)
    changed: list[int] = []
    async with scripted_api(fake.api) as api:
        start = startup.StartUp(api, view, lambda: changed.append(1))
        task = asyncio.create_task(start.run(None))
        start.heard("ResourceSlice", None)
        await until(lambda: "ResourceSlice" in start.phases)
        assert [r.path for r in fake.api.requests] == [fake.PATHS["ResourceSlice"]] * 2  # 2 pages
        assert len(view.slices) == 3
        assert not start.complete
        for kind in ("DeviceClass", "ResourceClaim", "Node", "Pod"):
            start.heard(kind, None)
        await until(lambda: start.complete)
        assert set(view.classes) == {"g"}
        assert set(view.claims) == {"ns/c"}
        assert view.pod_keys_of("ns/c") == ["ns/p"]
        assert start.offered == 7
        assert changed
        assert not task.done()  # the template claims' pods are read until Kopf's Pod listing
        start.heard("Pod", "ADDED")  # a watch event: Kopf's listing is over
        await asyncio.wait_for(task, 5)
    assert set(start.phases) >= {"complete", "pods read", "Kopf's pods", "Pod"}
    with pytest.raises(RuntimeError):
        view.offer("Pod", waiting_pod("q", "c"))  # the reads are over


async def test_a_kind_kopf_said_nothing_of_is_probed_and_waits_for_kopf_if_it_has_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(startup, "FIRST_WAIT", 0.0)
    fake = FakeCluster()
    fake.objects["ResourceClaim"] = [claim("c")]  # the only kind with objects
    view = ClusterView(pods_without_claims=False)
    async with scripted_api(fake.api) as api:
        start = startup.StartUp(api, view, lambda: None)
        task = asyncio.create_task(start.run(None))
        await until(lambda: len(start.phases) == 4)  # the empty kinds: one probe each
        for kind in ("DeviceClass", "ResourceSlice", "Node", "Pod"):
            assert [r.query for r in fake.listed(kind)] == [
                {"limit": "1", **({"fieldSelector": "spec.nodeName="} if kind == "Pod" else {})}
            ]
        assert not start.complete
        assert view.claims == {}
        start.heard("ResourceClaim", None)
        await until(lambda: start.complete)
        assert set(view.claims) == {"ns/c"}
        assert len(fake.listed("ResourceClaim")) == 2  # the probe, then the list
        await stop(task)


async def test_a_list_expired_starts_again_a_failure_backs_off_and_a_refusal_is_left_to_kopf() -> (
    None
):
    time = FakeTime()
    fake = FakeCluster()
    fake.objects["ResourceClaim"] = [claim(f"c{n}") for n in range(5)]
    refused = Reply(403, status(403, "Forbidden", 'nodes is forbidden: User "x" cannot list'))
    fake.fail = {
        fake.PATHS["ResourceClaim"]: [internal_error(), internal_error(), gone()],
        fake.PATHS["Node"]: [refused],
    }
    view = ClusterView(pods_without_claims=False)
    async with scripted_api(fake.api, timing=time.timing) as api:
        start = startup.StartUp(api, view, lambda: None, timing=time.timing)
        for kind in fake.PATHS:
            start.heard(kind, None)
        task = asyncio.create_task(start.run(None))
        await until(lambda: start.complete)
        await stop(task)
    assert set(view.claims) == {f"ns/c{n}" for n in range(5)}
    # Two failures: back-offs that grow, jittered (LIST_BACKOFF: 1 s, then 2 s, x 1.5 here);
    # the 410: a wait of the next one, then the list from its start.
    assert time.slept[:3] == [1.5, 3.0, 6.0]
    assert len(fake.listed("Node")) == 1  # refused once: not asked again
    assert "Node" in start.phases


async def test_a_template_claims_pod_is_read_by_name_until_it_names_the_claim() -> None:
    time = FakeTime()
    fake = FakeCluster()
    view = ClusterView(pods_without_claims=False)
    async with scripted_api(fake.api, timing=time.timing) as api:
        start = startup.StartUp(api, view, lambda: None, timing=time.timing)
        for kind in fake.PATHS:
            start.heard(kind, None)
        task = asyncio.create_task(start.run(None))
        await until(lambda: start.complete)
        # While Kopf lists the Pods, a pod made from a template and its claim are created.
        pod = waiting_pod("p", None, rv="10")
        fake.pods["ns/p"] = pod
        view.apply("ResourceClaim", "ADDED", claim("c", "11", owner="p"))
        start.note(["ns/c"])
        await until(lambda: len(fake.api.of("GET", "/api/v1/namespaces/ns/pods")) == 2)
        assert view.pod_keys_of("ns/c") == []  # read, but it does not name the claim yet
        fake.pods["ns/p"] = named(pod, "c", "12")
        await until(lambda: view.pod_keys_of("ns/c") == ["ns/p"])
        reads = len(fake.api.of("GET", "/api/v1/namespaces/ns/pods"))
        assert time.slept[:2] == [0.375, 0.75]  # READ_BACKOFF between the reads
        start.note(["ns/c"])  # the view has it now: not read again
        # A claim referenced by name has no owner: nothing to read by name.
        view.apply("ResourceClaim", "ADDED", claim("d", "13"))
        start.note(["ns/d"])
        start.heard("Pod", "MODIFIED")  # Kopf's Pod listing is over: the reads end
        await asyncio.wait_for(task, 5)
    assert len(fake.api.of("GET", "/api/v1/namespaces/ns/pods")) == reads
    query = fake.api.of("GET", "/api/v1/namespaces/ns/pods")[0].query
    assert query == {"fieldSelector": "metadata.name=p"}


# --- the leader waits for the lists ----------------------------------------------------------


def settled(controller: Controller) -> bool:
    return controller.settled


async def test_a_starting_leader_explains_once_after_its_lists_and_not_again_as_kopf_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(startup, "FIRST_WAIT", 60.0)
    fake = FakeCluster()
    slices = [gpu_slice("node-01"), gpu_slice("node-02")]
    fake.objects.update(
        DeviceClass=[gpu_class()],
        ResourceSlice=slices,
        ResourceClaim=[claim("big", count=8)],  # 8 on one node of 4: never
        Node=[ready_node("node-01"), ready_node("node-02")],
        Pod=[waiting_pod("p", "big")],
    )
    async with scripted_api(fake.api) as api:
        controller = Controller(ControllerSettings(identity="a", driver_name=DRIVER), api)
        controller.leader.is_leader = True
        start = asyncio.create_task(controller.start_up())

        async def kopf_hands_over(kind: str, body: Body, event_type: str | None = None) -> None:
            controller.startup.heard(kind, event_type)
            controller.view.apply(kind, event_type, copy.deepcopy(body))

        async def step() -> list[str]:
            before = len(fake.events)
            await controller.reconcile_once()
            await controller.explainer.post_due()
            return [e["reason"] for e in fake.events[before:]]

        # Kopf has handed over the class and the claim, not yet the slices or the pod: an
        # explanation now would say "no device" and be told again in a moment.
        await kopf_hands_over("DeviceClass", gpu_class())
        await kopf_hands_over("ResourceClaim", claim("big", count=8))
        await kopf_hands_over("Node", ready_node("node-01"))
        assert await step() == []
        assert not settled(controller)
        await kopf_hands_over("ResourceSlice", slices[0])
        await kopf_hands_over("Pod", waiting_pod("other", None))  # any Pod: Kopf has begun
        await until(lambda: controller.startup.complete)
        assert await step() == ["NotEnoughDevices", "NotEnoughDevices"]  # the claim, its pod
        assert settled(controller)
        # Kopf's listing catches up, then its first watch event: nothing new to tell.
        await kopf_hands_over("ResourceSlice", slices[1])
        await kopf_hands_over("Node", ready_node("node-02"))
        await kopf_hands_over("Pod", waiting_pod("p", "big"))
        await kopf_hands_over("Pod", waiting_pod("other", None), "MODIFIED")
        assert await step() == []
        await asyncio.wait_for(start, 5)
    assert [e["regarding"]["kind"] for e in fake.events] == ["ResourceClaim", "Pod"]
    assert len(fake.api.of("GET", "/api/v1/events")) == 1  # one list of the last Events
    assert isinstance(api, kube.Kube)

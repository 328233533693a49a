"""The controller's incremental view equals a full recompute, after any sequence of changes.

Random creates, updates and deletes of slices, classes, claims, pods and nodes go through the
view as watch events would; after each batch the controller's parts take the batch's changes
(``Tally.update``, ``Explainer.note``, ``Explainer.refresh``) and what they hold — every gauge's
count, every pending claim's explanation — is compared with what the pure functions compute
from all the objects at once (``published.current_pools``, ``per_node``, ``explain_claim``).

Slices may carry counter sets and devices that consume them or are shared (with a memory
request policy); claims may hold shares with consumed capacity and ask for capacity. What is
free, the counter and shared-memory series are compared with a plain count written here
(``reference_free``, ``reference_series``), not with ``partitions`` itself.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from dra_gpu import cel
from dra_gpu.controller import claimed, explain, meanings, partitions, published
from dra_gpu.controller.explainer import Explainer
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.tallies import Tally
from dra_gpu.controller.view import ClusterView
from dra_gpu.resource.quantities import exact_value
from dra_gpu.serving import metrics

DRIVER = "gpu.example.com"
OTHER = "nic.example.com"
NODES = ["node-0", "node-1", "node-2", "node-3"]
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
Body = dict[str, Any]

POLICY = {"default": "8Gi", "validRange": {"min": "4Gi", "max": "24Gi", "step": "4Gi"}}
SELECTORS = [
    f'device.driver == "{DRIVER}"',
    f'device.driver == "{OTHER}"',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("24Gi")) >= 0',
    f'device.attributes["{DRIVER}"].product == "A"',
    f'device.attributes["{DRIVER}"].nope == 1',  # an error on every device
    "device.(",  # does not compile
    f'"product" in device.attributes["{DRIVER}"]',  # not cacheable by keys
]

# --- random objects --------------------------------------------------------------------------

names = st.sampled_from


@st.composite
def nodes(draw: st.DrawFn) -> Body:
    spec: Body = {}
    if draw(st.booleans()):
        spec["unschedulable"] = True
    if draw(st.booleans()):
        spec["taints"] = [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    return {
        "metadata": {"name": draw(names(NODES)), "labels": {"zone": draw(names(["a", "b"]))}},
        "spec": spec,
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": draw(names(["True", "False"])),
                    "hb": draw(st.integers(0, 3)),
                }
            ]
        },
    }


@st.composite
def slices(draw: st.DrawFn) -> Body:
    driver = draw(names([DRIVER, DRIVER, OTHER]))
    node = draw(names([*NODES, None]))
    devices = []
    for name in draw(st.lists(names(["gpu-0", "gpu-1", "gpu-2"]), max_size=3, unique=True)):
        device: Body = {"name": name}
        memory = draw(names(["8Gi", "24Gi", "80Gi", None, "bad"]))
        if memory is not None:
            device["capacity"] = {"memory": {"value": memory}}
        product = draw(names(["A", "B", None]))
        if product is not None:
            device["attributes"] = {"product": {"string": product}}
        effect = draw(names([None, None, "NoSchedule", "NoExecute", "None"]))
        if effect is not None:
            device["taints"] = [{"key": f"{DRIVER}/xid", "value": "79", "effect": effect}]
        if draw(st.integers(0, 2)) == 0:
            used = draw(st.lists(names(["slot-0", "slot-1", "compute"]), min_size=1, unique=True))
            device["consumesCounters"] = [
                {
                    "counterSet": "cs-0",
                    "counters": {c: {"value": "2" if c == "compute" else "1"} for c in used},
                }
            ]
        if draw(st.integers(0, 3)) == 0:
            device["allowMultipleAllocations"] = True
            device["capacity"] = {
                "memory": {
                    "value": draw(names(["24Gi", "40Gi"])),
                    **draw(names([{}, {"requestPolicy": POLICY}])),
                }
            }
        devices.append(device)
    spec: Body = {
        "driver": driver,
        "pool": {
            "name": draw(names(["pool-a", "pool-b", node or "pool-c"])),
            "generation": draw(st.integers(1, 2)),
            "resourceSliceCount": draw(st.integers(1, 2)),
        },
        "devices": devices,
    }
    if draw(st.integers(0, 2)) == 0:
        compute = draw(names(["2", "3"]))
        spec["sharedCounters"] = [
            {
                "name": "cs-0",
                "counters": {
                    "slot-0": {"value": "1"},
                    "slot-1": {"value": "1"},
                    "compute": {"value": compute},
                },
            }
        ]
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {
        "metadata": {
            "name": draw(names(["s-0", "s-1", "s-2", "s-3", "s-4"])),
            "uid": "u",
            "labels": {"app.kubernetes.io/managed-by": "dra-gpu"},
        },
        "spec": spec,
    }


@st.composite
def classes(draw: st.DrawFn) -> Body:
    chosen = draw(st.lists(names(SELECTORS), max_size=2))
    return {
        "metadata": {"name": draw(names(["c-0", "c-1", "c-2"]))},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in chosen]},
    }


def two_exact_requests(draw: st.DrawFn) -> list[Body]:
    return [draw(exact_requests()) for _ in range(2)]


@st.composite
def exact_requests(draw: st.DrawFn) -> Body:
    request: Body = {"deviceClassName": draw(names(["c-0", "c-1", "c-2", "c-missing"]))}
    if draw(st.booleans()):
        request["count"] = draw(st.integers(1, 3))
    if draw(st.integers(0, 5)) == 0:
        request["allocationMode"] = "All"
    if draw(st.booleans()):
        request["selectors"] = [{"cel": {"expression": draw(names(SELECTORS[2:]))}}]
    if draw(st.integers(0, 3)) == 0:
        asked = draw(names(["4Gi", "10Gi", "24Gi", "100Gi"]))
        request["capacity"] = {"requests": {draw(names(["memory", "memory", "cores"])): asked}}
    return request


@st.composite
def claims(draw: st.DrawFn) -> Body:
    requests: list[Body] = []
    for i in range(draw(st.integers(0, 2))):
        if draw(st.integers(0, 3)) == 0:
            subs = [{"name": f"s{j}", **sub} for j, sub in enumerate(two_exact_requests(draw))]
            requests.append({"name": f"r{i}", "firstAvailable": subs})
        else:
            exact: Body = draw(exact_requests())
            requests.append({"name": f"r{i}", "exactly": exact})
    name = draw(names(["k-0", "k-1", "k-2"]))
    body: Body = {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}-{draw(st.integers(0, 1))}",
            "resourceVersion": str(draw(st.integers(1, 9))),
        },
        "spec": {"devices": {"requests": requests}},
        "status": {},
    }
    if draw(st.integers(0, 7)) == 0:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if draw(st.integers(0, 2)) == 0:
        results = [
            {
                "request": "r0",
                "driver": draw(names([DRIVER, OTHER])),
                "pool": draw(names(["pool-a", "pool-p", "pool-p", *NODES])),
                "device": draw(names(["gpu-0", "gpu-1", "gpu-2"])),
                **({"adminAccess": True} if draw(st.integers(0, 4)) == 0 else {}),
                **(
                    {
                        "shareID": f"share-{draw(st.integers(0, 9))}",
                        "consumedCapacity": {"memory": draw(names(["8Gi", "16Gi"]))},
                    }
                    if draw(st.integers(0, 2)) == 0
                    else {}
                ),
            }
            for _ in range(draw(st.integers(1, 2)))
        ]
        body["status"]["allocation"] = {"devices": {"results": results}}
        if draw(st.booleans()):
            body["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "x"}]
    if draw(st.booleans()):
        body["status"]["devices"] = [
            {"driver": DRIVER, "pool": "pool-a", "device": "gpu-0", "data": {}}
        ]
    return body


@st.composite
def pods(draw: st.DrawFn) -> Body:
    claim = draw(names(["k-0", "k-1", "k-2"]))
    spec: Body = {"containers": [{"name": "c"}]}
    status: Body = {"phase": draw(names(["Pending", "Running"]))}
    if draw(st.integers(0, 3)):
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    else:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
        if draw(st.booleans()):
            status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    if draw(st.integers(0, 4)) == 0:
        spec["nodeName"] = draw(names(NODES))
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    if draw(st.booleans()):
        spec["nodeSelector"] = {"zone": draw(names(["a", "b"]))}
    if draw(st.integers(0, 7)) == 0:
        spec.pop("resourceClaims")  # a pod that uses no claim
    return {
        "metadata": {
            "namespace": "ns",
            "name": draw(names(["p-0", "p-1", "p-2"])),
            "uid": f"pod-{draw(st.integers(0, 1))}",
            "creationTimestamp": "2025-12-31T23:59:00Z",
        },
        "spec": spec,
        "status": status,
    }


KINDS = {
    "Node": nodes(),
    "ResourceSlice": slices(),
    "DeviceClass": classes(),
    "ResourceClaim": claims(),
    "Pod": pods(),
}


@st.composite
def events(draw: st.DrawFn) -> tuple[str, str | None, Body]:
    kind = draw(
        names(
            ["Node", "ResourceSlice", "ResourceSlice", "DeviceClass", *["ResourceClaim", "Pod"] * 3]
        )
    )
    body = draw(KINDS[kind])
    return kind, draw(names(["ADDED", "MODIFIED", "DELETED", None])), body


def base() -> list[tuple[str, str | None, Body]]:
    """A cluster to start from: four Ready nodes with a pool each, two classes."""
    found: list[tuple[str, str | None, Body]] = []
    for i, node in enumerate(NODES):
        found.append(
            (
                "Node",
                "ADDED",
                {
                    "metadata": {"name": node, "labels": {"zone": "ab"[i % 2]}},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                },
            )
        )
        found.append(
            (
                "ResourceSlice",
                "ADDED",
                {
                    "metadata": {"name": f"base-{node}"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [
                            {
                                "name": f"gpu-{d}",
                                "capacity": {"memory": {"value": m}},
                                "attributes": {"product": {"string": p}},
                            }
                            for d, (m, p) in enumerate([("24Gi", "A"), ("8Gi", "B"), ("80Gi", "A")])
                        ],
                    },
                },
            )
        )
    for name, expression in (("c-0", SELECTORS[0]), ("c-1", SELECTORS[3])):
        found.append(
            (
                "DeviceClass",
                "ADDED",
                {
                    "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": expression}}]},
                },
            )
        )
    return found


def partitioned_pool() -> list[tuple[str, str | None, Body]]:
    """pool-p on node-0, as a partitioned GPU publishes it: a counter set in a slice of its own;
    gpu-0 consumes all of it (the whole GPU), gpu-1 and gpu-2 half each, gpu-2 is shared too."""
    counters = {"slot-0": {"value": "1"}, "slot-1": {"value": "1"}, "compute": {"value": "2"}}

    def consumes(*names: str) -> list[Body]:
        return [
            {
                "counterSet": "cs-0",
                "counters": {
                    n: {"value": "2" if n == "compute" and len(names) > 2 else "1"} for n in names
                },
            }
        ]

    devices = [
        {"name": "gpu-0", "capacity": {"memory": {"value": "40Gi"}},
         "consumesCounters": consumes("slot-0", "slot-1", "compute")},
        {"name": "gpu-1", "capacity": {"memory": {"value": "20Gi"}},
         "consumesCounters": consumes("slot-0", "compute")},
        {"name": "gpu-2", "allowMultipleAllocations": True,
         "capacity": {"memory": {"value": "20Gi", "requestPolicy": POLICY}},
         "consumesCounters": consumes("slot-1", "compute")},
    ]  # fmt: skip
    pool = {"name": "pool-p", "generation": 1, "resourceSliceCount": 2}
    contents: list[Body] = [
        {"sharedCounters": [{"name": "cs-0", "counters": counters}]},
        {"devices": devices},
    ]
    return [
        (
            "ResourceSlice",
            "ADDED",
            {
                "metadata": {"name": f"part-{i}"},
                "spec": {"driver": DRIVER, "nodeName": "node-0", "pool": pool, **content},
            },
        )
        for i, content in enumerate(contents)
    ]


def note(text: str) -> None:
    """A statistic of the property tests (``--hypothesis-show-statistics``); nothing elsewhere."""
    with contextlib.suppress(InvalidArgument):
        hypothesis.event(text)


# --- the full recompute ---------------------------------------------------------------------


def key_of(body: Body) -> str:
    meta = body["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def admits(device_class: Body, device: published.PublishedDevice) -> bool:
    for selector in device_class.get("spec", {}).get("selectors") or []:
        compiled = cel.compile_selector(selector["cel"]["expression"])
        if compiled.error or not cel.evaluate(compiled, device.driver, device.body).matched:
            return False
    return True


def concerns_us(claim: Body, classes: dict[str, Body]) -> bool:
    for request in claim["spec"]["devices"]["requests"]:
        choices = [request["exactly"]] if "exactly" in request else request["firstAvailable"]
        for choice in choices:
            device_class = classes.get(choice["deviceClassName"])
            drivers: set[str] = set()
            for s in (device_class or {}).get("spec", {}).get("selectors") or []:
                drivers |= set(
                    re.findall(r'device\.driver\s*==\s*"([^"]+)"', s["cel"]["expression"])
                )
            if not drivers or DRIVER in drivers:
                return True
    return False


def waiting_pods(claim: Body, pods: dict[str, Body]) -> list[Body]:
    found = []
    for _, pod in sorted(pods.items()):
        used = {r.get("resourceClaimName") for r in pod["spec"].get("resourceClaims") or []}
        used |= {
            s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
        }
        if claim["metadata"]["name"] in used and not pod["spec"].get("nodeName"):
            found.append(pod)
    return found


def without_devices(explanation: explain.Explanation) -> explain.Explanation:
    def strip(r: explain.RequestExplanation) -> explain.RequestExplanation:
        subs = tuple(strip(s) for s in r.subrequests)
        return dataclasses.replace(r, devices=(), subrequests=subs)

    return dataclasses.replace(explanation, requests=tuple(strip(r) for r in explanation.requests))


def reference_holds(claims: Iterable[Body]) -> list[tuple[published.DeviceKey, Body]]:
    """Every result that holds a device (admin access holds none), with its claim's key."""
    return [
        (published.result_key(r), r)
        for claim in claims
        for r in ((claim.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
        if not r.get("adminAccess")
    ]


def reference_used(pool: published.Pool, claims: Iterable[Body]) -> dict[tuple[str, str], Fraction]:
    """(counter set, counter) -> consumed by the pool's held devices, each counted once (as
    the scheduler, by name: two devices of one name in a pool are both held)."""
    held = {key[2] for key, _ in reference_holds(claims) if key[:2] == pool.key}
    used: dict[tuple[str, str], Fraction] = collections.defaultdict(Fraction)
    for device in pool.devices:
        if device.name not in held:
            continue
        for entry in device.body.get("consumesCounters") or []:
            for counter, value in entry["counters"].items():
                used[entry["counterSet"], counter] += exact_value(value["value"])
    return used


def reference_consumed(key: published.DeviceKey, claims: Iterable[Body]) -> Fraction:
    return sum(
        (
            exact_value(r["consumedCapacity"]["memory"])
            for k, r in reference_holds(claims)
            if k == key and r.get("shareID")
        ),
        Fraction(0),
    )


def reference_free(
    device: published.PublishedDevice,
    pools: dict[tuple[str, str], published.Pool],
    claims: Iterable[Body],
) -> bool:
    """Whether a new claim could get ``device``: the rule of docs/controller.md, counted plainly."""
    claims = list(claims)
    results = [r for k, r in reference_holds(claims) if k == device.key]
    if any(not r.get("shareID") for r in results):
        return False
    if results and not device.shared:
        return False
    pool = pools[device.driver, device.pool]
    if device.body.get("consumesCounters") and not (device.shared and results):
        used = reference_used(pool, claims)
        for entry in device.body["consumesCounters"]:
            defined = pool.counter_sets.get(entry["counterSet"])
            for counter, value in entry["counters"].items():
                if defined is None or counter not in defined.counters:
                    continue
                left = defined.counters[counter] - used[entry["counterSet"], counter]
                if left < exact_value(value["value"]):
                    return False
    if device.shared:
        memory = (device.body.get("capacity") or {}).get("memory")
        if memory is not None:
            left = exact_value(memory["value"]) - reference_consumed(device.key, claims)
            smallest = exact_value("4Gi") if memory.get("requestPolicy") else Fraction(0)
            if left <= 0 or left < smallest:
                return False
    return True


def reference_series(
    pool: published.Pool, claims: Iterable[Body]
) -> dict[tuple[Any, tuple[str, ...]], float]:
    """The pool's counter and shared-device series, counted plainly."""
    claims = list(claims)
    found: dict[tuple[Any, tuple[str, ...]], float] = {}
    used = reference_used(pool, claims)
    held = {k[2] for k, _ in reference_holds(claims) if k[:2] == pool.key}
    for name, counter_set in pool.counter_sets.items():
        node = counter_set.node or pool.pool
        totals: dict[str, list[Fraction]] = {}
        for counter, value in counter_set.counters.items():
            row = totals.setdefault(re.sub(r"-\d+$", "", counter), [Fraction(0), Fraction(0)])
            row[0] += used[name, counter]
            row[1] += max(value - used[name, counter], Fraction(0))
        for family, (consumed, left) in totals.items():
            found[metrics.COUNTERS, (node, name, family, "used")] = float(consumed)
            found[metrics.COUNTERS, (node, name, family, "free")] = float(left)
        found[metrics.PARTITIONS_ALLOCATED, (node, name)] = sum(
            1
            for d in pool.devices
            if d.name in held
            and any(e["counterSet"] == name for e in d.body.get("consumesCounters") or [])
        )
    for device in pool.devices:
        if not device.shared:
            continue
        node = device.node or pool.pool
        memory = device.memory_bytes
        results = [r for k, r in reference_holds(claims) if k == device.key]
        if any(not r.get("shareID") for r in results):
            taken = memory
        else:
            taken = min(memory, int(reference_consumed(device.key, claims)))
        found[metrics.SHARED_MEMORY, (node, device.name, "published")] = memory
        found[metrics.SHARED_MEMORY, (node, device.name, "used")] = taken
        found[metrics.SHARED_MEMORY, (node, device.name, "free")] = memory - taken
        found[metrics.SHARES, (node, device.name)] = sum(1 for r in results if r.get("shareID"))
    return found


class Cluster:
    """The objects as the API server has them, and the controller's parts fed from them."""

    def __init__(self, bulk: int | None = None) -> None:
        self.objects: dict[str, dict[str, Body]] = {kind: {} for kind in KINDS}
        self.view = ClusterView(pods_without_claims=False)
        self.selections = Selections()
        self.tally = Tally(DRIVER, self.selections)
        self.explainer = Explainer(self.view, Reporter(None, "test"), DRIVER, self.selections)  # type: ignore[arg-type]
        if bulk is not None:
            self.explainer.bulk = bulk

    def apply(self, kind: str, event_type: str | None, body: Body) -> None:
        store = self.objects[kind]
        if event_type == "DELETED":
            store.pop(key_of(body), None)
        else:
            store[key_of(body)] = body
        self.view.apply(kind, event_type, body)

    def reconcile(self) -> None:
        changes = self.view.take_changes()
        self.tally.update(self.view, changes)
        self.explainer.note(changes)
        self.explainer.refresh()

    def check(self) -> None:
        slices, claims = list(self.objects["ResourceSlice"].values()), self.objects["ResourceClaim"]
        classes, nodes = self.objects["DeviceClass"], self.objects["Node"]
        devices, problems = published.current_pools(slices)
        held = claimed.allocated(claims.values())
        pools = {p.key: p for p in published.read_pools(slices) if p.complete}
        free = {d.key: reference_free(d, pools, claims.values()) for d in devices}
        usage = partitions.Usage(claimed.HolderIndex.of(claims.values()), pools)
        expected_nodes = {
            node: c.row() for node, c in published.per_node(devices, held, DRIVER, usage).items()
        }
        assert {n: tuple(v) for n, v in self.tally.nodes.items() if v[0]} == expected_nodes
        for node, row in expected_nodes.items():
            ours = [d for d in devices if d.driver == DRIVER and (d.node or "") == node]
            assert row[6] == sum(free[d.key] for d in ours), node
        for name, device_class in classes.items():
            admitted = [d for d in devices if admits(device_class, d)]
            ours = [d for d in admitted if d.driver == DRIVER]
            taken = sum(d.key in held for d in ours)
            available = sum(free[d.key] for d in ours)
            assert self.tally.admitted[name] == [len(ours), taken, len(admitted), available], name
        assert set(self.tally.admitted) == set(classes)
        expected_series = {
            key: reference_series(pool, claims.values())
            for key, pool in pools.items()
            if key[0] == DRIVER
        }
        assert {k: v for k, v in self.tally.series.items()} == {
            k: v for k, v in expected_series.items() if v
        }
        for series in self.tally.series.values():
            for gauge, labels in series:
                if gauge is metrics.COUNTERS and labels[3] == "used" and series[gauge, labels]:
                    note("counters used")
                if gauge is metrics.SHARES and series[gauge, labels]:
                    note("shares held")
        if any(free[d.key] != (d.key not in held) for d in devices if d.driver == DRIVER):
            note("a device neither held nor free")
        states = collections.Counter(claimed.claim_state(c) for c in claims.values())
        assert {s: self.view.claim_states[s] for s in states} == states
        assert {(p.driver, p.pool): p.message for p in problems} == {
            k: p.message for k, p in self.tally.problems.items()
        }
        for key, claim in sorted(claims.items()):
            waiting = waiting_pods(claim, self.objects["Pod"])
            if claim["status"].get("allocation") or not waiting:
                continue
            got = self.explainer.last(key)
            if not concerns_us(claim, classes):
                assert got is None
                continue
            expected = explain.explain_claim(
                claim,
                pod=waiting[0],
                classes=classes,
                slices=slices,
                claims=list(claims.values()),
                nodes=nodes,
            )
            assert got == without_devices(expected), key
            detailed = explain.explain(
                claim, self.explainer.world(), classes=classes, pod=waiting[0]
            )
            assert detailed == expected, key
            # What decides a re-post: the same whether the devices are written out or not.
            assert meanings.of(got) == meanings.of(expected), key
            for request in expected.requests:
                for verdict in {d.verdict for d in request.devices}:
                    note(f"a device explained as {verdict}")


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(st.lists(events(), min_size=1, max_size=4), min_size=1, max_size=15),
    st.sampled_from([None, 0]),  # 0: every batch is a bulk one (all classes' claims stale)
    st.booleans(),
)
def test_incremental_view_equals_a_full_recompute(
    batches: list[list[tuple[str, str | None, Body]]], bulk: int | None, partitioned: bool
) -> None:
    cluster = Cluster(bulk)
    start = [*base(), *(partitioned_pool() if partitioned else [])]
    for batch in [start, *batches]:
        for kind, event_type, body in batch:
            cluster.apply(kind, event_type, body)
        cluster.reconcile()
        cluster.check()


@st.composite
def partition_claims(draw: st.DrawFn) -> Body:
    """A claim of c-0 that may hold pool-p's devices, alone or in shares, or asks capacity."""
    body: Body = draw(claims())
    exact: Body = {"deviceClassName": "c-0"}
    if draw(st.integers(0, 3)):  # pool-p's devices only (they have no product)
        exact["selectors"] = [
            {"cel": {"expression": f'!("product" in device.attributes["{DRIVER}"])'}}
        ]
    if draw(st.booleans()):
        exact["capacity"] = {"requests": {"memory": draw(names(["4Gi", "10Gi", "16Gi", "40Gi"]))}}
    body["spec"]["devices"]["requests"] = [{"name": "r0", "exactly": exact}]
    body["metadata"].pop("deletionTimestamp", None)
    if draw(st.booleans()):
        results = []
        for device in draw(st.lists(names(["gpu-0", "gpu-1", "gpu-2"]), min_size=1, max_size=2)):
            result: Body = {"request": "r0", "driver": DRIVER, "pool": "pool-p", "device": device}
            if device == "gpu-2" and draw(st.integers(0, 3)):
                result["shareID"] = f"share-{draw(st.integers(0, 9))}"
                result["consumedCapacity"] = {"memory": draw(names(["4Gi", "8Gi", "16Gi"]))}
            results.append(result)
        body["status"] = {"allocation": {"devices": {"results": results}}}
    else:
        body["status"] = {}
    return body


@st.composite
def partition_events(draw: st.DrawFn) -> tuple[str, str | None, Body]:
    kind = draw(names(["ResourceClaim"] * 4 + ["Pod"] * 2 + ["ResourceSlice"]))
    if kind == "ResourceClaim":
        body = draw(partition_claims())
    elif kind == "Pod":
        body = draw(pods())
    else:  # pool-p republished: more or fewer compute slices, or its counters as they were
        body = partitioned_pool()[0][2]
        compute = draw(names(["1", "2", "3"]))
        body["spec"]["sharedCounters"][0]["counters"]["compute"] = {"value": compute}
    return kind, draw(names(["ADDED", "MODIFIED", "MODIFIED", "DELETED"])), body


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.lists(partition_events(), min_size=1, max_size=4), min_size=1, max_size=12))
def test_partitions_and_shares_incremental_equal_a_full_recompute(
    batches: list[list[tuple[str, str | None, Body]]],
) -> None:
    """The same, with the claims on a partitioned pool: counters and shares in every step."""
    cluster = Cluster()
    for batch in [[*base(), *partitioned_pool()], *batches]:
        for kind, event_type, body in batch:
            cluster.apply(kind, event_type, body)
        cluster.reconcile()
        cluster.check()


# --- what is explained again ------------------------------------------------------------------


def pending(name: str, device_class: str, count: int) -> Body:
    request = {"deviceClassName": device_class, "count": count}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        "status": {},
    }


def waiting(name: str, claim: str) -> Body:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
        "status": {"phase": "Pending"},
    }


def allocated(name: str, node: str, device: str) -> Body:
    claim = pending(name, "c-0", 1)
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return claim


def product_classes() -> list[tuple[str, str | None, Body]]:
    """c-0 admits product A (gpu-0, gpu-2 of each node), c-1 product B (gpu-1)."""
    return [
        (
            "DeviceClass",
            "MODIFIED",
            {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": e}}]}},
        )
        for name, e in (
            ("c-0", f'device.attributes["{DRIVER}"].product == "A"'),
            ("c-1", f'device.attributes["{DRIVER}"].product == "B"'),
        )
    ]


def queue() -> Cluster:
    """The base cluster with a claim of each class that no node can satisfy, pods waiting."""
    cluster = Cluster()
    for event in [
        *base(),
        *product_classes(),
        ("ResourceClaim", "ADDED", pending("wants-a", "c-0", 3)),
        ("Pod", "ADDED", waiting("pod-a", "wants-a")),
        ("ResourceClaim", "ADDED", pending("wants-b", "c-1", 2)),
        ("Pod", "ADDED", waiting("pod-b", "wants-b")),
    ]:
        cluster.apply(*event)
    cluster.reconcile()
    cluster.check()
    return cluster


def explained_after(cluster: Cluster, *events: tuple[str, str | None, Body]) -> int:
    before = cluster.explainer.explained
    for event in events:
        cluster.apply(*event)
    cluster.reconcile()
    cluster.check()
    return cluster.explainer.explained - before


def test_a_device_taken_re_explains_only_the_claims_whose_class_admits_it() -> None:
    cluster = queue()
    assert cluster.explainer.explained == 2
    message = cluster.explainer.last("ns/wants-b").message  # type: ignore[union-attr]
    assert message.startswith("request gpu: needs 2 devices on one node, at most 1 available")
    assert (
        explained_after(cluster, ("ResourceClaim", "ADDED", allocated("x", "node-0", "gpu-1"))) == 1
    )
    assert "node-0/gpu-1 is allocated to ns/x" in cluster.explainer.last("ns/wants-b").message  # type: ignore[union-attr]
    assert (
        explained_after(cluster, ("ResourceClaim", "DELETED", allocated("x", "node-0", "gpu-1")))
        == 1
    )
    assert (
        explained_after(cluster, ("ResourceClaim", "ADDED", allocated("y", "node-1", "gpu-0"))) == 1
    )
    assert "node-1/gpu-0 is allocated to ns/y" in cluster.explainer.last("ns/wants-a").message  # type: ignore[union-attr]


def test_changes_no_claim_reads_explain_nothing() -> None:
    cluster = queue()
    other_pod = waiting("web", "nothing")
    other_pod["spec"].pop("resourceClaims")
    node = base()[0][2]
    heartbeat = {
        **node,
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "now"}]},
    }
    assert explained_after(cluster, ("Pod", "ADDED", other_pod)) == 0
    assert explained_after(cluster, ("Node", "MODIFIED", heartbeat)) == 0
    assert explained_after(cluster) == 0
    bound = waiting("bound", "wants-a")
    bound["spec"]["nodeName"] = "node-3"
    assert explained_after(cluster, ("Pod", "ADDED", bound)) == 1  # a pod of wants-a


def test_a_node_that_stops_being_ready_re_explains_the_claims_with_devices_on_it() -> None:
    cluster = queue()
    node = base()[0][2]
    not_ready = {**node, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert explained_after(cluster, ("Node", "MODIFIED", not_ready)) == 2
    assert "node node-0 is not Ready" in cluster.explainer.last("ns/wants-a").message  # type: ignore[union-attr]


def test_claims_alike_share_one_check() -> None:
    cluster = queue()
    checks = cluster.explainer._checks

    def kept() -> set[tuple[Any, ...]]:  # the controller's (check() adds detailed ones)
        return {key for key in checks._found if key[-1] is False}

    before = kept()
    events: list[tuple[str, str | None, Body]] = []
    for i in range(20):
        events.append(("ResourceClaim", "ADDED", pending(f"more-{i}", "c-0", 3)))
        events.append(("Pod", "ADDED", waiting(f"more-pod-{i}", f"more-{i}")))
    assert explained_after(cluster, *events) == 20
    # All twenty ask what wants-a asks, with pods alike: its check, kept from the last pass.
    assert kept() == before
    cluster.apply("ResourceClaim", "ADDED", allocated("z", "node-2", "gpu-0"))
    cluster.reconcile()
    cluster.check()
    assert len(kept() - before) == 1  # c-0 saw a device taken: one new check for all 21


def test_a_class_without_devices_is_explained_again_when_any_pool_changes() -> None:
    cluster = queue()
    none = {
        "metadata": {"name": "c-2"},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].product == "C"'}}]
        },
    }
    assert (
        explained_after(
            cluster,
            ("DeviceClass", "ADDED", none),
            ("ResourceClaim", "ADDED", pending("wants-c", "c-2", 1)),
            ("Pod", "ADDED", waiting("pod-c", "wants-c")),
        )
        == 1
    )
    assert "and 9 more are of other classes" in cluster.explainer.last("ns/wants-c").message  # type: ignore[union-attr]
    extra = base()[1][2]
    extra = {
        **extra,
        "metadata": {"name": "extra"},
        "spec": {
            **extra["spec"],
            "pool": {"name": "extra", "generation": 1, "resourceSliceCount": 1},
        },
    }
    # Its devices are of c-0 and c-1, and c-2's message counts them among the others.
    assert explained_after(cluster, ("ResourceSlice", "ADDED", extra)) == 3
    assert "and 12 more are of other classes" in cluster.explainer.last("ns/wants-c").message  # type: ignore[union-attr]

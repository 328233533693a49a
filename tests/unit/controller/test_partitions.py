"""Partitions and shares as the controller reads them: the counters allocated MIG partitions use,
the scheduler's share arithmetic, what is free, the metrics per counter set and shared device,
and the explanations that name the counters or the capacity a claim lacks.

The slices are the agent's own (``slices.build_slices`` over a simulated profile with an A100
40GB partitioned and an 80Gi GPU shared), so the layout is the one the controller meets.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from dra_gpu.agent import slices
from dra_gpu.controller import claimed, explain, partitions, published
from dra_gpu.controller.explain import Reason, Verdict
from dra_gpu.controller.explainer import Explainer
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.tallies import Tally
from dra_gpu.controller.view import ClusterView
from dra_gpu.devices import simulated
from dra_gpu.serving import metrics

DRIVER = "gpu.example.com"
GI = 2**30
Body = dict[str, Any]
PROFILE = """\
nodes:
  node-01:
    devices:
    - {memory: 40Gi, migCapable: true, mig: A100-40GB}
    - memory: 80Gi
      sharing: {mode: MPS, memory: {default: 10Gi, min: 1Gi, step: 1Gi}}
"""
ALL = f'device.driver == "{DRIVER}"'


def node_slices() -> list[Body]:
    inv = simulated.parse_profile(PROFILE).inventory("node-01")
    return slices.build_slices(
        "node-01", "uid", DRIVER, inv.devices, 1, counter_sets=inv.counter_sets
    )


def claim(name: str, *results: Body, requests: list[Body] | None = None) -> Body:
    body: Body = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests or []}},
        "status": {},
    }
    if results:
        body["status"]["allocation"] = {"devices": {"results": list(results)}}
    return body


def result(device: str, *, share: str | None = None, memory: str | None = None) -> Body:
    found: Body = {"request": "gpu", "driver": DRIVER, "pool": "node-01", "device": device}
    if share is not None:
        found["shareID"] = share
        if memory is not None:
            found["consumedCapacity"] = {"memory": memory}
    return found


def request(selector: str | None = None, memory: str | None = None) -> list[Body]:
    exactly: Body = {"deviceClassName": "gpu"}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return [{"name": "gpu", "exactly": exactly}]


def usage_of(claims: list[Body]) -> tuple[partitions.Usage, published.Pool]:
    (pool,) = published.read_pools(node_slices())
    return partitions.Usage(claimed.HolderIndex.of(claims), {pool.key: pool}), pool


def device(pool: published.Pool, name: str) -> published.PublishedDevice:
    return pool.devices[pool.positions[name]]


def explained(pending: Body, claims: list[Body], *, only: str | None = None) -> explain.Explanation:
    """``pending`` explained; ``only``: a selector the class adds (other devices: other class)."""
    selectors = [{"cel": {"expression": e}} for e in (ALL, only) if e]
    classes = {"gpu": {"metadata": {"name": "gpu"}, "spec": {"selectors": selectors}}}
    node = {
        "metadata": {"name": "node-01"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    return explain.explain_claim(
        pending,
        classes=classes,
        slices=node_slices(),
        claims=[pending, *claims],
        nodes={"node-01": node},
    )


WHOLE = f'device.attributes["{DRIVER}"].type == "gpu" && !device.allowMultipleAllocations'
FULL = "gpu-0-mig-7g-40gb-0"
"""The full-size partition: a MIG-mode GPU is published as partitions only (no whole GPU)."""
FULL_SIZE = (
    f'"profile" in device.attributes["{DRIVER}"] && '
    f'device.attributes["{DRIVER}"].profile == "7g.40gb"'
)
HELD = [
    claim("a", result("gpu-0-mig-3g-20gb-0")),  # memory slices 0-3, 3 compute slices
    claim("b", result("gpu-0-mig-1g-5gb-4")),  # memory slice 4, 1 compute slice
]


# --- reading ---


def test_a_pool_reads_its_counter_sets_and_each_device_what_it_consumes() -> None:
    (pool,) = published.read_pools(node_slices())
    counters = pool.counter_sets["gpu-0-counters"]
    assert counters.node == "node-01"
    assert counters.counters["compute-slices"] == 7
    assert sum(v for k, v in counters.counters.items() if k.startswith("memory-slice")) == 8
    ((name, consumed),) = device(pool, "gpu-0-mig-3g-20gb-4").consumes
    assert name == "gpu-0-counters"
    assert dict(consumed) == {
        "compute-slices": 3,
        **{f"memory-slice-{i}": 1 for i in range(4, 8)},
    }
    assert len(pool.consumers["gpu-0-counters"]) == 25
    assert "gpu-0" not in pool.positions
    # The GPU's memory counts once: its full-size partition's stands for it.
    assert pool.memory_carriers == {"gpu-0-counters": pool.positions[FULL]}
    shared = device(pool, "gpu-1")
    assert shared.shared
    assert not device(pool, FULL).shared
    assert shared.capacities["memory"] == published.Capacity(
        Fraction(80 * GI), default=Fraction(10 * GI), minimum=Fraction(GI), step=Fraction(GI)
    )


def test_a_claim_holds_a_device_alone_or_in_shares_with_their_consumed_capacity() -> None:
    index = claimed.HolderIndex.of(
        [
            claim(
                "a",
                result("gpu-1", share="s1", memory="30Gi"),
                result("gpu-1", share="s2", memory="10Gi"),
            ),
            claim("b", result("gpu-1", share="s3", memory="20Gi")),
            claim("c", result("gpu-0")),
        ]
    )
    key = (DRIVER, "node-01", "gpu-1")
    assert index.owners(key) == ("ns/a", "ns/b")
    assert index.consumed(key) == {"memory": 60 * GI}
    assert not index.taken()(key)
    assert index.taken()((DRIVER, "node-01", "gpu-0"))
    assert (DRIVER, "node-01", "gpu-0") in index
    index.put(0, None)  # claim a gone
    assert index.consumed(key) == {"memory": 20 * GI}


# --- shares: the scheduler's arithmetic ---


POLICY = published.Capacity(
    Fraction(40 * GI),
    default=Fraction(8 * GI),
    minimum=Fraction(4 * GI),
    maximum=Fraction(24 * GI),
    step=Fraction(4 * GI),
)


@pytest.mark.parametrize(
    ("capacity", "requested", "consumed"),
    [
        (POLICY, None, 8 * GI),  # the default
        (POLICY, 1 * GI, 4 * GI),  # up to the minimum
        (POLICY, 10 * GI, 12 * GI),  # up to the next step
        (POLICY, 12 * GI, 12 * GI),
        (published.Capacity(Fraction(40 * GI)), None, 40 * GI),  # no policy: all of it
        (published.Capacity(Fraction(40 * GI)), 10 * GI, 10 * GI),  # ... or what it asks
        (published.Capacity(Fraction(40), valid_values=(Fraction(10), Fraction(20))), 11, 20),
        (published.Capacity(Fraction(40), valid_values=(Fraction(10), Fraction(20))), 30, 30),
    ],
)
def test_a_share_takes_the_request_rounded_by_the_policy(
    capacity: published.Capacity, requested: int | None, consumed: int
) -> None:
    asked = Fraction(requested) if requested is not None else None
    assert partitions.consumed_share(capacity, asked) == consumed


def test_policy_violations() -> None:
    assert partitions.violates_policy(POLICY, Fraction(28 * GI))  # over the maximum
    assert partitions.violates_policy(POLICY, Fraction(10 * GI))  # off the step
    assert not partitions.violates_policy(POLICY, Fraction(8 * GI))
    values = published.Capacity(Fraction(40), valid_values=(Fraction(10), Fraction(20)))
    assert partitions.violates_policy(values, Fraction(30))
    assert not partitions.violates_policy(values, Fraction(20))


# --- what is free ---


def test_partitions_held_use_the_counters_they_consume() -> None:
    usage, pool = usage_of(HELD)
    used = usage.pool(pool.key)
    assert used.used["gpu-0-counters"]["compute-slices"] == 4
    assert {c for c, v in used.used["gpu-0-counters"].items() if v} == {
        "compute-slices",
        *(f"memory-slice-{i}" for i in range(5)),
    }
    assert used.allocated == {"gpu-0-counters": 2}
    free = {d.name for d in pool.devices if usage.available(d)}
    # Every placement over slices 0-4 is not free (the 7g one neither); 3 compute slices left.
    assert free == {
        "gpu-1",
        "gpu-0-mig-1g-5gb-5",
        "gpu-0-mig-1g-5gb-6",
        "gpu-0-mig-1g-5gb-me-5",
        "gpu-0-mig-1g-5gb-me-6",
        "gpu-0-mig-1g-10gb-6",
    }
    short = usage.short(device(pool, FULL))
    assert {(s.counter, int(s.free)) for s in short} == {
        ("compute-slices", 3),
        *((f"memory-slice-{i}", 0) for i in range(5)),
    }


def test_per_node_counts_a_partitioned_gpu_once_and_free_only_what_a_claim_could_get() -> None:
    usage, pool = usage_of(HELD)
    held = claimed.allocated(HELD)
    counts = published.per_node(pool.devices, held, DRIVER, usage)["node-01"]
    assert (counts.published, counts.allocated, counts.free) == (26, 2, 6)
    # gpu-0 counts its 40Gi once (not once per placement); gpu-1 its 80Gi.
    assert counts.memory == 120 * GI
    assert counts.memory_allocated == 25 * GI


def test_a_shared_device_is_free_while_a_share_fits_and_counts_what_its_shares_consumed() -> None:
    shares = [
        claim("a", result("gpu-1", share="s1", memory="30Gi")),
        claim("b", result("gpu-1", share="s2", memory="20Gi")),
    ]
    usage, pool = usage_of(shares)
    gpu_1 = device(pool, "gpu-1")
    assert usage.available(gpu_1)
    assert usage.memory(gpu_1) == (80 * GI, 50 * GI)
    assert usage.shares(gpu_1.key) == 2
    counts = published.per_node(pool.devices, claimed.allocated(shares), DRIVER, usage)
    assert (counts["node-01"].allocated, counts["node-01"].free) == (1, 26)
    full, pool = usage_of([*shares, claim("c", result("gpu-1", share="s3", memory="30Gi"))])
    assert not full.available(device(pool, "gpu-1"))
    alone, pool = usage_of([claim("d", result("gpu-1"))])  # held without a share: taken
    assert not alone.available(device(pool, "gpu-1"))
    assert alone.memory(device(pool, "gpu-1")) == (80 * GI, 80 * GI)


def test_a_shared_device_consumes_its_counters_once_for_all_its_shares() -> None:
    body = node_slices()
    for s in body:
        for d in s["spec"].get("devices") or []:
            if d["name"] == "gpu-0-mig-3g-20gb-4":
                d["allowMultipleAllocations"] = True
    (pool,) = published.read_pools(body)
    held = [claim("a", result("gpu-0-mig-3g-20gb-4", share="s1"))]
    usage = partitions.Usage(claimed.HolderIndex.of(held), {pool.key: pool})
    assert usage.available(device(pool, "gpu-0-mig-3g-20gb-4"))  # another share: no charge
    assert usage.available(device(pool, "gpu-0-mig-4g-20gb-0"))  # slices 0-3, 4 + 3 compute
    assert not usage.available(device(pool, FULL))
    assert usage.pool(pool.key).used["gpu-0-counters"]["compute-slices"] == 3


# --- the metrics ---


def sample(name: str, **labels: str) -> float | None:
    return metrics.CLUSTER.get_sample_value(name, labels)


def test_the_gauges_per_counter_set_and_shared_device_follow_the_allocations() -> None:
    view = ClusterView(pods_without_claims=False)
    tally = Tally(DRIVER, Selections())
    for body in node_slices():
        view.apply("ResourceSlice", "ADDED", body)
    for body in [*HELD, claim("c", result("gpu-1", share="s1", memory="30Gi"))]:
        view.apply("ResourceClaim", "ADDED", body)
    tally.update(view, view.take_changes())
    where = {"node": "node-01", "counter_set": "gpu-0-counters"}
    assert sample("dra_gpu_counters", **where, counter="memory-slice", state="used") == 5
    assert sample("dra_gpu_counters", **where, counter="memory-slice", state="free") == 3
    assert sample("dra_gpu_counters", **where, counter="compute-slices", state="free") == 3
    assert sample("dra_gpu_counters", **where, counter="media-extensions", state="used") == 0
    assert sample("dra_gpu_partitions_allocated", **where) == 2
    shared = {"node": "node-01", "device": "gpu-1"}
    assert sample("dra_gpu_shared_memory_bytes", **shared, state="used") == 30 * GI
    assert sample("dra_gpu_shared_memory_bytes", **shared, state="free") == 50 * GI
    assert sample("dra_gpu_shares", **shared) == 1
    assert sample("dra_gpu_devices", node="node-01", state="free") == 6
    assert sample("dra_gpu_devices", node="node-01", state="allocated") == 3

    view.apply("ResourceClaim", "DELETED", HELD[0])
    tally.update(view, view.take_changes())
    assert sample("dra_gpu_counters", **where, counter="memory-slice", state="used") == 1
    assert sample("dra_gpu_partitions_allocated", **where) == 1
    for body in node_slices():
        view.apply("ResourceSlice", "DELETED", body)
    tally.update(view, view.take_changes())
    assert sample("dra_gpu_partitions_allocated", **where) is None  # the series go with the pool
    assert sample("dra_gpu_shares", **shared) is None


# --- explanations ---


def test_the_full_size_partition_pending_names_the_counters_the_partitions_hold() -> None:
    pending = claim("full", requests=request(FULL_SIZE))
    found = explained(pending, HELD)
    assert found.reason == Reason.DEVICES_ALLOCATED
    assert found.message.endswith(
        f"node-01/{FULL} needs compute-slices 7 of gpu-0-counters, 3 free; memory-slice 8, 3 free "
        "(held by ns/a, ns/b)"
    )
    (req,) = found.requests
    verdicts = {d.device: d.verdict for d in req.devices}
    assert verdicts[FULL] == Verdict.COUNTERS
    assert verdicts["gpu-0-mig-1g-5gb-6"] == Verdict.MISMATCH


def test_a_claim_for_the_whole_gpu_of_a_mig_mode_gpu_finds_no_device() -> None:
    # Only partitions are published for gpu-0; the whole-GPU selector matches none of them.
    found = explained(claim("whole", requests=request(WHOLE)), [])
    assert found.reason == Reason.NO_DEVICE_FITS
    (req,) = found.requests
    assert "gpu-0" not in {d.device for d in req.devices}
    assert {d.verdict for d in req.devices if d.device.startswith("gpu-0-mig-")} == {
        Verdict.MISMATCH
    }


def profile(name: str) -> str:
    attributes = f'device.attributes["{DRIVER}"]'
    return f'"profile" in {attributes} && {attributes}.profile == "{name}"'


def test_a_partition_over_a_held_slice_is_named_with_its_holder() -> None:
    held = [*HELD, claim("c", result("gpu-0-mig-3g-20gb-4"))]
    found = explained(claim("p", requests=request()), held, only=profile("3g.20gb"))
    assert found.reason == Reason.DEVICES_ALLOCATED
    assert found.message == (
        "request gpu: no device fits: node-01/gpu-0-mig-3g-20gb-0 is allocated to ns/a; "
        "node-01/gpu-0-mig-3g-20gb-4 is allocated to ns/c"
    )


def test_a_partition_whose_slices_others_hold_is_named_with_those_holders() -> None:
    found = explained(claim("p", requests=request()), HELD, only=profile("4g.20gb"))
    assert found.message == (
        "request gpu: no device fits: node-01/gpu-0-mig-4g-20gb-0 needs compute-slices 4 of "
        "gpu-0-counters, 3 free; memory-slice 4, 0 free (held by ns/a, ns/b)"
    )
    two = explained(claim("q", requests=request()), HELD, only=profile("2g.10gb"))
    assert (
        "node-01/gpu-0-mig-2g-10gb-4 needs memory-slice 2 of gpu-0-counters, 1 free (held by ns/b)"
        in two.message
    )


SHARED = "device.allowMultipleAllocations"
SHARES = [
    claim("a", result("gpu-1", share="s1", memory="30Gi")),
    claim("b", result("gpu-1", share="s2", memory="20Gi")),
]


def test_a_shared_gpu_with_too_little_left_says_how_much_is_free() -> None:
    found = explained(claim("p", requests=request(SHARED, "40Gi")), SHARES)
    assert found.reason == Reason.DEVICES_ALLOCATED
    assert found.message.endswith(
        "node-01/gpu-1 shared: 30Gi of 80Gi memory free, the request asks 40Gi (held by ns/a, ns/b)"
    )
    assert [d.verdict for d in found.requests[0].devices if d.device == "gpu-1"] == [
        Verdict.CAPACITY
    ]
    fits = explained(claim("q", requests=request(SHARED, "30Gi")), SHARES)
    assert fits.reason == Reason.SATISFIABLE


def test_a_share_rounded_up_and_the_default_share_are_named_as_such() -> None:
    full = [*SHARES, claim("c", result("gpu-1", share="s3", memory="26Gi"))]
    rounded = explained(claim("p", requests=request(SHARED, "4.5Gi")), full)
    assert rounded.message.endswith(
        "node-01/gpu-1 shared: 4Gi of 80Gi memory free, the request asks 4608Mi (a share of 5Gi) "
        "(held by ns/a, ns/b, ns/c)"
    )
    default = explained(claim("q", requests=request(SHARED)), full)
    assert default.message.endswith(
        "node-01/gpu-1 shared: 4Gi of 80Gi memory free, the default share is 10Gi "
        "(held by ns/a, ns/b, ns/c)"
    )


def texts(found: explain.Explanation, name: str) -> list[str]:
    return [d.text for r in found.requests for d in r.devices if d.device == name]


def test_a_request_no_device_could_ever_hold_is_a_mismatch_with_the_amounts() -> None:
    found = explained(claim("p", requests=request(SHARED, "100Gi")), [])
    assert found.reason == Reason.NO_DEVICE_FITS
    assert texts(found, "gpu-1") == ["node-01/gpu-1 has memory 80Gi, the request asks 100Gi"]
    full = explained(claim("q", requests=request(FULL_SIZE, "64Gi")), [])
    assert full.message.startswith("request gpu: no device fits: ")
    assert texts(full, FULL) == [f"node-01/{FULL} has memory 40Gi, the request asks 64Gi"]
    cores = request(FULL_SIZE)
    cores[0]["exactly"]["capacity"] = {"requests": {"cores": "2"}}
    missing = explained(claim("r", requests=cores), [])
    assert texts(missing, FULL) == [f"node-01/{FULL} has no cores capacity, the request asks 2"]
    policy = published.Capacity(Fraction(40 * GI), maximum=Fraction(24 * GI), minimum=Fraction(GI))
    miss = partitions.ShareMiss("memory", "policy", Fraction(30 * GI), Fraction(30 * GI), policy)
    assert partitions.share_text("node-01/gpu-1", miss, ()) == (
        "node-01/gpu-1 allows at most 24Gi memory per share, the request asks 30Gi"
    )


def test_texts_without_partitions_or_shares_are_unchanged() -> None:
    """A plain GPU taken reads as before: the new checks add nothing to its words."""
    found = explained(claim("p", requests=request(SHARED)), [claim("x", result("gpu-1"))])
    assert "node-01/gpu-1 is allocated to ns/x" in found.message


def test_the_controller_explains_again_when_a_partition_takes_counters_of_the_gpu() -> None:
    view = ClusterView(pods_without_claims=False)
    selections = Selections()
    explainer = explaining_explainer(view, selections)
    classes = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": ALL}}]}}
    view.apply("DeviceClass", "ADDED", classes)
    view.apply(
        "Node",
        "ADDED",
        {
            "metadata": {"name": "node-01"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )
    for body in node_slices():
        view.apply("ResourceSlice", "ADDED", body)
    view.apply("ResourceClaim", "ADDED", claim("whole", requests=request(FULL_SIZE)))
    view.apply(
        "Pod",
        "ADDED",
        {
            "metadata": {"namespace": "ns", "name": "p", "uid": "p"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "whole"}]},
            "status": {"phase": "Pending"},
        },
    )
    explainer.note(view.take_changes())
    explainer.refresh()
    assert explainer.last("ns/whole").reason == Reason.SATISFIABLE  # type: ignore[union-attr]
    view.apply("ResourceClaim", "ADDED", HELD[1])  # a 1g.5gb: not the 7g one, its counters
    explainer.note(view.take_changes())
    assert explainer.refresh() == 1
    assert explainer.last("ns/whole").message.endswith(  # type: ignore[union-attr]
        f"node-01/{FULL} needs compute-slices 7 of gpu-0-counters, 6 free; memory-slice 8, 7 free "
        "(held by ns/b)"
    )


def explaining_explainer(view: ClusterView, selections: Selections) -> Explainer:
    return Explainer(view, Reporter(None, "test"), DRIVER, selections)  # type: ignore[arg-type]

"""The controller reads partitions and shares as the real scheduler allocates them.

An agent publishes node-01's GPU as MIG partitions of a simulated A100 40GB (a MIG-mode GPU: its
partitions only, not the whole GPU) or as one 40Gi GPU shared by memory shares; claims get
partitions (shares) from the real scheduler; then a claim that cannot fit (the full-size
partition, a share too large) waits. The session's controller must explain it by what the
others hold — the counters of the GPU that the partitions used up, the memory the shares
left — on the claim itself, and its metrics per counter set and shared device must match what
the scheduler allocated, counted here from the allocations and NVIDIA's placement table.

Partitionable devices and consumable capacity are on by default from Kubernetes 1.36; on 1.35
the API server drops the counters and the sharing fields, the agent publishes of the MIG-mode
GPU only its full-size partition and the shared GPU exclusive, and these tests check that no
counter or share series appears.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from dra_gpu import kube
from dra_gpu.controller.posting import COMPONENT
from dra_gpu.devices import mig
from dra_gpu.testing import ControllerProcess, eventually
from tests.e2e.helpers import AgentStarter, claim_and_pod, driver_class, server_minor

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
GI = 2**30
MIG_PROFILE = """\
nodes:
  node-01:
    devices:
    - {memory: 40Gi, migCapable: true, mig: A100-40GB, productName: NVIDIA A100-SXM4-40GB}
"""
SHARED_PROFILE = """\
nodes:
  node-01:
    devices:
    - memory: 40Gi
      sharing: {mode: MPS, memory: {default: 8Gi, min: 4Gi, step: 4Gi}}
"""
PLACEMENTS = {mig.partition_name_of("gpu-0", p): p for p in mig.placements(mig.A100_40GB)}
SET = "gpu-0-counters"
FULL_SIZE = "7g.40gb"
FULL = "gpu-0-mig-7g-40gb-0"


@pytest_asyncio.fixture
async def test_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, "dra-gpu-test-partitions") as name:
        yield name


def attribute_is(name: str, value: str) -> str:
    attributes = f'device.attributes["{DRIVER}"]'
    return f'"{name}" in {attributes} && {attributes}.{name} == "{value}"'


async def allocations(api: kube.Kube, ns: str, names: list[str]) -> dict[str, kube.Body] | None:
    """Claim -> its one result, once every claim of ``names`` is allocated."""
    found = {}
    for name in names:
        claim = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            return None
        (found[name],) = allocation["devices"]["results"]
    return found


async def explained(api: kube.Kube, ns: str, claim: str, text: str) -> kube.Body | None:
    """The controller's Event on ``claim`` whose message holds ``text``."""
    listing = await api.get(
        f"/api/v1/namespaces/{ns}/events",
        fieldSelector=f"involvedObject.kind=ResourceClaim,involvedObject.name={claim}",
    )
    for event in listing["items"]:
        if event.get("reportingComponent") == COMPONENT and text in event["message"]:
            found: kube.Body = event
            return found
    return None


def series(controller: ControllerProcess, *names: str) -> dict[tuple[str, ...], float]:
    """(metric, label values in order of the labels' names) -> value, for node-01's series."""
    found = {}
    for family in text_string_to_metric_families(controller.metrics(*names)):
        for sample in family.samples:
            if sample.labels.get("node") == "node-01":
                labels = tuple(v for _, v in sorted(sample.labels.items()) if v != "node-01")
                found[(sample.name, *labels)] = sample.value
    return found


NAMES = (
    "dra_gpu_counters",
    "dra_gpu_partitions_allocated",
    "dra_gpu_devices",
    "dra_gpu_memory_bytes",
    "dra_gpu_shared_memory_bytes",
    "dra_gpu_shares",
)


async def published_plain(controller: ControllerProcess, absent: str) -> None:
    """1.35: one device is published (the full-size partition, or the GPU exclusive) and no
    ``absent`` series exists."""
    await eventually(
        lambda: series(controller, *NAMES).get(("dra_gpu_devices", "published")) == 1,
        what="gpu-0 published",
    )
    assert not any(k[0] == absent for k in series(controller, *NAMES))


async def test_partitions_held_explain_the_full_size_one_and_the_counters_match_the_scheduler(
    api: kube.Kube,
    namespace: str,
    test_class: str,
    controller: ControllerProcess,
    agent_with: AgentStarter,
) -> None:
    ns = namespace
    async with agent_with(MIG_PROFILE):
        if await server_minor(api) < 36:
            # 1.35: the full-size partition alone (no counters): nothing counted per set.
            await published_plain(controller, "dra_gpu_counters")
            return
        wanted = {"a": "3g.20gb", "b": "2g.10gb", "c": "1g.5gb"}
        for name, profile in wanted.items():
            selector = attribute_is("profile", profile)
            await claim_and_pod(api, ns, name, test_class, selector=selector)
        results = await eventually(
            lambda: allocations(api, ns, list(wanted)), timeout=180, what="partitions allocated"
        )
        held = [PLACEMENTS[r["device"]] for r in results.values()]
        slices_used = {i for p in held for i in p.memory_slices}
        compute_used = sum(p.profile.compute_slices for p in held)
        assert len(slices_used) == sum(p.profile.memory_slices for p in held)  # the scheduler's

        # The full-size partition waits: the controller names the counters the others hold.
        await claim_and_pod(
            api, ns, "full", test_class, selector=attribute_is("profile", FULL_SIZE)
        )
        event = await eventually(
            lambda: explained(api, ns, "full", f"node-01/{FULL} needs"),
            timeout=90,
            what="the full-size partition's claim explained by the counters held",
        )
        assert event["reason"] == "DevicesAllocated"
        assert event["message"].endswith(
            f"node-01/{FULL} needs compute-slices 7 of {SET}, {7 - compute_used} free; "
            f"memory-slice 8, {8 - len(slices_used)} free (held by {ns}/a, {ns}/b, {ns}/c)"
        ), event["message"]

        # The metrics per counter set, and the node's free devices, as the allocations say.
        def free(placement: mig.Placement) -> bool:
            return (
                not set(placement.memory_slices) & slices_used
                and placement.profile.compute_slices <= mig.COMPUTE_SLICES - compute_used
            )

        expected = {
            ("dra_gpu_counters", "memory-slice", SET, "used"): len(slices_used),
            ("dra_gpu_counters", "memory-slice", SET, "free"): 8 - len(slices_used),
            ("dra_gpu_counters", "compute-slices", SET, "used"): compute_used,
            ("dra_gpu_counters", "compute-slices", SET, "free"): 7 - compute_used,
            ("dra_gpu_counters", "media-extensions", SET, "used"): 0,
            ("dra_gpu_partitions_allocated", SET): 3,
            ("dra_gpu_devices", "published"): 25,  # the placements; the GPU is not one
            ("dra_gpu_devices", "allocated"): 3,
            ("dra_gpu_devices", "free"): sum(
                free(p)
                for n, p in PLACEMENTS.items()
                if n not in {r["device"] for r in results.values()}
            ),
            ("dra_gpu_memory_bytes", "published"): 40 * GI,  # the GPU once (its 7g partition)
            ("dra_gpu_memory_bytes", "allocated"): sum(p.profile.memory_gib for p in held) * GI,
        }

        async def matching() -> dict[tuple[str, ...], float] | None:
            now = series(controller, *NAMES)
            return now if all(now.get(k) == v for k, v in expected.items()) else None

        try:
            await eventually(matching, timeout=30, what="counter metrics of node-01")
        finally:
            now = series(controller, *NAMES)
            assert {k: now.get(k) for k in expected} == expected


async def test_shares_held_explain_a_share_that_does_not_fit_and_the_metrics_match(
    api: kube.Kube,
    namespace: str,
    test_class: str,
    controller: ControllerProcess,
    agent_with: AgentStarter,
) -> None:
    ns = namespace
    async with agent_with(SHARED_PROFILE):
        if await server_minor(api) < 36:
            # 1.35: the GPU is published exclusive; no shared device is counted.
            await published_plain(controller, "dra_gpu_shares")
            return
        for name in ("a", "b"):
            await claim_and_pod(api, ns, name, test_class, memory="16Gi")
        results = await eventually(
            lambda: allocations(api, ns, ["a", "b"]), timeout=180, what="two shares allocated"
        )
        assert {r["device"] for r in results.values()} == {"gpu-0"}
        assert all(r.get("shareID") for r in results.values())

        await claim_and_pod(api, ns, "late", test_class, memory="12Gi")
        event = await eventually(
            lambda: explained(api, ns, "late", "shared:"),
            timeout=90,
            what="the third share explained by the memory left",
        )
        assert event["reason"] == "DevicesAllocated"
        assert event["message"] == (
            "request gpu: no device fits: node-01/gpu-0 shared: 8Gi of 40Gi memory free, "
            f"the request asks 12Gi (held by {ns}/a, {ns}/b)"
        )
        expected = {
            ("dra_gpu_shared_memory_bytes", "gpu-0", "published"): 40 * GI,
            ("dra_gpu_shared_memory_bytes", "gpu-0", "used"): 32 * GI,
            ("dra_gpu_shared_memory_bytes", "gpu-0", "free"): 8 * GI,
            ("dra_gpu_shares", "gpu-0"): 2,
            ("dra_gpu_devices", "allocated"): 1,
            ("dra_gpu_devices", "free"): 1,  # 8Gi left: room for a 4Gi share
            ("dra_gpu_memory_bytes", "allocated"): 32 * GI,
        }

        async def matching() -> dict[tuple[str, ...], float] | None:
            now = series(controller, *NAMES)
            return now if all(now.get(k) == v for k, v in expected.items()) else None

        try:
            await eventually(matching, timeout=30, what="share metrics of node-01")
        finally:
            now = series(controller, *NAMES)
            assert {k: now.get(k) for k in expected} == expected

"""Device health on a real node: a fault becomes a device taint the real scheduler honours, a
running pod's status shows its device unhealthy (the kubelet's health stream), Events and
metrics say it; once the device is quiet the taint goes and the device serves again.

The agent runs for the session's node-01 (the tutorial's gpu-0 24Gi and gpu-1 8Gi) with the
simulated backend's faults file (``DRA_GPU_FAULTS_FILE``), a short quiet period, and NoExecute
for reset-needing faults (``DRA_GPU_FATAL_XIDS=reset``; the default is NoSchedule only). A lost
GPU stays tainted while the other GPU serves; a reset-needing XID outlives the quiet period
until the GPU is reset or an operator clears it; a fault of a MIG-mode GPU taints every
partition of it. Device
taints and the kubelet's ResourceHealthStatus are on by default from Kubernetes 1.36; on 1.35
the API server drops taints, and the same tests check the agent's fallback there instead: the
faulty device leaves the pool and comes back once quiet.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.controller.posting import COMPONENT
from dra_gpu.devices import mig
from dra_gpu.testing import AgentProcess, ControllerProcess, eventually
from tests.e2e.helpers import (
    TUTORIAL_PROFILE,
    AgentStarter,
    claim_and_pod,
    driver_class,
    events_of,
    server_minor,
)

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
QUIET_SECONDS = 8
GPU_0 = f'device.attributes["{DRIVER}"].index == 0'


async def taints_served(api: kube.Kube) -> bool:
    """Device taints and the kubelet's health stream are on by default from 1.36."""
    return await server_minor(api) >= 36


@pytest_asyncio.fixture
async def health_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, "dra-gpu-test-health") as name:
        yield name


@pytest_asyncio.fixture
async def agent(
    agent_with: AgentStarter, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[AgentProcess]:
    env = {
        "DRA_GPU_FAULTS_FILE": str(tmp_path / "faults.yaml"),
        "DRA_GPU_HEALTH_QUIET_SECONDS": str(QUIET_SECONDS),
        "DRA_GPU_HEALTH_POLL_SECONDS": "0.5",
        "DRA_GPU_FATAL_XIDS": "reset",
    }
    profile = MIG_PROFILE if "mig" in request.node.name else TUTORIAL_PROFILE
    async with agent_with(profile, env=env, pods_gone_within=60) as started:
        yield started


MIG_PROFILE = """\
nodes:
  node-01:
    devices:
    - {memory: 40Gi, migCapable: true, mig: A100-40GB, productName: NVIDIA A100-SXM4-40GB}
    - {memory: 8Gi}
"""


async def allocated_device(api: kube.Kube, ns: str, claim: str) -> str | None:
    body = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim}")
    results = (((body.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    )
    return str(results[0]["device"]) if results else None


async def running(api: kube.Kube, ns: str, pod: str) -> kube.Body | None:
    body = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    return body if body["status"].get("phase") == "Running" else None


async def delete_pod_and_claim(api: kube.Kube, ns: str, name: str) -> None:
    await api.delete(f"/api/v1/namespaces/{ns}/pods/{name}")

    async def gone() -> bool:
        try:
            await api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        except kube.ApiError as exc:
            return exc.not_found
        return False

    await eventually(gone, what=f"pod {name} gone")
    await api.delete(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")


async def published_taints(api: kube.Kube) -> dict[str, list[kube.Body]]:
    """Every published device of node-01 -> its taints."""
    listing = await api.get(
        f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER},spec.nodeName=node-01"
    )
    return {
        device["name"]: list(device.get("taints") or [])
        for body in listing["items"]
        for device in body["spec"].get("devices") or []
    }


async def gpu0_taints(api: kube.Kube) -> list[kube.Body]:
    return (await published_taints(api)).get("gpu-0", [])


async def node_event(api: kube.Kube, reason: str, text: str) -> kube.Body | None:
    for event in await events_of(api, "default", kind="Node"):
        if event.get("reason") == reason and text in (event.get("message") or ""):
            return event
    return None


def gpu0_health(pod: kube.Body) -> str | None:
    """What the kubelet says in pod status about gpu-0 (allocatedResourcesStatus; the resource
    ID is the device's first CDI ID, ``k8s.gpu.example.com/gpu=<claim uid>-gpu-0``)."""
    for status in pod["status"].get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for resource in entry.get("resources") or []:
                if resource.get("resourceID", "").endswith("-gpu-0"):
                    return str(resource.get("health"))
    return None


async def explained(api: kube.Kube, ns: str, text: str) -> kube.Body | None:
    """The controller's explanation on a claim of ``ns`` that contains ``text``."""
    listing = await api.get(
        f"/api/v1/namespaces/{ns}/events", fieldSelector="involvedObject.kind=ResourceClaim"
    )
    for event in listing["items"]:
        if event.get("reportingComponent") == COMPONENT and text in event["message"]:
            return dict(event)
    return None


async def test_a_faulty_gpu_is_tainted_avoided_reported_and_serves_again_once_quiet(
    api: kube.Kube,
    namespace: str,
    agent: AgentProcess,
    controller: ControllerProcess,
    health_class: str,
    tmp_path: Path,
) -> None:
    if not await taints_served(api):
        await left_out_until_quiet(api, agent, tmp_path, "gpu-0: {xid: 999}\n")
        return
    ns = namespace
    # A pod on gpu-0 while it is healthy.
    await claim_and_pod(api, ns, "before", health_class, selector=GPU_0)
    pod = await eventually(lambda: running(api, ns, "before"), what="pod before Running")
    assert await allocated_device(api, ns, "before") == "gpu-0"
    assert gpu0_health(pod) in (None, "Healthy")

    # An XID that is neither fatal nor ignored: degraded, NoSchedule (running pods stay).
    (tmp_path / "faults.yaml").write_text("gpu-0: {xid: 999}\n")
    [taint] = await eventually(lambda: gpu0_taints(api), what="gpu-0 tainted")
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "gpu.example.com/xid",
        "999",
        "NoSchedule",
    )
    assert taint["timeAdded"].endswith("Z")
    event = await eventually(
        lambda: node_event(api, "DeviceUnhealthy", "node-01/gpu-0: XID 999"), what="Node Event"
    )
    assert event["type"] == "Warning"
    assert "gpu.example.com/xid=999:NoSchedule" in event["message"]

    async def claim_event() -> kube.Body | None:
        for found in await events_of(api, ns, kind="ResourceClaim"):
            if found.get("reason") == "DeviceUnhealthy":
                return found
        return None

    on_claim = await eventually(claim_event, what="DeviceUnhealthy on the claim using gpu-0")
    assert on_claim["involvedObject"]["name"] == "before"
    assert on_claim["message"] == event["message"]
    metrics = agent.metrics()
    assert 'dra_gpu_device_health{device="gpu-0",node="node-01",state="degraded"} 1.0' in metrics
    assert 'dra_gpu_device_faults_total{cause="xid",node="node-01"} 1.0' in metrics

    # The real kubelet heard it on the health stream and says so in the running pod's status.
    async def unhealthy_in_pod_status() -> kube.Body | None:
        body = await api.get(f"/api/v1/namespaces/{ns}/pods/before")
        return body if gpu0_health(body) == "Unhealthy" else None

    await eventually(unhealthy_in_pod_status, what="pod status: gpu-0 Unhealthy")

    # And the claim's status.devices entry of gpu-0 carries the fault.
    async def unhealthy_in_claim_status() -> kube.Body | None:
        body = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/before")
        for entry in body.get("status", {}).get("devices") or []:
            for condition in entry.get("conditions") or []:
                if condition["type"] == "Healthy" and condition["status"] == "False":
                    return dict(condition)
        return None

    condition = await eventually(
        unhealthy_in_claim_status, what="claim status: gpu-0 Healthy=False"
    )
    assert condition["reason"] == "DeviceUnhealthy"
    assert "gpu.example.com/xid=999:NoSchedule" in condition["message"]

    # A new pod that would take either GPU is given gpu-1: the scheduler honours the taint.
    await delete_pod_and_claim(api, ns, "before")
    await claim_and_pod(api, ns, "during", health_class, selector="true")
    await eventually(lambda: running(api, ns, "during"), what="pod during Running")
    assert await allocated_device(api, ns, "during") == "gpu-1"
    await delete_pod_and_claim(api, ns, "during")

    # A pod that asks for gpu-0 itself waits, and the controller says why.
    await claim_and_pod(api, ns, "after", health_class, selector=GPU_0)
    event = await eventually(
        lambda: explained(api, ns, "is tainted"), what="the controller names the taint"
    )
    since = taint["timeAdded"][11:16]
    named = f"node-01/gpu-0 is tainted gpu.example.com/xid=999:NoSchedule since {since}"
    assert named in event["message"], event["message"]
    assert event["reason"] == "DevicesTainted"

    def counted() -> bool:
        line = 'dra_gpu_tainted_devices{effect="NoSchedule",node="node-01"} 1.0'
        return line in controller.metrics()

    await eventually(counted, what="the controller counts the tainted device")

    # Recovery: after the quiet period the taint goes and gpu-0 serves again.
    (tmp_path / "faults.yaml").unlink()

    async def untainted() -> bool:
        return not await gpu0_taints(api)

    await eventually(untainted, what="gpu-0's taint cleared")
    assert await eventually(
        lambda: node_event(api, "DeviceRecovered", "node-01/gpu-0: taint"), what="Normal Event"
    )
    healthy = 'dra_gpu_device_health{device="gpu-0",node="node-01",state="healthy"} 1.0'
    assert healthy in agent.metrics()
    # The pod that waited gets gpu-0 now.
    await eventually(lambda: running(api, ns, "after"), what="pod after Running")
    assert await allocated_device(api, ns, "after") == "gpu-0"


async def test_a_fatal_fault_taints_no_execute_and_its_pod_is_evicted(
    api: kube.Kube,
    namespace: str,
    agent: AgentProcess,
    health_class: str,
    tmp_path: Path,
) -> None:
    if not await taints_served(api):
        await left_out_until_quiet(api, agent, tmp_path, "gpu-0: {lost: true}\n")
        return
    ns = namespace
    await claim_and_pod(api, ns, "victim", health_class, selector=GPU_0)
    await eventually(lambda: running(api, ns, "victim"), what="pod victim Running")
    (tmp_path / "faults.yaml").write_text("gpu-0: {lost: true}\n")
    [taint] = await eventually(lambda: gpu0_taints(api), what="gpu-0 tainted")
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "gpu.example.com/lost",
        "true",
        "NoExecute",
    )

    # kube-controller-manager's device-taint-eviction-controller (1.36+) deletes the pod.
    async def evicted() -> kube.Body | None:
        try:
            body = await api.get(f"/api/v1/namespaces/{ns}/pods/victim")
        except kube.ApiError as exc:
            return {"gone": True} if exc.not_found else None
        conditions = body["status"].get("conditions") or []
        marked = any(c.get("reason") == "DeletionByDeviceTaintManager" for c in conditions)
        return body if marked and body["metadata"].get("deletionTimestamp") else None

    await eventually(evicted, what="pod victim evicted for the NoExecute taint")
    (tmp_path / "faults.yaml").unlink()

    async def untainted() -> bool:
        return not await gpu0_taints(api)

    await eventually(untainted, what="gpu-0's taint cleared")


async def gpu0_published(api: kube.Kube) -> bool:
    listing = await api.get(
        f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER},spec.nodeName=node-01"
    )
    names = {d["name"] for b in listing["items"] for d in b["spec"].get("devices") or []}
    return "gpu-0" in names


async def left_out_until_quiet(
    api: kube.Kube, agent: AgentProcess, tmp_path: Path, fault: str
) -> None:
    """Before 1.36 the API server drops device taints: the agent notices and leaves the device
    out instead, and publishes it again once it has been quiet."""
    assert await eventually(lambda: gpu0_published(api), what="gpu-0 published")
    (tmp_path / "faults.yaml").write_text(fault)

    async def left_out() -> bool:
        return not await gpu0_published(api)

    await eventually(left_out, what="gpu-0 left out of the pool")
    assert "dropped the device taints" in agent.log_file.read_text()
    (tmp_path / "faults.yaml").unlink()
    await eventually(lambda: gpu0_published(api), what="gpu-0 published again")


async def test_a_lost_gpu_stays_tainted_while_the_other_gpu_still_prepares(
    api: kube.Kube, namespace: str, agent: AgentProcess, health_class: str, tmp_path: Path
) -> None:
    if not await taints_served(api):
        return  # the 1.35 fallback (left out of the pool) is the first tests' subject
    (tmp_path / "faults.yaml").write_text("gpu-0: {lost: true}\n")
    [taint] = await eventually(lambda: gpu0_taints(api), what="gpu-0 tainted lost")
    assert (taint["key"], taint["effect"]) == ("gpu.example.com/lost", "NoExecute")
    # The node's other GPU is published untainted and prepares a claim for any GPU.
    assert (await published_taints(api))["gpu-1"] == []
    await claim_and_pod(api, namespace, "other", health_class, selector="true")
    await eventually(lambda: running(api, namespace, "other"), what="pod other Running")
    assert await allocated_device(api, namespace, "other") == "gpu-1"
    assert await gpu0_taints(api)  # lost for as long as the file says so
    (tmp_path / "faults.yaml").unlink()  # it answers again: a reset

    async def untainted() -> bool:
        return not await gpu0_taints(api)

    await eventually(untainted, what="gpu-0's lost taint cleared once it answers")
    assert await eventually(
        lambda: node_event(api, "DeviceRecovered", "faults file is gone (simulated reset)"),
        what="the reset named in the Normal Event",
    )


async def test_a_reset_needing_xid_keeps_its_taint_past_the_quiet_period_until_cleared(
    api: kube.Kube, agent: AgentProcess, tmp_path: Path
) -> None:
    if not await taints_served(api):
        return
    # XID 95 needs a GPU reset (NVIDIA's catalog); XID 74 on gpu-1 clears once quiet.
    (tmp_path / "faults.yaml").write_text("gpu-0: {xid: 95}\ngpu-1: {xid: 74}\n")

    async def both() -> dict[str, list[kube.Body]] | None:
        found = await published_taints(api)
        return found if found.get("gpu-0") and found.get("gpu-1") else None

    taints = await eventually(both, what="gpu-0 and gpu-1 tainted")
    assert [(t["value"], t["effect"]) for t in taints["gpu-0"]] == [("95", "NoExecute")]
    assert [(t["value"], t["effect"]) for t in taints["gpu-1"]] == [("74", "NoSchedule")]
    (tmp_path / "faults.yaml").unlink()

    async def gpu1_quiet() -> dict[str, list[kube.Body]] | None:
        found = await published_taints(api)
        return found if not found.get("gpu-1") else None

    # gpu-1's taint went after the quiet period; gpu-0's, from the same moment, stays.
    after = await eventually(gpu1_quiet, what="gpu-1's taint cleared after the quiet period")
    assert [t["value"] for t in after["gpu-0"]] == ["95"]
    event = await node_event(api, "DeviceUnhealthy", "node-01/gpu-0: XID 95")
    assert event is not None
    assert "until the GPU is reset" in event["message"]
    # The operator resets the GPU and says so on the Node.
    reset_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    key = "gpu.example.com/gpu-reset.gpu-0"
    await api.patch("/api/v1/nodes/node-01", {"metadata": {"annotations": {key: reset_at}}})
    try:

        async def untainted() -> bool:
            return not await gpu0_taints(api)

        await eventually(untainted, what="gpu-0's taint cleared by the Node annotation")
        assert await eventually(
            lambda: node_event(api, "DeviceRecovered", "an operator cleared it"),
            what="the operator's clear named in the Normal Event",
        )
    finally:
        await api.patch("/api/v1/nodes/node-01", {"metadata": {"annotations": {key: None}}})


async def test_a_fault_of_a_mig_mode_gpu_taints_every_partition_of_it(
    api: kube.Kube, agent: AgentProcess, tmp_path: Path
) -> None:
    if not await taints_served(api):
        return
    partitions = {mig.partition_name_of("gpu-0", p) for p in mig.placements(mig.A100_40GB)}
    (tmp_path / "faults.yaml").write_text("gpu-0: {xid: 48}\n")

    async def all_tainted() -> dict[str, list[kube.Body]] | None:
        found = await published_taints(api)
        return found if all(found.get(name) for name in partitions) else None

    taints = await eventually(all_tainted, what="every partition of gpu-0 tainted")
    # (The whole GPU of a MIG-mode GPU may not be offered at all, as NVIDIA's driver does.)
    for name in partitions | ({"gpu-0"} & taints.keys()):
        assert [(t["key"], t["value"]) for t in taints[name]] == [("gpu.example.com/xid", "48")]
    assert taints["gpu-1"] == []
    (tmp_path / "faults.yaml").write_text("gpu-0: {recovery: gpu-reset}\n")
    await eventually(
        lambda: node_event(api, "DeviceUnhealthy", "recovery action gpu-reset"),
        what="NVML's recovery action tainted",
    )
    (tmp_path / "faults.yaml").unlink()  # the recovery action back to none: the GPU was reset

    async def clean() -> bool:
        found = await published_taints(api)
        return not any(found.get(name) for name in partitions | {"gpu-0"})

    await eventually(clean, what="the reset cleared gpu-0 and its partitions")

"""A pod that asks for a GPU the device-plugin way (``resources.limits``, no claim) gets one
through DRA: the chart's DeviceClass names the extended resource (``extendedResourceName``,
``gpu.example.com/gpu`` by default), the real scheduler creates the claim and allocates it,
the agent prepares it on the real node, and the container sees the GPU.

DRAExtendedResource is beta and on by default in Kubernetes 1.36 and GA in 1.37; on 1.35 (alpha,
off) the API server drops the class's field and the pod stays Pending as "Insufficient", which
the same test asserts there instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
import yaml

from dra_gpu import kube
from dra_gpu.testing import AgentProcess, eventually
from tests.e2e.helpers import (
    REPO,
    TUTORIAL_PROFILE,
    AgentStarter,
    Helm,
    Kubectl,
    event_with,
    gpu_env,
    server_minor,
    workload,
)

RESOURCE = "/apis/resource.k8s.io/v1"
CHART = REPO / "charts" / "dra-gpu"
EXTENDED = "gpu.example.com/gpu"


@pytest_asyncio.fixture
async def chart_class(api: kube.Kube, helm: Helm) -> AsyncIterator[kube.Body]:
    """The chart's default DeviceClass, rendered by helm with default values and created."""
    text = await helm("template", "rel", str(CHART), "--show-only", "templates/deviceclasses.yaml")
    (body,) = [d for d in yaml.safe_load_all(text) if d]
    assert body["spec"]["extendedResourceName"] == EXTENDED
    created = await api.create(f"{RESOURCE}/deviceclasses", body)
    yield created
    await api.delete(f"{RESOURCE}/deviceclasses/{body['metadata']['name']}")


@pytest_asyncio.fixture
async def agent(agent_with: AgentStarter) -> AsyncIterator[AgentProcess]:
    async with agent_with(TUTORIAL_PROFILE) as started:
        yield started


async def test_pod_with_an_extended_resource_limit_and_no_claim_runs_with_a_gpu(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    chart_class: kube.Body,
    agent: AgentProcess,
) -> None:
    ns = namespace
    container = workload("main")
    container["resources"] = {"limits": {EXTENDED: "1"}}
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "legacy"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-01"},
                "containers": [container],
                "terminationGracePeriodSeconds": 1,
            },
        },
    )

    if await server_minor(api) < 36:
        # DRAExtendedResource is off: the field is dropped, nothing backs the resource.
        assert "extendedResourceName" not in chart_class["spec"]
        event = await eventually(
            lambda: event_with(api, ns, "FailedScheduling", f"Insufficient {EXTENDED}"),
            what="the pod unschedulable for want of the extended resource",
        )
        assert event is not None
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/legacy")
        assert pod["status"].get("phase") == "Pending"
        return

    assert chart_class["spec"]["extendedResourceName"] == EXTENDED

    async def claim_name() -> str | None:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/legacy")
        status = pod["status"].get("extendedResourceClaimStatus") or {}
        return status.get("resourceClaimName")

    name = await eventually(claim_name, what="the scheduler's claim for the extended resource")
    claim = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == ("gpu.example.com", "node-01")
    assert result["device"] in ("gpu-0", "gpu-1")

    # Prepared by the agent on the real node: the container sees the device through CDI.
    env = await gpu_env(kubectl, ns, "legacy", "main")
    assert env == {"GPU_DEVICE_0": result["device"]}

    async def device_status() -> list[kube.Body]:
        body = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        entries: list[kube.Body] = body.get("status", {}).get("devices", [])
        return entries

    (entry,) = await eventually(device_status, what="status.devices written by the agent")
    assert entry["device"] == result["device"]
    assert not await event_with(api, ns, "FailedPrepareDynamicResources", "")

    # The claim belongs to the pod: deleting the pod unprepares and removes it.
    await api.delete(f"/api/v1/namespaces/{ns}/pods/legacy")

    async def claim_gone() -> bool:
        items = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
        return not items

    await eventually(claim_gone, timeout=120, what="the scheduler's claim gone with the pod")

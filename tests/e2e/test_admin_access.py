"""Admin access on a real node: a monitoring claim (``adminAccess: true``, every GPU of the
node) is allocated and prepared while a workload holds gpu-0, takes no device from anyone (a
second workload still gets gpu-1), and its container sees every GPU and that it is an
admin-access view (``DRA_GPU_ADMIN_ACCESS=true``). The API server accepts such a claim only in
a namespace labelled ``resource.kubernetes.io/admin-access: "true"``.

DRAAdminAccess is beta and on by default in Kubernetes 1.34 and 1.35 and GA from 1.36, so the
same assertions hold on every version the project supports.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent.claims import ADMIN_ACCESS_ENV
from dra_gpu.testing import AgentProcess, eventually
from tests.e2e.helpers import (
    TUTORIAL_PROFILE,
    AgentStarter,
    Kubectl,
    container_env,
    driver_class,
    event_with,
    pod_with_claim,
)

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


@pytest_asyncio.fixture
async def admin_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, "dra-gpu-test-admin") as name:
        yield name


@pytest_asyncio.fixture
async def agent(agent_with: AgentStarter) -> AsyncIterator[AgentProcess]:
    async with agent_with(TUTORIAL_PROFILE) as started:
        yield started


def claim_body(name: str, device_class: str, *, cel: str = "", admin: bool = False) -> kube.Body:
    exactly: kube.Body = {"deviceClassName": device_class}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    if admin:
        exactly.update(adminAccess=True, allocationMode="All")
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


async def results(api: kube.Kube, ns: str, claim: str) -> list[kube.Body] | None:
    body = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim}")
    allocation = (body.get("status") or {}).get("allocation") or {}
    found: list[kube.Body] | None = (allocation.get("devices") or {}).get("results")
    return found


async def running_env(kubectl: Kubectl, ns: str, pod: str) -> dict[str, str]:
    return await eventually(
        lambda: container_env(kubectl, ns, pod, "main"), what=f"pod {pod} running"
    )


async def test_monitoring_claim_sees_every_gpu_without_taking_any(
    api: kube.Kube, kubectl: Kubectl, namespace: str, admin_class: str, agent: AgentProcess
) -> None:
    ns = namespace
    claims = f"{RESOURCE}/namespaces/{ns}/resourceclaims"
    big = 'device.capacity["gpu.example.com"].memory.compareTo(quantity("24Gi")) >= 0'
    small = 'device.capacity["gpu.example.com"].memory.compareTo(quantity("24Gi")) < 0'

    # A workload holds gpu-0.
    await api.create(claims, claim_body("worker", admin_class, cel=big))
    await pod_with_claim(api, ns, "worker")
    assert (await running_env(kubectl, ns, "worker"))["GPU_DEVICE_0"] == "gpu-0"

    # Admin access needs the namespace label: the API server says so.
    with pytest.raises(kube.ApiError) as refused:
        await api.create(claims, claim_body("monitor", admin_class, admin=True))
    assert ADMIN_LABEL in str(refused.value)
    await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {ADMIN_LABEL: "true"}}})

    # The monitor gets every GPU of the node, gpu-0 included, while the worker runs.
    await api.create(claims, claim_body("monitor", admin_class, admin=True))
    await pod_with_claim(api, ns, "monitor")
    env = await running_env(kubectl, ns, "monitor")
    allocated = await results(api, ns, "monitor")
    assert allocated is not None
    assert sorted(r["device"] for r in allocated) == ["gpu-0", "gpu-1"]
    assert all(r.get("adminAccess") is True for r in allocated)
    assert sorted(v for k, v in env.items() if k.startswith("GPU_DEVICE_")) == ["gpu-0", "gpu-1"]
    assert env[ADMIN_ACCESS_ENV] == "true"
    worker = await api.get(f"/api/v1/namespaces/{ns}/pods/worker")
    assert worker["status"]["phase"] == "Running"
    # A workload's container is not told it is a monitor.
    assert ADMIN_ACCESS_ENV not in await running_env(kubectl, ns, "worker")

    async def monitor_status() -> list[kube.Body]:
        body = await api.get(f"{claims}/monitor")
        entries: list[kube.Body] = body.get("status", {}).get("devices", [])
        return entries if len(entries) == 2 else []

    entries = await eventually(monitor_status, what="status.devices of the monitor")
    assert all(e["data"]["adminAccess"] is True for e in entries)

    # The monitor took nothing: a second workload still gets gpu-1.
    await api.create(claims, claim_body("second", admin_class, cel=small))
    await pod_with_claim(api, ns, "second")
    assert (await running_env(kubectl, ns, "second"))["GPU_DEVICE_0"] == "gpu-1"
    assert not await event_with(api, ns, "FailedPrepareDynamicResources", "")

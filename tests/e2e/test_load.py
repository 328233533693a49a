"""Load: many pods with claims at once across many real nodes, more pods than GPUs.

Every pod the scheduler places must end up Running (prepared by its node's agent), every
over-subscribed one must be explained by the controller, and deleting them all must unprepare
everything: no CDI spec, checkpoint entry or status.devices entry left. The size is small in
`make test` (CI) and the issue's full size (20 nodes x 8 GPUs, 200 pods) with
``DRA_GPU_LOAD=full`` (``make reliability``). Prints the time it took; asserts no duration.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint
from dra_gpu.testing import AgentProcess, ControllerProcess, ControlPlane, NodeRuntime, eventually
from tests.e2e.helpers import events_of, gpu_nodes, workload

RESOURCE = "/apis/resource.k8s.io/v1"
FULL = os.environ.get("DRA_GPU_LOAD") == "full"
NODES = 20 if FULL else 4
GPUS = 8
PODS = 200 if FULL else 40  # more pods than the NODES * GPUS devices
CLASS = "dra-gpu-load"


@pytest_asyncio.fixture
async def load_agents(
    api: kube.Kube, control_plane: ControlPlane, node_runtime: NodeRuntime, short_path: Path
) -> AsyncIterator[list[AgentProcess]]:
    names = [f"load-{i:02d}" for i in range(NODES)]
    async with gpu_nodes(
        api, control_plane, node_runtime, short_path, names, gpus=GPUS, device_class=CLASS
    ) as (_, agents):
        yield agents


def pod(i: int) -> kube.Body:
    return {
        "metadata": {"name": f"w-{i:03d}", "labels": {"app": "load"}},
        "spec": {
            "nodeSelector": {"dra-gpu.io/pool": CLASS},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [workload(claims=["gpu"])],
        },
    }


async def test_more_pods_than_gpus_all_placed_ones_run_the_rest_are_explained_nothing_leaks(
    api: kube.Kube,
    namespace: str,
    controller: ControllerProcess,
    load_agents: list[AgentProcess],
) -> None:
    agents = load_agents
    ns = namespace
    await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
        {
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]
                    }
                }
            },
        },
    )
    started = time.perf_counter()
    await asyncio.gather(
        *(api.create(f"/api/v1/namespaces/{ns}/pods", pod(i)) for i in range(PODS))
    )

    capacity = NODES * GPUS

    async def settled() -> tuple[int, int] | None:
        pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        running = sum(p["status"].get("phase") == "Running" for p in pods)
        bound = sum(bool(p["spec"].get("nodeName")) for p in pods)
        return (running, bound) if running == bound == capacity else None

    await eventually(settled, timeout=600, interval=1, what=f"{capacity} pods Running")
    elapsed = time.perf_counter() - started

    async def explained() -> bool:
        waiting = {
            e["involvedObject"]["name"]
            for e in await events_of(api, ns)
            if e.get("reportingComponent") == "dra-gpu-controller"
        }
        return len(waiting) >= PODS - capacity

    await eventually(explained, timeout=300, interval=1, what="every waiting pod explained")
    prepared = sum(len(checkpoint.read_checkpoint(a.checkpoint_file).claims) for a in agents)
    assert prepared == capacity
    print(
        f"\nload: {PODS} pods on {NODES} nodes x {GPUS} GPUs: {capacity} Running "
        f"after {elapsed:.1f} s; {PODS - capacity} explained"
    )

    await api.request("DELETE", f"/api/v1/namespaces/{ns}/pods")

    async def all_gone() -> bool:
        return not (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]

    await eventually(all_gone, timeout=300, interval=1, what="all pods deleted (unprepared)")
    for agent in agents:
        assert checkpoint.read_checkpoint(agent.checkpoint_file).claims == {}
        assert cdi.list_claim_specs(agent.cdi_dir, "gpu.example.com") == {}

    async def no_device_status_left() -> bool:
        # status.devices entries go in the background, shortly after the unprepare.
        claims = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
        return all(not c.get("status", {}).get("devices") for c in claims)

    await eventually(no_device_status_left, timeout=120, what="no status.devices entry left")

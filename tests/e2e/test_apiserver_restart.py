"""An API server restart mid-run: the agent and the controller resume their watches on their
own (no restart of theirs), no slice is duplicated or lost, and the cluster works on.

Runs on a control plane of its own with two real nodes of its own, since it stops the API
server (the kubelets reconnect on their own too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import (
    AgentProcess,
    ControllerProcess,
    ControlPlane,
    NodeRuntime,
    RealNode,
    eventually,
    start_nodes,
)
from tests.e2e import helpers
from tests.e2e.helpers import TUTORIAL_PROFILE, workload

RESOURCE = "/apis/resource.k8s.io/v1"
NODES = ("node-01", "node-02")


@pytest.fixture(scope="module")
def own_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(workdir=tmp_path_factory.mktemp("restart-cp")) as cp:
        yield cp


@pytest_asyncio.fixture
async def world(
    own_control_plane: ControlPlane, node_runtime: NodeRuntime, short_path: Path
) -> AsyncIterator[tuple[kube.Kube, list[AgentProcess], ControllerProcess]]:
    cp = own_control_plane
    nodes = [
        RealNode(cp, name, index, short_path / name, node_runtime)
        for index, name in enumerate(NODES, start=1)
    ]
    await asyncio.to_thread(start_nodes, nodes)
    try:
        async with await kube.Kube.connect(cp.kubeconfig) as api:
            agents = [
                AgentProcess.on(
                    node,
                    cp.kubeconfig,
                    short_path / f"agent-{node.name}",
                    profile=TUTORIAL_PROFILE,
                )
                for node in nodes
            ]
            controller = ControllerProcess(
                "restart-ctl", cp.kubeconfig, short_path / "ctl", lease_seconds=4, resync_seconds=2
            )
            for process in (*agents, controller):
                await process.astart()
            try:
                yield api, agents, controller
            finally:
                for process in (*agents, controller):
                    process.stop()
    finally:
        for node in nodes:
            await asyncio.to_thread(node.stop)


async def slice_names(api: kube.Kube) -> list[str]:
    return sorted(
        s["metadata"]["name"] for s in (await api.get(f"{RESOURCE}/resourceslices"))["items"]
    )


async def test_agents_and_controller_survive_an_api_server_restart(
    own_control_plane: ControlPlane,
    world: tuple[kube.Kube, list[AgentProcess], ControllerProcess],
) -> None:
    api, agents, controller = world
    before = await eventually(lambda: _two(slice_names(api)), what="one slice per node")
    pids = [p.pid for p in (*agents, controller)]

    own_control_plane.restart_apiserver()

    # Nobody restarted; the watches came back by themselves.
    assert [p.pid for p in (*agents, controller)] == pids
    assert await eventually(lambda: _two(slice_names(api)), what="slices after restart") == before

    # Slices deleted after the restart come back: the agents' slice watches are alive again.
    await api.request("DELETE", f"{RESOURCE}/resourceslices")
    assert await eventually(lambda: _two(slice_names(api)), what="slices republished") == before

    # The controller's watches are alive too: a new pending claim is explained.
    await api.create("/api/v1/namespaces", {"metadata": {"name": "after-restart"}})
    await eventually(
        lambda: helpers.exists(api, "/api/v1/namespaces/after-restart/serviceaccounts/default"),
        what="default service account",
    )
    await api.create(
        f"{RESOURCE}/namespaces/after-restart/resourceclaims",
        {
            "metadata": {"name": "c"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "no-such-class"}}]
                }
            },
        },
    )
    await api.create(
        "/api/v1/namespaces/after-restart/pods",
        {
            "metadata": {"name": "p"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
                "containers": [workload(claims=["gpu"])],
            },
        },
    )

    async def explained() -> bool:
        listing = await api.get(
            "/api/v1/namespaces/after-restart/events",
            fieldSelector="involvedObject.kind=ResourceClaim",
        )
        return any("no-such-class does not exist" in e["message"] for e in listing["items"])

    await eventually(explained, what="the new claim explained after the restart")
    assert all(a.probe("/healthz") == 200 for a in agents)

    def metrics_converged() -> bool:
        page = controller.metrics()
        return (
            'dra_gpu_claims{state="pending"} 1.0' in page
            and 'dra_gpu_devices{node="node-01",state="published"} 2.0' in page
        )

    await eventually(metrics_converged, what="controller metrics agree with the cluster again")


async def _two(names: Awaitable[list[str]]) -> list[str] | None:
    found = await names
    return found if len(found) == len(NODES) else None

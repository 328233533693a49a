"""An API server restart mid-run: the agent and the controller resume their watches on their
own (no restart of theirs), no slice is duplicated or lost, and the cluster works on; and a
restart in the middle of a stream of pods that claim GPUs loses none of them: every pod runs,
no prepare fails, nothing stays prepared once they are gone.

Runs on a control plane of its own with two real nodes of its own, since it stops the API
server (the kubelets reconnect on their own too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from dra_gpu import DEFAULT_DRIVER_NAME, kube
from dra_gpu.agent import cdi, checkpoint
from dra_gpu.testing import (
    AgentProcess,
    ControllerProcess,
    ControlPlane,
    NodeRuntime,
    RealNode,
    eventually,
    start_nodes,
)
from tests.e2e import helpers, rollouts
from tests.e2e.helpers import workload

RESOURCE = "/apis/resource.k8s.io/v1"
NODES = ("node-01", "node-02")
GPUS = 8
"""On each node: more than the load keeps there at once (``rollouts.Load.KEEP`` and those
being deleted)."""


@pytest.fixture(scope="module")
def own_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(workdir=tmp_path_factory.mktemp("restart-cp")) as cp:
        yield cp


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``GPUS`` simulated L4s on each node."""
    device = {"memory": "24Gi", "productName": "NVIDIA L4", "cudaComputeCapability": "8.9"}
    nodes = {
        name: {"devices": [{"name": f"gpu-{i}", **device} for i in range(GPUS)]} for name in NODES
    }
    path = tmp_path_factory.mktemp("restart-profile") / "profile.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    return path


@pytest_asyncio.fixture
async def world(
    own_control_plane: ControlPlane, node_runtime: NodeRuntime, short_path: Path, profile: Path
) -> AsyncIterator[tuple[kube.Kube, list[AgentProcess], ControllerProcess, list[RealNode]]]:
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
                    profile=profile,
                )
                for node in nodes
            ]
            controller = ControllerProcess(
                "restart-ctl", cp.kubeconfig, short_path / "ctl", lease_seconds=4, resync_seconds=2
            )
            for process in (*agents, controller):
                await process.astart()
            try:
                yield api, agents, controller, nodes
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
    world: tuple[kube.Kube, list[AgentProcess], ControllerProcess, list[RealNode]],
) -> None:
    api, agents, controller, _ = world
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
            and f'dra_gpu_devices{{node="node-01",state="published"}} {GPUS}.0' in page
        )

    await eventually(metrics_converged, what="controller metrics agree with the cluster again")


async def _two(names: Awaitable[list[str]]) -> list[str] | None:
    found = await names
    return found if len(found) == len(NODES) else None


async def test_pods_claiming_gpus_through_an_api_server_restart_all_run_and_nothing_is_left(
    own_control_plane: ControlPlane,
    world: tuple[kube.Kube, list[AgentProcess], ControllerProcess, list[RealNode]],
) -> None:
    api, agents, _, nodes = world
    await eventually(lambda: _two(slice_names(api)), what="one slice per node")
    pids = [a.pid for a in agents]
    namespace = "through-restart"
    await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    await eventually(
        lambda: helpers.exists(api, f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
        what="default service account",
    )
    async with helpers.driver_class(api, "gpu-restart") as device_class:
        await rollouts.one_gpu_template(api, namespace, device_class)
        load = rollouts.Load(api, namespace, nodes)
        running = asyncio.create_task(load.run(), name="load")
        try:
            # Pods starting, running and being deleted on both nodes when the server goes.
            await eventually(lambda: len(load.ran) >= 2, timeout=120, what="the load under way")
            before, stopped = load.count, time.monotonic()
            await asyncio.to_thread(own_control_plane.restart_apiserver)
            restarted_at, outage = load.count, time.monotonic() - stopped
            await eventually(
                lambda: load.count >= restarted_at + 4 * len(nodes),
                timeout=120,
                what="pods started after the restart",
            )
        finally:
            load.stop.set()
            await running
        failed = await rollouts.failed_prepares(api, namespace)

        def nothing_left() -> bool:
            left = [what for node in nodes for what in _left_prepared(node, agents)]
            assert left == [], f"left prepared: {left}"
            return True

        await eventually(nothing_left, what="every claim unprepared once its pod is gone")
    assert load.never_ran == [], f"never ran: {load.never_ran}"
    assert load.restarts == 0
    assert failed == {}, f"the kubelet reported failed prepares: {failed}"
    assert [a.pid for a in agents] == pids  # the agents rode it out
    assert len(load.ran) == load.count > restarted_at
    print(
        f"API server restart under load: {load.count} pods ({before} before it, "
        f"{restarted_at - before} during its {outage:.1f} s, the rest after), all ran"
    )


def _left_prepared(node: RealNode, agents: list[AgentProcess]) -> list[str]:
    """What is still prepared on ``node``: its agent's checkpoint, CDI specs, the kubelet's."""
    agent = next(a for a in agents if a.node == node.name)
    left = [
        f"{node.name} agent: {uid}"
        for uid in checkpoint.read_checkpoint(agent.checkpoint_file).claims
    ]
    left += [
        f"{node.name} CDI: {uid}" for uid in cdi.list_claim_specs(node.cdi_dir, DEFAULT_DRIVER_NAME)
    ]
    left += [f"{node.name} kubelet: {uid}" for uid in node.prepared_claims()]
    return left

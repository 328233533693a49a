"""An in-place kubelet upgrade with claims prepared, on a real node (issue 29, item 6).

A node of its own runs the kubelet one minor older than the control plane (1.36.3 against the
API server's 1.37.2: within the version skew policy), with our agent; pods run with claims it
prepared. Then the node's kubelet binary is swapped for the control plane's own and restarted
(``RealNode.upgrade_kubelet``): containerd and the pods keep running, as on a real node whose
package manager upgrades the kubelet. The new kubelet must take over from the old one's DRA
checkpoint: the Node goes Ready at the new version, the pods keep their containers (no restart),
nothing is prepared twice (the kubelet's checkpoint, the agent's and its CDI specs are what they
were, untouched; a prepare the new kubelet sends anyway is answered from the agent's
checkpoint), and once the pods are deleted every claim is unprepared once and nothing is left.
Printed: the versions and the prepare calls the new kubelet made.

The older kubelet comes from ``hack/build-kubebins.sh`` (``binaries.kubebins``: its cache, or
a cold build of about 13 minutes on 2 cores). Against the oldest version the repository pins
(``make matrix`` at 1.35) there is no older one: the test then restarts the same kubelet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint
from dra_gpu.testing import (
    AgentProcess,
    ControlPlane,
    KubeletClaim,
    NodeRuntime,
    RealNode,
    eventually,
)
from tests.e2e.helpers import DRIVER, Kubectl, claim_and_pod, events_of, gone, gpu_env, gpu_nodes
from tests.support import binaries

NODE = "upgrade-01"
CLASS = "dra-gpu-kubelet-upgrade"
PODS = ("a", "b")
SETTLE = 25.0
"""Seconds the new kubelet runs before the pods are checked again: over two of its pod syncs
(``syncFrequency`` 10 s), so a prepare it was going to send has been sent."""
REGISTERED = "registered with the kubelet as"


@dataclasses.dataclass(frozen=True)
class Kubelets:
    old: Path
    old_version: str
    new: Path
    new_version: str


@pytest_asyncio.fixture(scope="session")
async def kubelets(api: kube.Kube, control_plane: ControlPlane) -> Kubelets:
    """The kubelet one minor older than the API server (as the repository pins it), built or
    found in the cache, and the control plane's own."""
    server = str((await api.get("/version"))["gitVersion"])
    new = control_plane.binary("kubelet")
    older = binaries.pinned_kubernetes(int(server.split(".")[1]) - 1)
    if older is None:
        return Kubelets(new, server, new, server)
    bin_dir = await asyncio.to_thread(binaries.kubebins, older)
    return Kubelets(bin_dir / "kubelet", older, new, server)


@pytest_asyncio.fixture
async def old_node(
    api: kube.Kube,
    control_plane: ControlPlane,
    node_runtime: NodeRuntime,
    kubelets: Kubelets,
    short_path: Path,
) -> AsyncIterator[tuple[RealNode, AgentProcess]]:
    runtime = dataclasses.replace(node_runtime, kubelet=kubelets.old)
    async with gpu_nodes(
        api, control_plane, runtime, short_path, [NODE], gpus=len(PODS), device_class=CLASS
    ) as (nodes, agents):
        yield nodes[0], agents[0]


async def kubelet_version(api: kube.Kube) -> str | None:
    """The node's kubelet version while the node is Ready."""
    status = (await api.get(f"/api/v1/nodes/{NODE}"))["status"]
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])
    return str(status["nodeInfo"]["kubeletVersion"]) if ready else None


async def container_of(api: kube.Kube, ns: str, pod: str) -> tuple[str, int] | None:
    """(container ID, restart count) of the pod's container while it runs."""
    status = (await api.get(f"/api/v1/namespaces/{ns}/pods/{pod}"))["status"]
    (container,) = status.get("containerStatuses") or [{}]
    if status.get("phase") != "Running" or "running" not in container.get("state", {}):
        return None
    return str(container["containerID"]), int(container["restartCount"])


def calls(agent: AgentProcess, metric: str) -> dict[str, float]:
    """The agent's ``metric`` (a counter of claims by result) by result."""
    found = {}
    for line in agent.metrics(metric).splitlines():
        if line.startswith(f"{metric}{{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('result="')[1].rstrip('"}')] = float(value)
    return found


@dataclasses.dataclass(frozen=True)
class PreparedState:
    """What the kubelet and the agent hold as prepared, by claim UID."""

    kubelet: Mapping[str, KubeletClaim]
    """The kubelet's DRA checkpoint."""
    agent: Mapping[str, checkpoint.PreparedClaim]
    """The agent's checkpoint."""
    specs: Mapping[str, tuple[bytes, int, int]]
    """The agent's CDI specs: content, inode and mtime (a spec written again is a new file)."""

    @classmethod
    def of(cls, node: RealNode, agent: AgentProcess) -> PreparedState:
        specs = {}
        for uid, path in cdi.list_claim_specs(agent.cdi_dir, DRIVER).items():
            stat = path.stat()
            specs[uid] = (path.read_bytes(), stat.st_ino, stat.st_mtime_ns)
        return cls(
            node.prepared_claims(), checkpoint.read_checkpoint(agent.checkpoint_file).claims, specs
        )


@pytest.mark.timeout(1800)  # a cold build of the older kubelet, ~13 min on 2 cores, first
async def test_prepared_claims_survive_an_in_place_kubelet_upgrade_and_unprepare_once(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    kubelets: Kubelets,
    old_node: tuple[RealNode, AgentProcess],
) -> None:
    node, agent = old_node
    ns = namespace
    assert await eventually(lambda: kubelet_version(api), what="the node Ready") == (
        kubelets.old_version
    )
    for pod in PODS:
        await claim_and_pod(api, ns, pod, CLASS, node=NODE)
    containers = {
        pod: await eventually(
            functools.partial(container_of, api, ns, pod), timeout=120, what=f"pod {pod} running"
        )
        for pod in PODS
    }
    devices = {pod: (await gpu_env(kubectl, ns, pod, "main"))["GPU_DEVICE_0"] for pod in PODS}
    assert sorted(devices.values()) == ["gpu-0", "gpu-1"], devices
    await eventually(
        lambda: len(node.prepared_claims()) == len(PODS) or None,
        what="both claims in the kubelet's checkpoint",
    )
    before = PreparedState.of(node, agent)
    assert len(before.agent) == len(before.specs) == len(PODS), before
    prepares = calls(agent, "dra_gpu_prepare_claims_total")
    assert prepares == {"success": len(PODS), "error": 0}, prepares
    registrations = agent.log_file.read_text().count(REGISTERED)

    # The upgrade: the new binary, the same node, containerd and pods running throughout.
    restarted = time.monotonic()
    await asyncio.to_thread(node.upgrade_kubelet, kubelets.new)

    async def upgraded() -> bool:
        assert node.running, node.diagnostics()
        return await kubelet_version(api) == kubelets.new_version

    await eventually(
        upgraded, timeout=120, interval=0.3, what=f"the node Ready at {kubelets.new_version}"
    )
    ready_after = time.monotonic() - restarted
    await eventually(
        lambda: agent.log_file.read_text().count(REGISTERED) > registrations or None,
        timeout=60,
        what="the agent registered with the new kubelet",
    )
    registered_after = time.monotonic() - restarted
    await asyncio.sleep(SETTLE)  # the new kubelet's pod syncs: no event marks them

    for pod in PODS:
        assert await container_of(api, ns, pod) == containers[pod], f"pod {pod} restarted"
        assert containers[pod][1] == 0
    assert PreparedState.of(node, agent) == before, "a claim was prepared again"
    after = calls(agent, "dra_gpu_prepare_claims_total")
    prepared_again = after["success"] + after["error"] - len(PODS)
    assert after["error"] == 0, after
    failed = [e for e in await events_of(api, ns) if e.get("reason", "").startswith("Failed")]
    assert not failed, failed

    # Deleting the pods: each claim unprepared once, through the new kubelet; nothing left.
    for pod in PODS:
        await api.delete(f"/api/v1/namespaces/{ns}/pods/{pod}")
    for pod in PODS:
        path = f"/api/v1/namespaces/{ns}/pods/{pod}"
        await eventually(
            functools.partial(gone, api, path), timeout=120, what=f"pod {pod} gone (unprepared)"
        )
    unprepares = calls(agent, "dra_gpu_unprepare_claims_total")
    assert unprepares == {"success": len(PODS), "error": 0}, unprepares
    assert node.prepared_claims() == {}, "the kubelet holds no claim"
    assert checkpoint.read_checkpoint(agent.checkpoint_file).claims == {}
    assert cdi.list_claim_specs(agent.cdi_dir, DRIVER) == {}
    print(
        f"\nkubelet upgrade on {NODE}: {kubelets.old_version} -> {kubelets.new_version} "
        f"(API server {kubelets.new_version}); Ready at the new version {ready_after:.1f}s "
        f"after the restart, the agent registered {registered_after:.1f}s after; prepare calls "
        f"after the restart: {prepared_again:.0f} (claims prepared again: 0); pod restarts: 0; "
        f"unprepare calls at the pods' deletion: {unprepares['success']:.0f}"
    )

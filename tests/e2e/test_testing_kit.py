"""The test kit itself: fake nodes the real scheduler binds to, pods the stand-in runs and
deletes, and a background cluster that starts once and stops without leaving a process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dra_gpu import kube
from dra_gpu.testing import ControlPlane, KubeletStandIn, cluster_down, cluster_up, eventually
from dra_gpu.testing._kubelet import NOT_READY_TAINT


async def test_stand_in_nodes_are_ready_untainted_and_renew_their_leases(
    api: kube.Kube, kubelet: KubeletStandIn
) -> None:
    for name in kubelet.nodes:
        node = await api.get(f"/api/v1/nodes/{name}")
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert NOT_READY_TAINT not in {t["key"] for t in node["spec"].get("taints") or []}
        assert node["status"]["allocatable"]["pods"] == "110"
        assert (kubelet.kubelet_dir(name) / "plugins_registry").is_dir()
        assert (kubelet.kubelet_dir(name) / "plugins").is_dir()
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-01"
    first = (await api.get(lease_path))["spec"]["renewTime"]

    async def renewed() -> bool:
        return bool((await api.get(lease_path))["spec"]["renewTime"] != first)

    await eventually(renewed, timeout=60, what="lease of node-01 renewed")


async def test_pod_without_claims_runs_on_its_node_and_its_deletion_completes(
    api: kube.Kube, kubelet: KubeletStandIn, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await api.create(
        pods,
        {
            "metadata": {"name": "plain"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-02"},
                "containers": [{"name": "c", "image": "registry.example/plain:1"}],
            },
        },
    )

    async def running() -> kube.Body | None:
        pod = await api.get(f"{pods}/plain")
        return pod if pod["status"].get("phase") == "Running" else None

    pod = await eventually(running, what="pod plain Running")
    assert pod["spec"]["nodeName"] == "node-02"
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert pod["status"]["containerStatuses"][0]["state"]["running"]

    await api.delete(f"{pods}/plain")  # graceful: only a kubelet can finish it

    async def gone() -> bool:
        try:
            await api.get(f"{pods}/plain")
        except kube.ApiError as exc:
            return exc.not_found
        return False

    await eventually(gone, what="pod plain deleted")


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            alive.append(pid)
    return alive


def _children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children]


async def test_cluster_up_reuses_a_running_cluster_and_cluster_down_leaves_no_process(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    state = tmp_path / "cluster"
    env = cluster_up(state, control_plane.bin_dir, ["node-01"])
    supervisor = int((state / "supervisor.pid").read_text())
    started = [supervisor, *_children(supervisor)]
    assert len(started) == 5, "supervisor, etcd, apiserver, controller-manager, scheduler"
    assert env.kubeconfig.exists()
    assert env.exports().startswith(f"export KUBECONFIG={env.kubeconfig}\n")

    assert cluster_up(state, control_plane.bin_dir, ["node-01"]) == env
    assert int((state / "supervisor.pid").read_text()) == supervisor

    async with await kube.Kube.connect(env.kubeconfig) as api:
        node = await api.get("/api/v1/nodes/node-01")
        assert node["metadata"]["name"] == "node-01"

    assert cluster_down(state)
    assert _pids_alive(started) == []
    assert not state.exists()
    assert not cluster_down(state)


async def test_control_plane_dies_with_a_killed_supervisor(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    state = tmp_path / "cluster"
    cluster_up(state, control_plane.bin_dir, ["node-01"])
    supervisor = int((state / "supervisor.pid").read_text())
    children = _children(supervisor)
    assert len(children) == 4
    os.kill(supervisor, signal.SIGKILL)
    await eventually(
        lambda: _pids_alive([supervisor, *children]) == [],
        timeout=30,
        what="control plane processes gone",
    )
    assert not cluster_down(state)

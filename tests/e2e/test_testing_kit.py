"""The test kit itself: real nodes the scheduler binds to and whose kubelets run pods, an API
server that reaches the kubelets (logs, exec) and the pods (a Service's endpoints, the proxy
subresources) through the nodes' networks as a real cluster's does, and a background cluster
(``make cluster-up``) that starts once, is reused, and leaves nothing on the host: not after
``cluster_down`` (``make cluster-down``), and not after a killed run — mounts, processes,
network interfaces and cgroups compared with what was there before. A killed run's cgroups are
empty directories the kernel cannot remove by itself; the next start of a node removes them
(``RealNode.start``)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from dra_gpu import kube
from dra_gpu.testing import (
    ControlPlane,
    NodeRuntime,
    RealNode,
    cluster_down,
    cluster_up,
    eventually,
    prometheus_of,
)
from dra_gpu.testing._node import _hierarchies, _remove_orphaned_cgroups
from tests.e2e.helpers import WORKLOAD_IMAGE, Kubectl, exists, workload

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


async def test_real_nodes_are_ready_untainted_and_renew_their_leases(
    api: kube.Kube, nodes: list[RealNode]
) -> None:
    for real in nodes:
        node = await api.get(f"/api/v1/nodes/{real.name}")
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert NOT_READY_TAINT not in {t["key"] for t in node["spec"].get("taints") or []}
        assert node["status"]["addresses"][0]["address"] == real.address
        assert (real.kubelet_dir / "plugins_registry").is_dir()
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-01"

    async def lease() -> kube.Body | None:  # created by the kubelet just after it registered
        return await api.get(lease_path) if await exists(api, lease_path) else None

    first = (await eventually(lease, what="lease of node-01"))["spec"]["renewTime"]

    async def renewed() -> bool:
        return bool((await api.get(lease_path))["spec"]["renewTime"] != first)

    await eventually(renewed, timeout=60, what="lease of node-01 renewed")


async def test_pod_without_claims_runs_on_its_node_and_its_deletion_completes(
    api: kube.Kube, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await api.create(
        pods,
        {
            "metadata": {"name": "plain"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-02"},
                "containers": [workload()],
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
    assert pod["status"]["podIP"].startswith("198.19.2."), "from node-02's pod subnet"

    await api.delete(f"{pods}/plain")  # graceful: only a kubelet can finish it

    async def gone() -> bool:
        try:
            await api.get(f"{pods}/plain")
        except kube.ApiError as exc:
            return exc.not_found
        return False

    await eventually(gone, what="pod plain deleted")


WEB_PORT = 8080
# Busybox's httpd (the workload image), serving a page that names its pod.
WEB_COMMAND = (
    'mkdir -p /www && echo "hello from $HOSTNAME" > /www/index.html && '
    f"trap 'exit 0' TERM; httpd -f -p {WEB_PORT} -h /www & wait"
)


def egress_log(control_plane: ControlPlane) -> str:
    """What the API server's egress proxy logged (one line per CONNECT)."""
    return (control_plane.logs_dir / "egress.log").read_text()


async def test_api_server_reaches_a_pod_behind_a_service_through_the_nodes_network(
    api: kube.Kube, kubectl: Kubectl, control_plane: ControlPlane, namespace: str
) -> None:
    """As webhooks behind a Service are reached (``--enable-aggregator-routing``): a ready
    endpoint's pod IP, dialled through the API server's egress into the node's network."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await api.create(
        pods,
        {
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-02"},
                "containers": [
                    {
                        "name": "web",
                        "image": WORKLOAD_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", WEB_COMMAND],
                        "ports": [{"containerPort": WEB_PORT}],
                        "readinessProbe": {
                            "httpGet": {"path": "/", "port": WEB_PORT},
                            "periodSeconds": 1,
                        },
                    }
                ],
            },
        },
    )
    await api.create(
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": WEB_PORT}]},
        },
    )
    service_proxy = f"/api/v1/namespaces/{namespace}/services/http:web:{WEB_PORT}/proxy/"

    async def served() -> str | None:
        try:
            return await kubectl("get", "--raw", service_proxy)
        except AssertionError:  # 503 until the endpoint is ready
            return None

    assert await eventually(served, what="the Service's page") == "hello from web\n"
    pod_ip = (await api.get(f"{pods}/web"))["status"]["podIP"]
    assert pod_ip.startswith("198.19.2."), "from node-02's pod subnet"
    pod_proxy = f"{pods}/http:web:{WEB_PORT}/proxy/"
    assert await kubectl("get", "--raw", pod_proxy) == "hello from web\n"
    assert f"CONNECT {pod_ip}:{WEB_PORT} -> {pod_ip}:{WEB_PORT} in node node-02 (pod)" in (
        egress_log(control_plane)
    )

    # The kubelet, as the API server dials it (the node's name), through the same proxy.
    assert await kubectl("exec", "-n", namespace, "web", "--", "cat", "/www/index.html") == (
        "hello from web\n"
    )
    await kubectl("logs", "-n", namespace, "web")
    assert "CONNECT node-02:10250 -> 192.0.2.2:10250 in node node-02 (node)" in (
        egress_log(control_plane)
    )


async def test_api_server_dial_to_an_address_nobody_routes_fails_at_once_with_the_reason(
    api: kube.Kube, kubectl: Kubectl, control_plane: ControlPlane, namespace: str
) -> None:
    """A pod no node runs, given an address of no node's (TEST-NET-3): the proxy answers 502,
    the API server 503 naming the address; nothing waits for a dial that cannot happen."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    await api.create(
        pods,
        {
            "metadata": {"name": "nowhere"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "no-such-node"},  # stays Pending
                "containers": [workload()],
            },
        },
    )
    address = "203.0.113.7"
    await api.patch(
        f"{pods}/nowhere/status",
        {"status": {"podIP": address, "podIPs": [{"ip": address}]}},
    )
    try:
        await kubectl("get", "--raw", f"{pods}/http:nowhere:80/proxy/", "--request-timeout=60s")
    except AssertionError as failed:
        message = str(failed)
    else:
        raise AssertionError("a pod at an address nobody routes answered")
    assert f"{address}:80" in message
    assert "no route to 203.0.113.7" in message, "the proxy's reason, through the API server"
    assert f"CONNECT {address}:80 refused: no route to {address}" in egress_log(control_plane)
    await api.delete(f"{pods}/nowhere", grace_period_seconds=0)


def mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def interfaces() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def cgroups_of(pid: int) -> list[Path]:
    return [p for h in _hierarchies() for p in h.glob(f"dra-gpu.{pid}.*")]


def in_pid_namespace(namespace: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def node_namespaces(state: Path) -> list[str]:
    """The PID namespaces of the cluster's nodes, read from their first processes."""
    found = []
    for unshare in Path("/proc").iterdir():
        if not unshare.name.isdigit():
            continue
        try:
            cmdline = (unshare / "cmdline").read_bytes()
            if b"_node_init.py" in cmdline and str(state).encode() in cmdline:
                found.append(os.readlink(unshare / "ns" / "pid"))
        except OSError:
            continue
    return sorted(set(found) - {os.readlink("/proc/self/ns/pid")})


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            alive.append(pid)
    return alive


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def start(state: Path, control_plane: ControlPlane, runtime: NodeRuntime) -> int:
    cluster_up(state, control_plane.bin_dir, ["node-01", "node-02"], runtime=runtime)
    return int((state / "supervisor.pid").read_text())


async def test_cluster_up_reuses_a_running_cluster_and_cluster_down_leaves_nothing(
    control_plane: ControlPlane, node_runtime: NodeRuntime, prometheus_bin: Path, tmp_path: Path
) -> None:
    before_mounts, before_links = mounts(), interfaces()
    state = tmp_path / "cluster"
    env = cluster_up(
        state,
        control_plane.bin_dir,
        ["node-01", "node-02"],
        runtime=node_runtime,
        prometheus_bin=prometheus_bin,
    )
    supervisor = int((state / "supervisor.pid").read_text())
    started = [supervisor, *_children(supervisor)]
    assert env.exports().startswith(f"export KUBECONFIG={env.kubeconfig}\n")
    assert cluster_up(state, control_plane.bin_dir, ["node-01"], runtime=None) == env, "reused"
    assert int((state / "supervisor.pid").read_text()) == supervisor
    async with await kube.Kube.connect(env.kubeconfig) as api:
        listed = await api.get("/api/v1/nodes")
        assert sorted(n["metadata"]["name"] for n in listed["items"]) == ["node-01", "node-02"]
    prometheus = prometheus_of(state)
    assert prometheus is not None, "make run's Prometheus beside the cluster"
    assert prometheus.query("vector(1)")[0]["value"][1] == "1"

    namespaces = node_namespaces(state)
    assert len(namespaces) == 2, "a PID namespace per node"
    assert cgroups_of(supervisor)
    assert cluster_down(state)
    assert _alive(started) == []
    assert all(in_pid_namespace(ns) == [] for ns in namespaces)
    assert cgroups_of(supervisor) == []
    assert mounts() == before_mounts
    assert interfaces() == before_links
    assert not state.exists()
    assert not cluster_down(state)


async def test_a_killed_run_leaves_only_cgroups_that_the_next_start_removes(
    control_plane: ControlPlane, node_runtime: NodeRuntime, tmp_path: Path
) -> None:
    before_mounts, before_links = mounts(), interfaces()
    state = tmp_path / "cluster"
    supervisor = start(state, control_plane, node_runtime)
    children = _children(supervisor)
    namespaces = node_namespaces(state)
    os.kill(supervisor, signal.SIGKILL)
    # Its control plane and nodes die with it (parent-death signal; a node's PID namespace
    # goes with its first process).
    await eventually(
        lambda: _alive(children) == [] and all(in_pid_namespace(ns) == [] for ns in namespaces),
        timeout=60,
        what="every process of the control plane and the nodes gone",
    )
    assert mounts() == before_mounts
    assert interfaces() == before_links
    assert cgroups_of(supervisor), "a killed run cannot remove its cgroups"
    _remove_orphaned_cgroups()  # what the next RealNode.start does first
    assert cgroups_of(supervisor) == []
    assert not cluster_down(state)

"""The kubelet stand-in: plays the kubelet of fake nodes against a real API server.

There is no kubelet and no container runtime on the machines we test on, so for each node this
component does what a kubelet would be seen doing from the API:

- registers the Node (labels, capacity and allocatable cpu/memory/pods, addresses, nodeInfo) and
  posts ``Ready=True`` through the ``/status`` subresource;
- renews the node's Lease in ``kube-node-lease`` every few seconds. That is what lets the real
  node-lifecycle controller remove the ``node.kubernetes.io/not-ready:NoSchedule`` taint that
  the TaintNodesByCondition admission plugin puts on every new Node, so the real scheduler binds
  pods to it; stopping the renewal (``pause_heartbeat``) makes the node go away as a dead one does;
- marks pods without resource claims that are bound to the node Running and Ready, and finishes
  the deletion of its terminating pods (only a kubelet can).

It gives each node a kubelet directory, ``<root>/<node>/plugins_registry`` and
``<root>/<node>/plugins``, where a DRA plugin registers. Pods *with* claims are left to the DRA
part of the stand-in (``_dra.py``, enabled by ``dra=DraSettings(...)``), which drives the plugin
over its real gRPC protocol and calls back here to run a prepared pod or finish a deletion.
Without it, pods with claims are never run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu import kube
from dra_gpu.testing import _dra

log = logging.getLogger(__name__)

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
LEASE_NAMESPACE = "kube-node-lease"


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One fake node: its name, extra labels and what it offers to ordinary pods."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "110"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(spec: NodeSpec, kubelet_version: str) -> kube.Body:
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "status": node_status(spec, kubelet_version)["status"],
    }


def node_status(spec: NodeSpec, kubelet_version: str) -> kube.Body:
    now = now_rfc3339()
    resources = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": spec.pods,
        "ephemeral-storage": "100Gi",
    }

    def condition(kind: str, status: str, reason: str, message: str) -> kube.Body:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet stand-in of dra-gpu's test kit is posting ready status",
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "dra-gpu kubelet stand-in",
                "kernelVersion": "",
                "containerRuntimeVersion": "fake://0",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
    }


def running_pod_status(pod: kube.Body, pod_ip: str) -> kube.Body:
    """The status a kubelet posts once every container of the pod started."""
    now = now_rfc3339()
    started = pod.get("status", {}).get("startTime") or now

    def container_status(container: kube.Body) -> kube.Body:
        return {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"fake://{pod['metadata']['uid']}/{container['name']}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }

    return {
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": started,
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "ContainersReady",
                    "Ready",
                    "PodScheduled",
                )
            ],
            "containerStatuses": [container_status(c) for c in pod["spec"].get("containers", [])],
        }
    }


def has_claims(pod: kube.Body) -> bool:
    return bool(pod.get("spec", {}).get("resourceClaims"))


class FakeNode:
    """The stand-in's state for one node: heartbeat task, pod task, kubelet directory."""

    def __init__(self, spec: NodeSpec, index: int, kubelet_dir: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.kubelet_dir = kubelet_dir
        self.heartbeat = asyncio.Event()
        self.heartbeat.set()
        self._next_ip = 2
        self._ips: dict[str, str] = {}

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_dir / "plugins"

    def pod_ip(self, uid: str) -> str:
        if uid not in self._ips:
            self._ips[uid] = f"10.244.{self.index}.{self._next_ip}"
            self._next_ip = self._next_ip + 1 if self._next_ip < 254 else 2
        return self._ips[uid]


class KubeletStandIn:
    """Fake nodes kept alive against a real API server.

    ``async with KubeletStandIn(api, ["node-01", "node-02"], root) as kubelet:`` registers the
    nodes and returns once the scheduler can bind pods to each of them.
    """

    def __init__(
        self,
        api: kube.Kube,
        nodes: Sequence[str | NodeSpec],
        root: Path,
        *,
        lease_seconds: float = 10.0,
        lease_duration_seconds: int = 40,
        ready_timeout: float = 120.0,
        dra: _dra.DraSettings | None = None,
    ) -> None:
        self.api = api
        self.root = root
        self.lease_seconds = lease_seconds
        self.lease_duration_seconds = lease_duration_seconds
        self.ready_timeout = ready_timeout
        specs = [n if isinstance(n, NodeSpec) else NodeSpec(n) for n in nodes]
        self.nodes: dict[str, FakeNode] = {
            s.name: FakeNode(s, i + 1, root / s.name) for i, s in enumerate(specs)
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._kubelet_version = ""
        # --- DRA part (see _dra.py): prepares claims before a pod runs, unprepares on deletion.
        self._dra = (
            None
            if dra is None
            else _dra.DraStandIn(
                api,
                dra,
                {name: node.kubelet_dir for name, node in self.nodes.items()},
                run_pod=self._run_pod,
                finish_deletion=self._finish_deletion,
            )
        )

    @property
    def dra(self) -> _dra.DraStandIn:
        """The DRA part: registered drivers, prepared claims, CDI edits, restarts."""
        if self._dra is None:
            raise RuntimeError("this KubeletStandIn was created without dra=DraSettings(...)")
        return self._dra

    async def __aenter__(self) -> KubeletStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def kubelet_dir(self, node: str) -> Path:
        return self.nodes[node].kubelet_dir

    async def start(self) -> None:
        version = await self.api.get("/version")
        self._kubelet_version = str(version.get("gitVersion", "v0.0.0"))
        for node in self.nodes.values():
            node.registry_dir.mkdir(parents=True, exist_ok=True)
            node.plugins_dir.mkdir(parents=True, exist_ok=True)
            await self._register(node)
            self._spawn(self._heartbeat_forever(node), f"heartbeat-{node.name}")
            self._spawn(self._pods_forever(node), f"pods-{node.name}")
        if self._dra is not None:
            await self._dra.start()
        await self.wait_schedulable()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._dra is not None:
            await self._dra.stop()

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"kubelet-standin-{name}"))

    # ---- nodes ---------------------------------------------------------------------------

    async def _register(self, node: FakeNode) -> None:
        try:
            await self.api.create("/api/v1/nodes", node_body(node.spec, self._kubelet_version))
        except kube.ApiError as exc:
            if not exc.conflict:
                raise
        # Status set on create is kept, but a re-registration (existing Node) needs /status.
        await self._post_status(node)
        await self._renew_lease(node)

    async def _post_status(self, node: FakeNode) -> None:
        await self.api.patch(
            f"/api/v1/nodes/{node.name}/status",
            node_status(node.spec, self._kubelet_version),
            "strategic",
        )

    async def _renew_lease(self, node: FakeNode) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node.name}"
        spec = {
            "holderIdentity": node.name,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "renewTime": now_micro(),
        }
        try:
            await self.api.patch(path, {"spec": spec})
        except kube.ApiError as exc:
            if not exc.not_found:
                raise
            owner = await self.api.get(f"/api/v1/nodes/{node.name}")
            await self.api.create(
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": node.name,
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Node",
                                "name": node.name,
                                "uid": owner["metadata"]["uid"],
                            }
                        ],
                    },
                    "spec": spec,
                },
            )

    async def _heartbeat_forever(self, node: FakeNode) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.lease_seconds)
            await node.heartbeat.wait()
            try:
                await self._renew_lease(node)
                beats += 1
                if beats % 6 == 0:  # a kubelet also re-posts its status now and then
                    await self._post_status(node)
            except Exception as exc:  # the API server may be restarting: keep beating
                log.warning("node %s: heartbeat failed: %s", node.name, exc)

    def pause_heartbeat(self, node: str) -> None:
        """Stop renewing the node's lease, as a node that lost power would."""
        self.nodes[node].heartbeat.clear()

    def resume_heartbeat(self, node: str) -> None:
        self.nodes[node].heartbeat.set()

    async def wait_schedulable(self) -> None:
        """Until every node is Ready and carries no not-ready taint."""
        deadline = asyncio.get_running_loop().time() + self.ready_timeout
        pending = set(self.nodes)
        while pending:
            for name in sorted(pending):
                node = await self.api.get(f"/api/v1/nodes/{name}")
                taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
                if NOT_READY_TAINT not in taints:
                    pending.discard(name)
            if not pending:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"nodes {sorted(pending)} still carry {NOT_READY_TAINT}: is "
                    "kube-controller-manager (node-lifecycle controller) running?"
                )
            await asyncio.sleep(0.5)

    # ---- pods ----------------------------------------------------------------------------

    async def _pods_forever(self, node: FakeNode) -> None:
        async for kind, obj in self.api.watch_forever(
            "/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}"
        ):
            pods = obj.get("items", []) if kind == "SYNC" else [obj]
            if self._dra is not None:  # DRA: claims of vanished pods get unprepared
                if kind == "SYNC":
                    self._dra.pods_listed(node.name, pods)
                elif kind == "DELETED":
                    self._dra.pod_deleted(node.name, obj)
            if kind == "DELETED":
                continue
            for pod in pods:
                try:
                    await self.sync_pod(node, pod)
                except Exception as exc:  # one pod must not stop the node's pod loop
                    meta = pod.get("metadata", {})
                    log.warning(
                        "node %s: pod %s/%s: %s",
                        node.name,
                        meta.get("namespace"),
                        meta.get("name"),
                        exc,
                    )

    async def sync_pod(self, node: FakeNode, pod: kube.Body) -> None:
        if self._dra is not None and has_claims(pod):
            # The DRA part prepares before the pod runs and unprepares before it is deleted;
            # it calls _run_pod / _finish_deletion itself.
            self._dra.sync_pod(node.name, pod)
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self._finish_deletion(pod)
            return
        if has_claims(pod):
            return  # without the DRA part nobody prepares claims, so the pod never runs
        if pod.get("status", {}).get("phase") == "Pending":
            await self._run_pod(node.name, pod)

    async def _run_pod(self, node: str, pod: kube.Body) -> None:
        meta = pod["metadata"]
        await self.api.patch(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            running_pod_status(pod, self.nodes[node].pod_ip(meta["uid"])),
            "strategic",
        )

    async def _finish_deletion(self, pod: kube.Body) -> None:
        meta = pod["metadata"]
        await self.api.delete(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            grace_period_seconds=0,
            uid=meta["uid"],
        )

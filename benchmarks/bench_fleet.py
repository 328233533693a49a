"""The fleet: what N node agents cost the API server as the cluster around them changes.

For each N (``--agents``, default 10, 50 and 100), on a control plane of its own (a fresh API
server: its CPU and its counters are the run's alone):

1. N kubelet-less Nodes (``fleet-000``...) and ``--other-nodes`` more (``other-00``...), all
   kept Ready by Lease renewals every 10 s as their kubelets would; N ``dra-gpu agent``
   processes, each with its own node name, state directory and kubelet directory (its sockets),
   ``--gpus`` simulated GPUs each. No kubelet runs: the benchmark makes the kubelet's plugin
   registration calls on each agent's registration socket itself (``GetInfo``, then
   ``NotifyRegistrationStatus(plugin_registered=True)``), without which the agent publishes
   nothing and is not ready (``/readyz`` answers 200 once its slices are published). Then
   ``--background-claims`` claims with pods bound to the other nodes, the cluster's other work.
2. An idle window (``--idle-seconds``): everything running, no claim changing. What it costs
   (leases, the agents' resyncs, bookmarks) is the baseline the stream's cost is measured above.
3. The stream (``--stream-seconds``): claims of the other nodes changing at ``--rate`` claim
   changes a second. A claim's life is four changes (created; allocated a device of its node
   and reserved for its pod, in one status write as the scheduler does; its ``status.devices``
   written as that node's driver would; deleted), with its pod created, bound to the node and
   deleted (with no grace period: no kubelet confirms) beside it. Meanwhile
   ``--prepare-agents`` of the agents prepare claims of their own node, ``--prepare-rate`` a
   second in all, as the kubelet does: claim allocated and reserved, pod bound to the agent's
   node, then NodePrepareResources and NodeUnprepareResources on the agent's DRA socket
   (grpcio), then both deleted. Those claims' writes count as claim changes too.
4. The API server restarted (``ControlPlane.restart_apiserver``; ``--restart`` says at which
   N), then a minute (``--after-seconds``) with the prepares going on and no stream.

Measured, per window, from ``/proc/<pid>/stat`` (utime + stime) and the API server's own
``/metrics`` (scraped as admin at the windows' edges only: the page is over 2 MB):

- API server CPU seconds per 1,000 claim changes: gross (all of the window) and marginal (the
  window minus the idle window's rate times its length);
- watch events the API server sent (``apiserver_watch_events_total``, by resource), marginal,
  per claim change; open watches (``apiserver_longrunning_requests{verb="WATCH"}``); at the end
  the growth of events per change from the smallest N to each larger one, per agent added:
  the events an agent gets for other nodes' claims and pods;
- the agents' CPU (the sum over their processes), marginal, per claim change, separately for
  the agents that prepare nothing (all they could pay for is other nodes' changes) and for
  those that prepare (per prepare); the agents' API requests from their own
  ``dra_gpu_api_requests_total`` (by verb and code), per agent per minute when idle;
- prepare and unprepare latency (the kubelet's view), p50 and p99, and errors;
- after the restart: the agents' requests in the first minute after the API server is ready
  again (their own counters; per agent that prepares nothing, and for those that prepare,
  with their claims), the API server's count of the new process's requests by verb and
  resource (``apiserver_request_total``, plus the watches still open, which it counts only
  as they end; minus its own loopback requests, ``apiserver_selfrequest_total``, and minus
  the benchmark's own, which it counts itself), relists (the agents' log lines: a watch told
  410 lists again; and LISTs at the API server), how long until every agent is ready and
  every watch the agents had is open again, and prepares that failed;
- the agents' resident memory; how long each phase took.

What is not subtracted: the control plane's own components (controller-manager, scheduler)
react to the stream too, and are part of the API server's cost in both windows alike; the
benchmark's own requests (the stream, the leases, the prepares' claims) are the API server's
work in every N alike. The machine (two cores) is shared by all of it, so a busier N makes
every process's work dearer: etcd, the controller-manager, the scheduler and the benchmark
itself do the same work per claim change at every N, and what their CPU per change grows by
is printed beside the API server's (and the machine's busy CPU, with the share of processes
not of this run). ``--freeze-quiet-agents`` is the control for that: the agents that prepare
nothing are stopped (SIGSTOP) during the idle and stream windows, their watches open and
their CPU gone. The extrapolation to 5,000 nodes is printed with its arithmetic.

Prints ``BENCH <name> <value> <unit>`` lines and tables; asserts nothing.

Run: ``.venv/bin/python benchmarks/bench_fleet.py [--agents 10,50,100]`` (``make bench-fleet``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
from stats import percentile

from dra_gpu import kube
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_gpu.testing import AgentProcess, ControlPlane
from dra_gpu.testing._control_plane import free_port

Body = dict[str, Any]
DRIVER = "gpu.example.com"
NAMESPACE = "fleet"
RESOURCE = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
HEARTBEAT_SECONDS = 10.0
"""Lease renewals, as a kubelet's (``nodeLeaseDurationSeconds`` 40, renewed every 10 s)."""
STARTING_AT_ONCE = 8
"""Agents starting at a time: the start is CPU-bound (an interpreter's imports), two cores."""
SETTLE_SECONDS = 10.0
"""After the last agent is ready, before the idle window: the starts' aftermath."""
STREAM_HOLD_SECONDS = 2.0
"""Between a stream claim's changes: about ``rate * hold / 2`` such claims exist at once."""
WATCHED = ("pods", "resourceclaims", "resourceslices", "nodes")
"""The resources whose watch events and open watches are reported."""


def agent_node(i: int) -> str:
    return f"fleet-{i:03d}"


def other_node(k: int) -> str:
    return f"other-{k:02d}"


# --- reading processes and metrics (pure, but for the file reads) -------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of a process so far (0 for one that is gone)."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is fields[0]
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far, all CPUs together (``/proc/stat``:
    everything but idle and iowait): ours and whatever else runs beside."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(found[1]) / 1024 if found else float("nan")


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, names: Iterable[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample of the metrics ``names`` in a Prometheus text page."""
    wanted = set(names)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        if name in wanted:
            yield name, dict(_LABEL.findall(labels)), float(value)


@dataclasses.dataclass(frozen=True)
class ApiServerMetrics:
    """What the benchmark reads of the API server's ``/metrics``."""

    requests: Mapping[tuple[str, str], float]
    """Finished resource requests by (verb, resource[/subresource]), the API server's own loopback
    requests (``apiserver_selfrequest_total``) taken out."""
    watch_events: Mapping[str, float]
    """``apiserver_watch_events_total`` by resource."""
    dispatched: Mapping[str, float]
    """``apiserver_watch_cache_events_dispatched_total`` by resource."""
    watches: Mapping[str, float]
    """Open watches by resource (``apiserver_longrunning_requests{verb="WATCH"}``)."""

    @classmethod
    def parse(cls, text: str) -> ApiServerMetrics:
        requests: dict[tuple[str, str], float] = collections.defaultdict(float)
        events: dict[str, float] = collections.defaultdict(float)
        dispatched: dict[str, float] = collections.defaultdict(float)
        watches: dict[str, float] = collections.defaultdict(float)
        names = (
            "apiserver_request_total",
            "apiserver_selfrequest_total",
            "apiserver_watch_events_total",
            "apiserver_watch_cache_events_dispatched_total",
            "apiserver_longrunning_requests",
        )
        for name, labels, value in samples(text, names):
            resource = labels.get("resource", "")
            if name in ("apiserver_request_total", "apiserver_selfrequest_total"):
                if not resource:
                    continue  # /healthz, /metrics, openapi: nobody's watch or claim
                sub = labels.get("subresource", "")
                key = (labels.get("verb", ""), f"{resource}/{sub}" if sub else resource)
                requests[key] += value if name == "apiserver_request_total" else -value
            elif name == "apiserver_watch_events_total":
                events[resource] += value
            elif name == "apiserver_watch_cache_events_dispatched_total":
                dispatched[resource] += value
            elif labels.get("verb") == "WATCH":
                watches[resource] += value
        return cls(dict(requests), dict(events), dict(dispatched), dict(watches))


def agent_requests(text: str) -> dict[tuple[str, str], float]:
    """An agent's ``dra_gpu_api_requests_total`` by (verb, code)."""
    counts: dict[tuple[str, str], float] = collections.defaultdict(float)
    for _, labels, value in samples(text, ["dra_gpu_api_requests_total"]):
        counts[labels.get("verb", ""), labels.get("code", "")] += value
    return counts


def minus(after: Mapping[Any, float], before: Mapping[Any, float]) -> dict[Any, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}


LOG_PATTERNS = {
    "relists (410)": re.compile(r"watch (\S+): resourceVersion gone \(410\); listing again"),
    "failed lists": re.compile(r"list (\S+) failed"),
    "broken watches": re.compile(r"watch (\S+) broke"),
    "failed publishes": re.compile(r"publishing the slices of node \S+ (failed)"),
}
"""What an agent logs as its watches break and relist (``kube.watch``) or a publication fails
(``agent.publisher``); the group is the path watched."""


def log_counts(text: str) -> dict[str, int]:
    """How often each of ``LOG_PATTERNS`` appears in an agent's log text, by path:
    ``"relists (410) /api/v1/pods"``."""
    counts: collections.Counter[str] = collections.Counter()
    for what, pattern in LOG_PATTERNS.items():
        for path in pattern.findall(text):
            counts[what if path == "failed" else f"{what} {path}"] += 1
    return dict(counts)


# --- the benchmark's own API requests, counted as the API server counts them ---------------------


class Api:
    """The benchmark's client: every call names the (verb, resource) the API server counts it
    under, so that its requests can be taken out of the API server's counts."""

    def __init__(self, kube_api: kube.Kube) -> None:
        self.kube = kube_api
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.claim_changes = 0
        """Writes to ResourceClaims (create, status, delete) that succeeded."""

    async def create(self, resource: str, path: str, body: Body) -> Body:
        self.counts["POST", resource] += 1
        created = await self.kube.create(path, body)
        self.claim_changes += resource == "resourceclaims"
        return created

    async def replace(self, resource: str, path: str, body: Body) -> Body:
        self.counts["PUT", resource] += 1
        replaced = await self.kube.replace(path, body)
        self.claim_changes += resource.startswith("resourceclaims")
        return replaced

    async def patch(self, resource: str, path: str, body: Body) -> Body:
        self.counts["PATCH", resource] += 1
        return await self.kube.patch(path, body)

    async def get(self, resource: str, path: str, **query: Any) -> Body:
        self.counts["LIST" if path.endswith(resource) else "GET", resource] += 1
        return await self.kube.get(path, **query)

    async def delete(self, resource: str, path: str) -> None:
        self.counts["DELETE", resource] += 1
        if await self.kube.delete(path, grace_period_seconds=0) is not None:
            self.claim_changes += resource == "resourceclaims"

    async def update_status(self, name: str, claim: Body, change: Callable[[Body], None]) -> Body:
        """``change`` applied to the claim's status and written; on a conflict (the
        controller-manager wrote it meanwhile) read again and applied again."""
        path = f"{CLAIMS}/{name}/status"
        for _ in range(5):
            change(claim)
            try:
                return await self.replace("resourceclaims/status", path, claim)
            except kube.ApiError as exc:
                if not exc.conflict:
                    raise
                claim = await self.get("resourceclaims", f"{CLAIMS}/{name}")
        raise RuntimeError(f"ResourceClaim {NAMESPACE}/{name}: status write kept conflicting")


def claim_body(name: str) -> Body:
    request = {"name": "gpu", "exactly": {"deviceClassName": "fleet-gpu"}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def pod_body(name: str) -> Body:
    """A pod of the claim, for a scheduler nobody runs (the benchmark binds it), tolerating
    every taint: it stays where it is bound, Pending (no kubelet runs it)."""
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "dra-gpu-fleet",
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def allocated(node: str, device: str, pod: Body) -> Callable[[Body], None]:
    def change(claim: Body) -> None:
        result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
        claim["status"] = {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [
                {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            ],
        }

    return change


def device_status(node: str, device: str) -> Callable[[Body], None]:
    """``status.devices`` as a node's driver writes it once it prepared the device."""

    def change(claim: Body) -> None:
        claim["status"]["devices"] = [
            {
                "driver": DRIVER,
                "pool": node,
                "device": device,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Prepared",
                        "message": "",
                        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    }
                ],
            }
        ]

    return change


async def allocate_and_bind(api: Api, name: str, node: str, device: str) -> Body:
    """A claim allocated ``device`` of ``node``'s pool and reserved for its pod, the pod bound
    to ``node``: what the scheduler leaves before the kubelet prepares."""
    claim = await api.create("resourceclaims", CLAIMS, claim_body(name))
    pod = await api.create("pods", PODS, pod_body(name))
    claim = await api.update_status(name, claim, allocated(node, device, pod))
    binding = {
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await api.create("pods/binding", f"{PODS}/{name}/binding", binding)
    return claim


async def remove(api: Api, name: str) -> None:
    """The claim first (nothing then un-reserves it), then its pod, at once."""
    await api.delete("resourceclaims", f"{CLAIMS}/{name}")
    await api.delete("pods", f"{PODS}/{name}")


# --- the cluster's background: nodes, leases, other nodes' claims --------------------------------


async def create_nodes(api: Api, names: list[str]) -> None:
    limit = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with limit:
            labels = {"kubernetes.io/hostname": name}
            await api.create(
                "nodes", "/api/v1/nodes", {"metadata": {"name": name, "labels": labels}}
            )
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}
            await api.patch(
                "nodes/status", f"/api/v1/nodes/{name}/status", {"status": {"conditions": [ready]}}
            )

    await asyncio.gather(*(one(n) for n in names))


async def heartbeat_forever(api: Api, nodes: list[str], paused: asyncio.Event) -> None:
    """Each node's Lease renewed every 10 s, as its kubelet would (no kubelet runs here; without
    it the node lifecycle controller would mark every node NotReady); not while ``paused``."""
    limit = asyncio.Semaphore(8)

    async def renew(node: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}
        async with limit:
            try:
                await api.patch("leases", f"{LEASES}/{node}", {"spec": spec})
            except kube.ApiError as exc:
                if not exc.not_found:
                    raise
                await api.create("leases", LEASES, {"metadata": {"name": node}, "spec": spec})

    while True:
        started = time.monotonic()
        if not paused.is_set():
            await asyncio.gather(*(renew(n) for n in nodes), return_exceptions=True)
        await asyncio.sleep(max(0.0, HEARTBEAT_SECONDS - (time.monotonic() - started)))


async def background_claims(api: Api, count: int, others: list[str], gpus: int) -> None:
    """``count`` claims allocated on the other nodes, their pods bound there: the cluster's
    standing work, which an agent that listed every claim or pod would read."""
    limit = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with limit:
            node = others[i % len(others)]
            await allocate_and_bind(api, f"b-{i}", node, f"gpu-{(i // len(others)) % gpus}")

    await asyncio.gather(*(one(i) for i in range(count)))


async def stream(api: Api, rate: float, seconds: float, others: list[str], gpus: int) -> int:
    """Other nodes' claims changing at ``rate`` claim changes a second for ``seconds``; returns
    how many claims lived (each four changes). Waits for the last one's end."""
    lives = max(1, round(rate / 4 * seconds))
    interval = seconds / lives
    failures: list[BaseException] = []

    async def life(i: int) -> None:
        node, name = others[i % len(others)], f"s-{i}"
        device = f"gpu-{(i // len(others)) % gpus}"
        try:
            claim = await allocate_and_bind(api, name, node, device)
            await asyncio.sleep(STREAM_HOLD_SECONDS)
            await api.update_status(name, claim, device_status(node, device))
            await asyncio.sleep(STREAM_HOLD_SECONDS)
            await remove(api, name)
        except (kube.ApiError, OSError, RuntimeError) as exc:
            failures.append(exc)

    tasks = []
    start = time.monotonic()
    for i in range(lives):
        await asyncio.sleep(max(0.0, start + i * interval - time.monotonic()))
        tasks.append(asyncio.create_task(life(i)))
    await asyncio.gather(*tasks)
    if failures:
        print(f"  stream: {len(failures)} claim lives failed, first: {failures[0]}")
    return lives


# --- the agents -------------------------------------------------------------------------------


class Ports:
    """Ports for the agents' health and metrics listeners, none handed out twice (a port
    ``free_port`` finds free is free until a process binds it, and a hundred start at once)."""

    def __init__(self) -> None:
        self.taken: set[int] = set()

    def take(self) -> int:
        while (port := free_port()) in self.taken:
            pass
        self.taken.add(port)
        return port


@dataclasses.dataclass
class FleetAgent:
    process: AgentProcess
    index: int
    ready_seconds: float = 0.0
    rss_ready: float = float("nan")

    @property
    def node(self) -> str:
        return self.process.node

    @property
    def registration_socket(self) -> Path:
        return self.process.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.process.kubelet_dir / "plugins" / DRIVER / "dra.sock"


async def register(agent: FleetAgent, deadline: float) -> None:
    """The kubelet's plugin registration: ``GetInfo``, then ``NotifyRegistrationStatus``."""
    while not agent.registration_socket.exists():
        if agent.process.exited or time.monotonic() > deadline:
            raise RuntimeError(f"{agent.process} opened no registration socket")
        await asyncio.sleep(0.1)
    async with grpc.aio.insecure_channel(f"unix://{agent.registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg.InfoRequest(), timeout=10)
        if info.name != DRIVER or Path(info.endpoint) != agent.dra_socket:
            raise RuntimeError(f"{agent.process}: unexpected plugin info {info}")
        registered = reg.RegistrationStatus(plugin_registered=True)
        await stub.NotifyRegistrationStatus(registered, timeout=10)


async def start_agent(agent: FleetAgent, ports: Ports, limit: asyncio.Semaphore) -> None:
    """Spawned, registered, ready (``/readyz`` 200: its slices published); a port another
    process took first means new ports and another try."""
    async with limit:
        started = time.monotonic()
        for attempt in range(3):
            agent.process.health_port, agent.process.metrics_port = ports.take(), ports.take()
            agent.process.spawn()
            deadline = time.monotonic() + 120
            try:
                await register(agent, deadline)
                while await asyncio.to_thread(agent.process.probe, "/readyz") != 200:
                    if agent.process.exited or time.monotonic() > deadline:
                        raise RuntimeError(f"{agent.process} did not become ready")
                    await asyncio.sleep(0.2)
            except (RuntimeError, grpc.aio.AioRpcError):
                log = agent.process.log_file.read_text(errors="replace")
                agent.process.kill()
                if attempt < 2 and "address already in use" in log:
                    continue
                raise RuntimeError(f"{agent.process} did not start; log:\n{log[-3000:]}") from None
            agent.ready_seconds = time.monotonic() - started
            agent.rss_ready = rss_mib(agent.process.pid)
            return


def stop_agents(agents: list[FleetAgent]) -> None:
    """SIGTERM to all at once, then wait for each."""
    for agent in agents:
        if (pid := agent.process.pid) is not None:
            os.kill(pid, signal.SIGTERM)
    for agent in agents:
        agent.process.stop()


# --- prepares, as the kubelet makes them --------------------------------------------------------


@dataclasses.dataclass
class Prepares:
    """The prepare/unprepare cycles of one window."""

    prepare: list[float] = dataclasses.field(default_factory=list)
    unprepare: list[float] = dataclasses.field(default_factory=list)
    failed: int = 0
    """Claims the agent answered with an error, or an RPC that failed."""
    setup_failed: int = 0
    """Cycles whose claim or pod the benchmark could not write (no prepare was made)."""
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def done(self) -> int:
        return len(self.prepare)


class Preparer:
    """Prepare cycles on a few agents, round robin, ``rate`` a second in all."""

    def __init__(self, api: Api, agents: list[FleetAgent], gpus: int) -> None:
        self.api = api
        self.agents = agents
        self.gpus = gpus
        self.channels = {
            a.index: grpc.aio.insecure_channel(f"unix://{a.dra_socket}") for a in agents
        }
        self.locks = {a.index: asyncio.Lock() for a in agents}
        self.claims: collections.Counter[int] = collections.Counter()
        """Claims prepared (or tried) by agent index, all windows."""
        self.serial = 0

    async def aclose(self) -> None:
        for channel in self.channels.values():
            await channel.close()

    async def cycle(self, agent: FleetAgent, into: Prepares) -> None:
        async with self.locks[agent.index]:
            self.serial += 1
            name = f"p-{self.serial}"
            device = f"gpu-{self.claims[agent.index] % self.gpus}"
            self.claims[agent.index] += 1
            try:
                claim = await allocate_and_bind(self.api, name, agent.node, device)
            except (kube.ApiError, OSError, RuntimeError) as exc:
                into.setup_failed += 1
                into.errors.append(f"setup {name}: {exc}")
                return
            ref = v1.Claim(namespace=NAMESPACE, name=name, uid=claim["metadata"]["uid"])
            stub = v1_grpc.DRAPluginStub(self.channels[agent.index])
            try:
                t0 = time.perf_counter()
                prepared = await stub.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=[ref]), timeout=60
                )
                t1 = time.perf_counter()
                unprepared = await stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[ref]), timeout=60
                )
                t2 = time.perf_counter()
            except grpc.aio.AioRpcError as exc:
                into.failed += 1
                into.errors.append(f"{agent.node} {name}: {exc.code()} {exc.details()}")
            else:
                errors = [
                    e
                    for e in (prepared.claims[ref.uid].error, unprepared.claims[ref.uid].error)
                    if e
                ]
                if errors:
                    into.failed += 1
                    into.errors.append(f"{agent.node} {name}: {errors[0]}")
                else:
                    into.prepare.append(t1 - t0)
                    into.unprepare.append(t2 - t1)
            try:
                await remove(self.api, name)
            except (kube.ApiError, OSError) as exc:
                into.errors.append(f"remove {name}: {exc}")

    async def run(self, rate: float, stop: asyncio.Event) -> Prepares:
        """Cycles started at ``rate`` a second until ``stop``; returns once all ended."""
        result = Prepares()
        tasks: list[asyncio.Task[None]] = []
        start, i = time.monotonic(), 0
        while not stop.is_set():
            agent = self.agents[i % len(self.agents)]
            tasks.append(asyncio.create_task(self.cycle(agent, result)))
            i += 1
            delay = start + i / rate - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, delay))
        await asyncio.gather(*tasks)
        return result


# --- snapshots and windows --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    at: float
    cpu: Mapping[str, float]
    """CPU seconds so far: each control plane component, ``bench``, and each agent by index."""
    apiserver: ApiServerMetrics
    agent_requests: Mapping[int, Mapping[tuple[str, str], float]]
    bench_requests: Mapping[tuple[str, str], float]
    claim_changes: int


MACHINE = "(machine)"
"""``Fleet.cpu``'s key for the whole machine's busy CPU seconds."""


class Fleet:
    def __init__(self, cp: ControlPlane, api: Api, agents: list[FleetAgent]) -> None:
        self.cp = cp
        self.api = api
        self.agents = agents
        self.frozen: set[int] = set()
        """Agents stopped with SIGSTOP (``--freeze-quiet-agents``): their metrics are not read."""

    def cpu(self) -> dict[str, float]:
        found = {name: cpu_seconds(pid) for name, pid in self.cp.pids().items()}
        found["bench"] = time.process_time()
        for agent in self.agents:
            found[f"agent-{agent.index}"] = cpu_seconds(agent.process.pid)
        found[MACHINE] = machine_busy_seconds()
        return found

    async def agent_requests(self) -> dict[int, dict[tuple[str, str], float]]:
        async def one(agent: FleetAgent) -> tuple[int, dict[tuple[str, str], float]]:
            if agent.index in self.frozen:
                return agent.index, {}
            try:
                text = await asyncio.to_thread(agent.process.metrics, "dra_gpu_api_requests_total")
            except OSError:
                return agent.index, {}
            return agent.index, agent_requests(text)

        return dict(await asyncio.gather(*(one(a) for a in self.agents)))

    async def apiserver(self) -> ApiServerMetrics:
        return ApiServerMetrics.parse(await asyncio.to_thread(self.cp.apiserver_metrics))

    async def snapshot(self) -> Snapshot:
        cpu = self.cpu()
        bench, changes = dict(self.api.counts), self.api.claim_changes
        apiserver, agents = await asyncio.gather(self.apiserver(), self.agent_requests())
        return Snapshot(time.monotonic(), cpu, apiserver, agents, bench, changes)


@dataclasses.dataclass(frozen=True)
class Window:
    start: Snapshot
    end: Snapshot

    @property
    def seconds(self) -> float:
        return self.end.at - self.start.at

    @property
    def claim_changes(self) -> int:
        return self.end.claim_changes - self.start.claim_changes

    def cpu(self, *names: str) -> float:
        return sum(self.end.cpu.get(n, 0.0) - self.start.cpu.get(n, 0.0) for n in names)

    def ours(self) -> float:
        """CPU seconds of every process of the run: control plane, agents, benchmark."""
        return self.cpu(*(k for k in self.end.cpu if k != MACHINE))

    def apiserver_requests(self) -> dict[tuple[str, str], float]:
        """What the API server counted, less what the benchmark sent."""
        bench = minus(self.end.bench_requests, self.start.bench_requests)
        counted = minus(self.end.apiserver.requests, self.start.apiserver.requests)
        return {k: v - bench.get(k, 0.0) for k, v in counted.items()}

    def agents_cpu(self, indexes: Iterable[int]) -> float:
        return self.cpu(*(f"agent-{i}" for i in indexes))

    def watch_events(self) -> dict[str, float]:
        return minus(self.end.apiserver.watch_events, self.start.apiserver.watch_events)

    def agent_requests(self, indexes: Iterable[int]) -> dict[tuple[str, str], float]:
        total: dict[tuple[str, str], float] = collections.defaultdict(float)
        for i in indexes:
            before = self.start.agent_requests.get(i, {})
            for key, value in minus(self.end.agent_requests.get(i, {}), before).items():
                total[key] += value
        return total


def above_idle(amount: float, seconds: float, idle_amount: float, idle_seconds: float) -> float:
    """An amount over ``seconds`` less the idle rate over as long."""
    return amount - idle_amount / idle_seconds * seconds


# --- one N --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    n: int
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    numbers: dict[str, float] = dataclasses.field(default_factory=dict)
    """Measured values by BENCH name (without the ``_n<N>`` suffix) and unit."""
    units: dict[str, str] = dataclasses.field(default_factory=dict)
    events_per_change: dict[str, float] = dataclasses.field(default_factory=dict)
    watches: dict[str, float] = dataclasses.field(default_factory=dict)
    restart_requests: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    restart_logs: dict[str, int] = dataclasses.field(default_factory=dict)
    restart_agent_requests: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    idle_requests: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    """The API server's requests of the agents' kinds a minute per agent in the idle window,
    the benchmark's own taken out."""
    load_average: str = ""
    """The machine's at the end of the stream."""
    timeline: list[tuple[float, str, str, float]] = dataclasses.field(default_factory=list)
    """One quiet agent's requests around the restart: (seconds after the API server was ready
    again, verb, code, how many)."""
    errors: list[str] = dataclasses.field(default_factory=list)

    def put(self, name: str, value: float, unit: str) -> None:
        self.numbers[name] = value
        self.units[name] = unit
        print(f"BENCH fleet_{name}_n{self.n} {value:.6g} {unit}")


async def run_n(cp: ControlPlane, n: int, args: argparse.Namespace, work: Path) -> Result:
    result = Result(n)
    clock = time.monotonic()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        result.phases[name] = now - clock
        print(f"  [{n} agents] {name}: {now - clock:.1f} s", flush=True)
        clock = now

    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=16))
    nodes = [agent_node(i) for i in range(n)]
    others = [other_node(k) for k in range(args.other_nodes)]
    profile = work / "profile.yaml"
    devices = [{"count": args.gpus, "memory": "80Gi"}]
    profile.write_text(json.dumps({"nodes": {name: {"devices": devices} for name in nodes}}))
    async with await kube.Kube.connect(cp.kubeconfig) as kube_api:
        api = Api(kube_api)
        await api.create("namespaces", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        await create_nodes(api, nodes + others)
        paused = asyncio.Event()
        heartbeats = asyncio.create_task(heartbeat_forever(api, nodes + others, paused))
        await asyncio.to_thread(cp.wait_for_service_account, "default", NAMESPACE)
        phase("nodes created")
        agents = [
            FleetAgent(
                AgentProcess(
                    name,
                    cp.kubeconfig,
                    work / f"a{i}" / "kubelet",
                    work / f"a{i}" / "state",
                    profile=profile,
                ),
                i,
            )
            for i, name in enumerate(nodes)
        ]
        fleet = Fleet(cp, api, agents)
        ports, limit = Ports(), asyncio.Semaphore(STARTING_AT_ONCE)
        try:
            await asyncio.gather(*(start_agent(a, ports, limit) for a in agents))
            phase("agents started and ready")
            slices = await api.get("resourceslices", f"{RESOURCE}/resourceslices")
            published = {s["spec"]["nodeName"] for s in slices.get("items", [])}
            missing = sorted(set(nodes) - published)
            if missing:
                result.errors.append(f"no ResourceSlice for {missing}")
            await background_claims(api, args.background_claims, others, args.gpus)
            await asyncio.sleep(SETTLE_SECONDS)
            phase("background claims and settling")
            preparing = agents[: args.prepare_agents]
            preparer = Preparer(api, preparing, args.gpus)
            try:
                await measure(fleet, preparer, args, result, others, phase, paused)
            finally:
                await preparer.aclose()
            rss = [rss_mib(a.process.pid) for a in agents]
            result.put("agent_rss_mean", sum(rss) / len(rss), "MiB")
            result.put("agent_rss_max", max(rss), "MiB")
            result.put("agents_rss_total", sum(rss), "MiB")
            ready = [a.rss_ready for a in agents]
            result.put("agent_rss_ready_mean", sum(ready) / len(ready), "MiB")
            starts = [a.ready_seconds for a in agents]
            result.put("agent_start_to_ready_p50", percentile(starts, 50), "s")
            exited = [a.node for a in agents if a.process.exited]
            result.put("agents_exited", len(exited), "agents")
            if exited:
                result.errors.append(f"agents exited during the run: {exited}")
        finally:
            heartbeats.cancel()
            await asyncio.to_thread(stop_agents, agents)
            phase("agents stopped")
    result.put("run_seconds", sum(result.phases.values()), "s")
    return result


async def measure(
    fleet: Fleet,
    preparer: Preparer,
    args: argparse.Namespace,
    result: Result,
    others: list[str],
    phase: Callable[[str], None],
    paused: asyncio.Event,
) -> None:
    n, agents = result.n, fleet.agents
    quiet = [a.index for a in agents[args.prepare_agents :]]
    busy = [a.index for a in agents[: args.prepare_agents]]

    frozen = agents[args.prepare_agents :] if args.freeze_quiet_agents else []
    for agent in frozen:  # a control: their watches stay open, their CPU is gone
        os.kill(agent.process.pid or 0, signal.SIGSTOP)
        fleet.frozen.add(agent.index)

    # Idle: the baseline.
    start = await fleet.snapshot()
    await asyncio.sleep(args.idle_seconds)
    idle = Window(start, await fleet.snapshot())
    phase("idle window")

    # The stream, with prepares on the agents' own nodes.
    start = await fleet.snapshot()
    stop = asyncio.Event()
    preparing = asyncio.create_task(preparer.run(args.prepare_rate, stop))
    lives = await stream(fleet.api, args.rate, args.stream_seconds, others, args.gpus)
    stop.set()
    prepares = await preparing
    during = Window(start, await fleet.snapshot())
    phase("stream window")
    for agent in frozen:
        os.kill(agent.process.pid or 0, signal.SIGCONT)
    fleet.frozen.clear()

    changes = during.claim_changes
    s, i = during.seconds, idle.seconds
    result.put("stream_claim_changes", changes, "changes")
    result.put("stream_claim_changes_per_second", changes / s, "changes/s")
    result.put("stream_claim_lives", lives, "claims")
    result.put("stream_prepares", prepares.done, "claims")
    for name, component in (
        ("apiserver", "kube-apiserver"),
        ("etcd", "etcd"),
        ("controller_manager", "kube-controller-manager"),
        ("scheduler", "kube-scheduler"),
    ):
        gross = during.cpu(component)
        net = above_idle(gross, s, idle.cpu(component), i)
        result.put(f"{name}_cpu_idle", idle.cpu(component) / i, "cpu-s/s")
        result.put(f"{name}_cpu_per_1000_changes", gross / changes * 1000, "cpu-s")
        result.put(f"{name}_cpu_per_1000_changes_above_idle", net / changes * 1000, "cpu-s")
    result.put("bench_cpu_per_1000_changes", during.cpu("bench") / changes * 1000, "cpu-s")
    for when, window in (("idle", idle), ("stream", during)):
        cores = window.cpu(MACHINE) / window.seconds
        result.put(f"machine_busy_{when}", cores, "cores")
        result.put(f"machine_others_{when}", cores - window.ours() / window.seconds, "cores")
    result.load_average = f"{os.getloadavg()[0]:.1f}"
    result.idle_requests = {
        k: v / i * 60 / n for k, v in idle.apiserver_requests().items() if k[1] in AGENT_RESOURCES
    }
    events_during, events_idle = during.watch_events(), idle.watch_events()
    for resource in WATCHED:
        net = above_idle(events_during.get(resource, 0.0), s, events_idle.get(resource, 0.0), i)
        result.events_per_change[resource] = net / changes
        result.put(f"watch_events_{resource}_per_change_above_idle", net / changes, "events")
        result.put(
            f"watch_events_{resource}_idle_per_second", events_idle.get(resource, 0) / i, "events/s"
        )
    result.watches = {r: during.end.apiserver.watches.get(r, 0.0) for r in WATCHED}
    for resource in WATCHED:
        result.put(f"open_watches_{resource}", result.watches[resource], "watches")
    idle_quiet = idle.agents_cpu(quiet)
    if quiet:
        net = above_idle(during.agents_cpu(quiet), s, idle_quiet, i)
        result.put("quiet_agent_cpu_idle", idle_quiet / i / len(quiet) * 1000, "cpu-ms/s/agent")
        result.put("quiet_agents_cpu_per_change", net / changes * 1000, "cpu-ms")
        result.put("quiet_agent_cpu_per_change", net / changes / len(quiet) * 1e6, "cpu-us/agent")
        requests = sum(idle.agent_requests(quiet).values())
        result.put(
            "quiet_agent_requests_idle_per_minute", requests / len(quiet) / i * 60, "requests"
        )
        during_requests = sum(during.agent_requests(quiet).values())
        net_requests = above_idle(during_requests, s, requests, i)
        result.put(
            "quiet_agents_requests_per_change_above_idle", net_requests / changes, "requests"
        )
    if busy and prepares.done:
        net = above_idle(during.agents_cpu(busy), s, idle.agents_cpu(busy), i)
        result.put("preparing_agent_cpu_per_prepare", net / prepares.done * 1000, "cpu-ms")
        busy_requests = above_idle(
            sum(during.agent_requests(busy).values()), s, sum(idle.agent_requests(busy).values()), i
        )
        result.put(
            "preparing_agent_requests_per_prepare", busy_requests / prepares.done, "requests"
        )
    report_prepares(result, "stream", prepares)

    if args.restart == "none" or (args.restart == "largest" and n != max(args.agents)):
        return
    await restart(fleet, preparer, args, result, quiet, busy, phase, paused)


def report_prepares(result: Result, when: str, prepares: Prepares) -> None:
    if prepares.prepare:
        for what, times in (("prepare", prepares.prepare), ("unprepare", prepares.unprepare)):
            result.put(f"{when}_{what}_p50", percentile(times, 50) * 1000, "ms")
            result.put(f"{when}_{what}_p99", percentile(times, 99) * 1000, "ms")
    result.put(f"{when}_prepares_failed", prepares.failed, "claims")
    result.put(f"{when}_prepare_setups_failed", prepares.setup_failed, "claims")
    result.errors.extend(f"{when}: {e}" for e in prepares.errors[:5])


async def restart(
    fleet: Fleet,
    preparer: Preparer,
    args: argparse.Namespace,
    result: Result,
    quiet: list[int],
    busy: list[int],
    phase: Callable[[str], None],
    paused: asyncio.Event,
) -> None:
    agents = fleet.agents
    before_watches = (await fleet.apiserver()).watches
    offsets = {a.index: a.process.log_file.stat().st_size for a in agents}
    paused.set()  # the leases wait: the benchmark's own requests stay countable
    stopped = await fleet.snapshot()
    t_restart = time.monotonic()
    watched = agents[-1]  # a quiet one: its requests, second by second
    timeline: list[tuple[float, str, str, float]] = []
    following = asyncio.create_task(follow(watched, timeline))
    await asyncio.to_thread(fleet.cp.restart_apiserver)
    t_back = time.monotonic()
    paused.clear()
    phase("API server restart (stopped, started, ready)")
    result.put("apiserver_down", t_back - t_restart, "s")
    at_back = Snapshot(
        t_back,
        fleet.cpu(),
        stopped.apiserver,
        await fleet.agent_requests(),
        dict(fleet.api.counts),
        0,
    )
    stop = asyncio.Event()
    preparing = asyncio.create_task(preparer.run(args.prepare_rate, stop))

    # Every agent ready (/readyz), and every watch of pods and slices that was open before
    # open again (the API server's gauge: the agents' two each, and the control plane's own).
    async def all_ready() -> bool:
        probes = (asyncio.to_thread(a.process.probe, "/readyz") for a in agents)
        return all(code == 200 for code in await asyncio.gather(*probes))

    ready_at = watches_at = float("nan")
    deadline = t_back + args.after_seconds
    while time.monotonic() < deadline and (ready_at != ready_at or watches_at != watches_at):
        if ready_at != ready_at and await all_ready():
            ready_at = time.monotonic() - t_back
        if watches_at != watches_at:
            now = (await fleet.apiserver()).watches
            if all(now.get(r, 0) >= before_watches.get(r, 0) for r in ("pods", "resourceslices")):
                watches_at = time.monotonic() - t_back
        await asyncio.sleep(2.0)
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    end_bench = dict(fleet.api.counts)
    apiserver, agent_counts = await asyncio.gather(fleet.apiserver(), fleet.agent_requests())
    end = Snapshot(time.monotonic(), fleet.cpu(), apiserver, agent_counts, end_bench, 0)
    stop.set()
    following.cancel()
    prepares = await preparing
    phase("the minute after the restart")
    after, down = Window(at_back, end), Window(stopped, at_back)
    result.timeline = [(t - t_back, verb, code, n) for t, verb, code, n in timeline]
    result.put("restart_all_agents_ready_after", ready_at, "s")
    result.put("restart_all_watches_back_after", watches_at, "s")

    # What the new API server counted (its counters start at 0), watches still open included
    # (it counts a request as it ends), less the benchmark's own requests since it is back
    # (the leases waited while it was away, and no prepare was started).
    own = minus(end_bench, at_back.bench_requests)
    counted: dict[tuple[str, str], float] = collections.defaultdict(float, apiserver.requests)
    for resource, open_now in apiserver.watches.items():
        counted["WATCH", resource] += open_now
    external = {k: v - own.get(k, 0.0) for k, v in counted.items()}
    result.restart_requests = {k: v for k, v in external.items() if abs(v) >= 1}
    total = sum(external.values())
    result.put("restart_apiserver_requests_first_minute", total, "requests")
    agents_part = sum(v for (_, r), v in external.items() if r in AGENT_RESOURCES)
    result.put("restart_apiserver_requests_agent_resources", agents_part, "requests")
    for resource in ("pods", "resourceslices"):
        result.put(
            f"restart_apiserver_lists_{resource}", external.get(("LIST", resource), 0), "requests"
        )
    result.restart_agent_requests = dict(after.agent_requests(quiet + busy))
    if quiet:
        per_agent = [sum(after.agent_requests([i]).values()) for i in quiet]
        result.put("restart_quiet_agent_requests_mean", sum(per_agent) / len(quiet), "requests")
        result.put("restart_quiet_agent_requests_max", max(per_agent), "requests")
    if busy:
        busy_total = sum(after.agent_requests(busy).values())
        result.put("restart_preparing_agents_requests", busy_total, "requests")
        result.put("restart_preparing_agents_claims", prepares.done + prepares.failed, "claims")
    while_down = down.agent_requests(quiet + busy)
    unanswered = sum(v for (_, code), v in while_down.items() if code == kube.NO_ANSWER)
    result.put("restart_agents_requests_unanswered_while_down", unanswered, "requests")
    answered = sum(while_down.values()) - unanswered
    result.put("restart_agents_requests_answered_before_ready", answered, "requests")
    logs: collections.Counter[str] = collections.Counter()
    for agent in agents:
        with agent.process.log_file.open("rb") as log:
            log.seek(offsets[agent.index])
            logs.update(log_counts(log.read().decode(errors="replace")))
    result.restart_logs = dict(logs)
    for what, count in sorted(logs.items()):
        name = re.sub(r"[^a-z0-9]+", "_", what.replace("/api/v1/", "").replace(RESOURCE, ""))
        result.put(f"restart_agent_log_{name.strip('_')}", count, "lines")
    report_prepares(result, "after_restart", prepares)


AGENT_RESOURCES = ("pods", "resourceslices", "resourceclaims", "resourceclaims/status", "nodes")
"""What an agent reads and writes (and Events, which it posts only on a fault or conflict)."""


async def follow(agent: FleetAgent, into: list[tuple[float, str, str, float]]) -> None:
    """``agent``'s requests as they happen: its counters read every second, (time, verb, code,
    how many) for each that moved."""
    last: Mapping[tuple[str, str], float] = {}
    while True:
        try:
            now = agent_requests(
                await asyncio.to_thread(agent.process.metrics, "dra_gpu_api_requests_total")
            )
        except OSError:
            now = dict(last)
        for (verb, code), moved in sorted(minus(now, last).items()):
            if moved and last:
                into.append((time.monotonic(), verb, code, moved))
        last = now
        await asyncio.sleep(1.0)


# --- the report ---------------------------------------------------------------------------------


def table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if k == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.{digits}f}"


def summary(results: list[Result]) -> None:
    def one(name: str, digits: int) -> Callable[[Result], str]:
        return lambda r: fmt(r.numbers.get(name), digits)

    def two(first: str, second: str, digits: int) -> Callable[[Result], str]:
        return lambda r: f"{one(first, digits)(r)} / {one(second, digits)(r)}"

    lines: list[tuple[str, Callable[[Result], str]]] = [
        ("agent start to ready, p50 (s)", one("agent_start_to_ready_p50", 1)),
        ("agent RSS mean / max (MiB)", two("agent_rss_mean", "agent_rss_max", 1)),
        ("claim changes a second, stream", one("stream_claim_changes_per_second", 1)),
        ("API server CPU / 1,000 changes, gross (s)", one("apiserver_cpu_per_1000_changes", 2)),
        (
            "API server CPU / 1,000 changes, above idle (s)",
            one("apiserver_cpu_per_1000_changes_above_idle", 2),
        ),
        ("API server CPU, idle (cores)", one("apiserver_cpu_idle", 3)),
        (
            "machine busy, idle / stream (cores of 2)",
            two("machine_busy_idle", "machine_busy_stream", 2),
        ),
        (
            "of which not this run's, idle / stream",
            two("machine_others_idle", "machine_others_stream", 2),
        ),
        ("load average, end of the stream", lambda r: r.load_average),
        (
            "etcd CPU / 1,000 changes, above idle (s)",
            one("etcd_cpu_per_1000_changes_above_idle", 2),
        ),
        (
            "controller-manager CPU / 1,000 changes, above idle (s)",
            one("controller_manager_cpu_per_1000_changes_above_idle", 2),
        ),
        (
            "scheduler CPU / 1,000 changes, above idle (s)",
            one("scheduler_cpu_per_1000_changes_above_idle", 2),
        ),
        ("benchmark CPU / 1,000 changes (s)", one("bench_cpu_per_1000_changes", 2)),
        ("watch events / change: pods", one("watch_events_pods_per_change_above_idle", 3)),
        (
            "watch events / change: resourceclaims",
            one("watch_events_resourceclaims_per_change_above_idle", 3),
        ),
        (
            "watch events / change: resourceslices",
            one("watch_events_resourceslices_per_change_above_idle", 3),
        ),
        (
            "open watches: pods / claims / slices",
            lambda r: " / ".join(
                fmt(r.watches.get(x), 0) for x in ("pods", "resourceclaims", "resourceslices")
            ),
        ),
        ("quiet agents' CPU / change, all (ms)", one("quiet_agents_cpu_per_change", 3)),
        ("quiet agent CPU, idle (ms a second)", one("quiet_agent_cpu_idle", 2)),
        ("quiet agent requests a minute, idle", one("quiet_agent_requests_idle_per_minute", 2)),
        ("quiet agents' requests / change", one("quiet_agents_requests_per_change_above_idle", 3)),
        ("preparing agent CPU / prepare (ms)", one("preparing_agent_cpu_per_prepare", 1)),
        ("preparing agent requests / prepare", one("preparing_agent_requests_per_prepare", 2)),
        ("prepare p50 / p99, stream (ms)", two("stream_prepare_p50", "stream_prepare_p99", 1)),
        ("prepares failed, stream", one("stream_prepares_failed", 0)),
        ("restart: API server away (s)", one("apiserver_down", 1)),
        ("restart: every agent ready after (s)", one("restart_all_agents_ready_after", 1)),
        ("restart: every watch back after (s)", one("restart_all_watches_back_after", 1)),
        (
            "restart: quiet agent requests, 1st min (mean / max)",
            two("restart_quiet_agent_requests_mean", "restart_quiet_agent_requests_max", 1),
        ),
        (
            "restart: preparing agents' requests / claims",
            two("restart_preparing_agents_requests", "restart_preparing_agents_claims", 0),
        ),
        (
            "restart: agents' requests answered before ready",
            one("restart_agents_requests_answered_before_ready", 0),
        ),
        ("restart: relists (agents' logs, 410)", lambda r: fmt(relists(r), 0)),
        (
            "restart: LISTs of pods / slices (API server)",
            two("restart_apiserver_lists_pods", "restart_apiserver_lists_resourceslices", 0),
        ),
        (
            "restart: API server requests, 1st min, agents' kinds",
            one("restart_apiserver_requests_agent_resources", 0),
        ),
        (
            "restart: prepare p50 / p99 (ms)",
            two("after_restart_prepare_p50", "after_restart_prepare_p99", 1),
        ),
        ("restart: prepares failed", one("after_restart_prepares_failed", 0)),
    ]
    print("\nFleet: per N agents")
    table(
        [("measure", *(f"N={r.n}" for r in results))]
        + [(label, *map(cell, results)) for label, cell in lines]
    )
    for r in results:
        print(f"\nN={r.n}: phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.phases.items()))
        print(
            f"N={r.n}: idle, the API server's requests of the agents' kinds a minute per agent: "
            + ", ".join(
                f"{verb} {resource} {v:.2f}"
                for (verb, resource), v in sorted(r.idle_requests.items(), key=lambda kv: -kv[1])
                if abs(v) >= 0.01
            )
        )
        if r.restart_requests:
            print(
                f"N={r.n}: the new API server's requests in its first minute, by verb and resource "
                "(the benchmark's own taken out; watches still open included):"
            )
            rest = 0.0
            for (verb, resource), count in sorted(
                r.restart_requests.items(), key=lambda kv: -kv[1]
            ):
                if resource in AGENT_RESOURCES or resource == "leases":
                    print(f"  {verb:<7} {resource:<24} {count:8.0f}")
                else:
                    rest += count
            print(f"  {'(the rest: the control plane itself)':<32} {rest:8.0f}")
            print(
                f"N={r.n}: the agents' own count, first minute after the restart, by verb and code:"
            )
            for (verb, code), count in sorted(r.restart_agent_requests.items()):
                if count:
                    print(f"  {verb:<7} {code:<8} {count:8.0f}")
            print(f"N={r.n}: agents' log lines after the restart: {r.restart_logs}")
            print(f"N={r.n}: one quiet agent's requests (seconds after the API server was ready):")
            print(
                "  "
                + ", ".join(f"{t:+.0f}s {verb} {code} x{n:.0f}" for t, verb, code, n in r.timeline)
            )
        for e in r.errors:
            print(f"N={r.n}: {e}")
    extrapolate(results)


def relists(r: Result) -> float | None:
    found = [v for k, v in r.numbers.items() if k.startswith("restart_agent_log_relists")]
    return sum(found) if found else None


def extrapolate(results: list[Result], target: int = 5000) -> None:
    """What grows with the fleet, per agent, between the smallest and the largest N, carried to
    ``target`` nodes, with the arithmetic printed."""
    print(f"\nExtrapolation to {target:,} nodes")
    small, large = results[0], results[-1]
    added = large.n - small.n
    name = "apiserver_cpu_per_1000_changes_above_idle"
    a, b = small.numbers.get(name), large.numbers.get(name)
    if added and a is not None and b is not None:
        slope = (b - a) / added
        at = a + slope * (target - small.n)
        print(
            f"  API server CPU per 1,000 claim changes (above idle): {a:.2f} s at N={small.n}, "
            f"{b:.2f} s at N={large.n}; ({b:.2f} - {a:.2f}) / {added} = {slope * 1000:+.2f} ms "
            f"per agent added; at {target:,}: {a:.2f} + {target - small.n:,} x "
            f"{slope * 1000:+.2f} ms = {at:.2f} s. N={large.n} / N={small.n}: {b / a:.2f} "
            "(goal <= 1.2)"
        )
        print(f"BENCH fleet_apiserver_cpu_ratio_n{large.n}_over_n{small.n} {b / a:.3f} ratio")
        # The same work per change at every N: what they grew by is the machine's share.
        for other in ("etcd", "controller_manager", "scheduler", "bench"):
            key = f"{other}_cpu_per_1000_changes" + ("" if other == "bench" else "_above_idle")
            x, y = small.numbers.get(key), large.numbers.get(key)
            if x and y:
                print(
                    f"    {other} (the same work per change at every N): {x:.2f} -> {y:.2f} s, "
                    f"{y / x:.2f}x; the API server's {b / a:.2f}x over it: {b / a / (y / x):.2f}"
                )
        # The slope, not its product: within the noise it may come out below 0.
        print(f"BENCH fleet_apiserver_cpu_per_1000_changes_per_agent {slope * 1000:.3f} cpu-ms")
    for resource in ("pods", "resourceclaims", "resourceslices"):
        a, b = small.events_per_change.get(resource), large.events_per_change.get(resource)
        if not added or a is None or b is None:
            continue
        per_agent = (b - a) / added
        print(
            f"  watch events of {resource} per claim change: {a:.3f} at N={small.n}, {b:.3f} at "
            f"N={large.n}; ({b:.3f} - {a:.3f}) / {added} = {per_agent:+.5f} per agent (goal 0); "
            f"x {target:,} = {per_agent * target:+.1f} events per claim change"
        )
        print(f"BENCH fleet_watch_events_{resource}_per_change_per_agent {per_agent:.5f} events")
    if added:
        for resource in ("pods", "resourceclaims", "resourceslices"):
            w0, w1 = small.watches.get(resource, 0.0), large.watches.get(resource, 0.0)
            print(
                f"  open watches of {resource}: {w0:.0f} at N={small.n}, {w1:.0f} at N={large.n}; "
                f"({w1:.0f} - {w0:.0f}) / {added} = {(w1 - w0) / added:.2f} per agent; at "
                f"{target:,}: {w0 + (w1 - w0) / added * (target - small.n):,.0f}"
            )
    rate = large.numbers.get("quiet_agent_requests_idle_per_minute")
    if rate is not None:
        total = rate * target
        print(
            f"  steady requests of an agent that prepares nothing: {rate:.2f} a minute (N="
            f"{large.n}); x {target:,} = {total:,.0f} a minute = {total / 60:,.0f} a second"
        )
        print(f"BENCH fleet_steady_agent_requests_per_second_at_{target} {total / 60:.1f} req/s")
    first = large.numbers.get("restart_quiet_agent_requests_mean")
    if first is not None:
        total = first * target
        print(
            f"  after an API server restart, first minute, an agent that prepares nothing: "
            f"{first:.2f} requests (N={large.n}; goal <= 3); x {target:,} = {total:,.0f} "
            f"requests in that minute, {total / 60:,.0f} a second on average"
        )
        print(f"BENCH fleet_restart_first_minute_requests_at_{target} {total:.0f} requests")
        if rate is not None:
            extra = first - rate
            print(
                f"  of which steady (the idle rate, {rate:.2f}): {first:.2f} - {rate:.2f} = "
                f"{extra:.2f} per agent caused by the restart; x {target:,} = {extra * target:,.0f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--agents",
        type=lambda text: sorted(int(n) for n in text.split(",")),
        default=[10, 50, 100],
        help="comma-separated fleet sizes [default: 10,50,100]",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="claim changes a second [20]")
    parser.add_argument("--stream-seconds", type=float, default=60.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--after-seconds", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per agent [8]")
    parser.add_argument("--other-nodes", type=int, default=10)
    parser.add_argument("--background-claims", type=int, default=300)
    parser.add_argument("--prepare-agents", type=int, default=4)
    parser.add_argument("--prepare-rate", type=float, default=2.0, help="prepares a second [2]")
    parser.add_argument(
        "--restart", choices=("all", "largest", "none"), default="all", help="at which N [all]"
    )
    parser.add_argument(
        "--freeze-quiet-agents",
        action="store_true",
        help="a control: SIGSTOP the agents that prepare nothing during the idle and stream "
        "windows (their watches stay open, they use no CPU)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="an empty directory for the agents' files and logs [a temporary one]",
    )
    args = parser.parse_args()
    results = []
    t0 = time.monotonic()
    for n in args.agents:
        print(f"\n=== {n} agents ===", flush=True)
        t = time.monotonic()
        # Short paths: a unix socket's path has at most 107 bytes.
        with tempfile.TemporaryDirectory(prefix="fleet-", dir="/tmp") as tmp, ControlPlane() as cp:
            print(f"  [{n} agents] control plane: {time.monotonic() - t:.1f} s", flush=True)
            work = Path(tmp) if args.work is None else args.work / f"n{n}"
            work.mkdir(parents=True, exist_ok=True)
            results.append(asyncio.run(run_n(cp, n, args, work)))
        print(f"  [{n} agents] all: {time.monotonic() - t:.1f} s", flush=True)
    summary(results)
    print(f"\nwhole run: {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prepare + unprepare latency as the kubelet sees it, against the real API server.

Starts the local control plane, one real node (kubelet + containerd; ``--containerd-dir`` and
``--images-dir`` from ``hack/build-containerd.sh`` and ``hack/build-images.sh``, as ``make
bench`` passes them) and the real agent process registered with its kubelet (simulated backend,
128 GPUs), creates claims whose allocation names the node's devices, reserved for a pod (written
through the status subresource, as the scheduler would), then calls NodePrepareResources and
NodeUnprepareResources over the agent's unix socket:

- one claim at a time (``--rounds`` claims, prepare then unprepare each);
- ``--in-flight`` claims at once (one RPC per claim, all started together), for each of the
  given counts (default 100 and 1,000); failed claims are counted.

The agent's resident memory (``VmRSS``, and its peak ``VmHWM``) is read from ``/proc`` once it
is ready, right after the run, and settled: ``SETTLE_SECONDS`` after the claims' status has
caught up (``dra_gpu_status_writes_pending`` back at 0; how long that took is printed), which is
what a node keeps paying: the agent gives a burst's memory back once the burst is over
(``agent.memory``).

The floor is what a driver that reads each claim with a GET cannot avoid (the Go reference
driver does): one GET of the claim plus one atomic file write, measured in this process with the
same HTTP client, for each claim right after its prepare and unprepare (interleaved: a busy
machine slows both alike). The agent reads a claim from the copy its claim cache read as the
claim's pod was bound to its node (``agent.claimcache``), when it may: every phase has claims of
its own, allocated, reserved for a pod and the pod bound as the scheduler leaves them (to a Node
with no kubelet, the agent's: ``GPU_NODE``), and how many were read from the copy and how many
with a GET is printed. With ``--pydra-python`` (an interpreter that has the ``kubernetes-pydra``
package; ``make bench`` makes one) the same calls go to pydra's TPU plugin too, the only other
Python DRA driver: it answers without reading the claim and writes its spec with a plain
``open()``, so it is a lower bound rather than a peer. Prints a table and ``BENCH <name> <value>
<unit>`` lines; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
from stats import percentile

from dra_gpu import kube
from dra_gpu.agent import files
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.testing import AgentProcess, ControlPlane, NodeRuntime, RealNode, eventually

NODE = "bench-node"
"""The real node: its kubelet registers the agent (whose socket the benchmark calls)."""
GPU_NODE = "bench-gpus"
"""The agent's node name and pool: a Node with no kubelet, to which the claims' pods are bound
(so the agent's claim cache reads their claims as it would on a node whose kubelet is about to
prepare them) and where they stay Pending (nothing runs them)."""
DRIVER = "gpu.example.com"
DEVICES = 128


def server_side(text: str, since: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """(sum, count) of the agent's own prepare histogram, minus an earlier reading."""
    values = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            prefix = f'dra_gpu_prepare_claim_duration_seconds_{part}{{result="success"}} '
            if line.startswith(prefix):
                values[part] = float(line[len(prefix) :])
    return values.get("sum", 0.0) - since[0], values.get("count", 0.0) - since[1]


def claim_reads(text: str) -> dict[str, float]:
    """The agent's ``dra_gpu_claim_reads_total`` by source (cache, api)."""
    found = re.findall(r'^dra_gpu_claim_reads_total\{source="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {source: float(value) for source, value in found}


def status_writes_pending(text: str) -> float:
    """The agent's ``dra_gpu_status_writes_pending``."""
    found = re.search(r"^dra_gpu_status_writes_pending (\S+)$", text, re.MULTILINE)
    assert found is not None, "the agent serves dra_gpu_status_writes_pending"
    return float(found.group(1))


async def status_caught_up(agent: AgentProcess) -> float:
    """Seconds until the agent has no status write pending."""
    t0 = time.perf_counter()
    metric = "dra_gpu_status_writes_pending"
    await eventually(
        lambda: status_writes_pending(agent.metrics(metric)) == 0 or None,
        timeout=120,
        interval=0.1,
        what="every status write done",
    )
    return time.perf_counter() - t0


def split(items: list[v1.Claim], sizes: list[int]) -> list[list[v1.Claim]]:
    """``items`` cut into consecutive runs of ``sizes``."""
    runs, start = [], 0
    for size in sizes:
        runs.append(items[start : start + size])
        start += size
    return runs


WARM_UP = 5


def report(name: str, seconds: list[float]) -> tuple[float, float]:
    p50, p99 = percentile(seconds, 50) * 1000, percentile(seconds, 99) * 1000
    print(f"{name:<42} n={len(seconds):<4} p50={p50:8.2f} ms  p99={p99:8.2f} ms")
    print(f"BENCH {name}_p50 {p50:.3f} ms")
    print(f"BENCH {name}_p99 {p99:.3f} ms")
    return p50, p99


SETTLE_SECONDS = 5.0


def memory_mib(pid: int) -> dict[str, float]:
    """The process's resident memory now (``VmRSS``) and at its peak (``VmHWM``), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.MULTILINE))
    return {key: int(value) / 1024 for key, value in kib.items()}


async def make_claims(api: kube.Kube, namespace: str, count: int) -> list[v1.Claim]:
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    limit = asyncio.Semaphore(16)

    async def make(i: int) -> v1.Claim:
        async with limit:
            return await make_claim(api, base, namespace, i)

    return list(await asyncio.gather(*(make(i) for i in range(count))))


async def make_claim(api: kube.Kube, base: str, namespace: str, i: int) -> v1.Claim:
    body = {
        "metadata": {"name": f"bench-{i}"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "bench-gpu"}}]}
        },
    }
    created = await api.create(base, body)
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": GPU_NODE,
                        "device": f"gpu-{i % DEVICES}",
                    }
                ]
            }
        }
    }
    # Reserved for its pod, then the pod bound to the agent's node, as the scheduler does for
    # every claim the kubelet prepares (a scheduler of its own name: no other binds it). No
    # kubelet runs it there, and it tolerates the node's taints (not ready): it stays, and
    # Kubernetes keeps the reservation.
    pod = await api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": f"bench-{i}"},
            "spec": {
                "schedulerName": "dra-gpu-bench",
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"bench-{i}"}],
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    created["status"]["reservedFor"] = [
        {"resource": "pods", "name": f"bench-{i}", "uid": pod["metadata"]["uid"]}
    ]
    await api.replace(f"{base}/bench-{i}/status", created)
    pods = f"/api/v1/namespaces/{namespace}/pods/bench-{i}"
    binding = {"target": {"apiVersion": "v1", "kind": "Node", "name": GPU_NODE}}
    await api.create(f"{pods}/binding", {"metadata": {"name": f"bench-{i}"}, **binding})
    return v1.Claim(namespace=namespace, name=f"bench-{i}", uid=created["metadata"]["uid"])


async def one_at_a_time(
    stub: v1_grpc.DRAPluginAsyncStub,
    claims: list[v1.Claim],
    api: kube.Kube | None = None,
    floor_dir: Path | None = None,
) -> dict[str, list[float]]:
    """Prepare then unprepare each claim; with ``api``, the floor for the same claim right
    after, so that both see the same moment of a busy machine."""
    timings: dict[str, list[float]] = {"prepare": [], "unprepare": [], "both": [], "floor": []}
    for claim in claims:
        t0 = time.perf_counter()
        prepared = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[claim]))
        t1 = time.perf_counter()
        await stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[claim]))
        t2 = time.perf_counter()
        if prepared.claims[claim.uid].error:
            raise RuntimeError(prepared.claims[claim.uid].error)
        timings["prepare"].append(t1 - t0)
        timings["unprepare"].append(t2 - t1)
        timings["both"].append(t2 - t0)
        if api is not None and floor_dir is not None:
            timings["floor"].append(await floor(api, claim, floor_dir))
    return timings


async def empty_calls(stub: v1_grpc.DRAPluginAsyncStub, rounds: int) -> list[float]:
    """The transport alone: a prepare with no claims does no work in the agent."""
    timings = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await stub.NodePrepareResources(v1.NodePrepareResourcesRequest())
        timings.append(time.perf_counter() - t0)
    return timings


async def in_flight(
    stub: v1_grpc.DRAPluginAsyncStub, claims: list[v1.Claim]
) -> tuple[dict[str, list[float]], int]:
    """Timings, and how many claims got an error (or no answer) from either call."""
    errors = 0

    async def timed(call: object) -> float:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            response = await call  # type: ignore[misc]
        except grpc.aio.AioRpcError:
            errors += 1
        else:
            errors += sum(1 for c in response.claims.values() if c.error)
        return time.perf_counter() - t0

    prepare = await asyncio.gather(
        *(
            timed(stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[c])))
            for c in claims
        )
    )
    unprepare = await asyncio.gather(
        *(
            timed(stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[c])))
            for c in claims
        )
    )
    return {"prepare": list(prepare), "unprepare": list(unprepare)}, errors


async def floor(api: kube.Kube, claim: v1.Claim, directory: Path) -> float:
    """What no implementation can avoid: one GET of the claim, one atomic, fsync'd write."""
    t0 = time.perf_counter()
    body = await api.get(
        f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
    )
    await asyncio.to_thread(
        files.atomic_write, directory / f"{claim.uid}.json", str(body["metadata"]).encode()
    )
    return time.perf_counter() - t0


PYDRA_SERVER = """
import asyncio, sys
from pydra.plugins.tpu.driver import TpuDraPlugin
asyncio.run(TpuDraPlugin(socket_path=sys.argv[1], cdi_dir=sys.argv[2]).serve())
"""


async def pydra(python: str, work: Path, claims: list[v1.Claim]) -> dict[str, list[float]]:
    socket = work / "pydra" / "dra.sock"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}  # it publishes nothing
    server = await asyncio.create_subprocess_exec(
        python,
        "-c",
        PYDRA_SERVER,
        str(socket),
        str(work / "pydra" / "cdi"),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if socket.exists():
                break
            await asyncio.sleep(0.1)
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = v1_grpc.DRAPluginStub(channel)
            await one_at_a_time(stub, claims[:5])
            return await one_at_a_time(stub, claims)
    finally:
        server.terminate()
        await server.wait()


async def run(
    cp: ControlPlane,
    node: RealNode,
    work: Path,
    rounds: int,
    concurrent: list[int],
    pydra_python: str | None,
    agent_args: tuple[str, ...],
) -> None:
    profile = work / "profile.yaml"
    profile.write_text(
        f"nodes:\n  {GPU_NODE}:\n    devices:\n    - count: {DEVICES}\n      memory: 80Gi\n"
    )
    async with await kube.Kube.connect(cp.kubeconfig) as api:
        labels = {"kubernetes.io/hostname": GPU_NODE}
        await api.create("/api/v1/nodes", {"metadata": {"name": GPU_NODE, "labels": labels}})
        agent = AgentProcess(
            GPU_NODE,
            cp.kubeconfig,
            node.kubelet_dir,
            work / "agent",
            cdi=node.cdi_dir,
            profile=profile,
            extra_args=agent_args,
        )
        await agent.astart()
        assert agent.pid is not None
        try:
            memory_ready = memory_mib(agent.pid)
            await api.create("/api/v1/namespaces", {"metadata": {"name": "bench"}})
            await asyncio.to_thread(cp.wait_for_service_account, "default", "bench")
            # Each phase its own claims, as each pod start is a claim allocated and reserved
            # for it (a claim unprepared once is read with a GET until it is released).
            claims = await make_claims(api, "bench", WARM_UP + rounds + sum(concurrent))
            phases = iter(split(claims, [WARM_UP, rounds, *concurrent]))
            socket = f"unix://{node.kubelet_dir}/plugins/{DRIVER}/dra.sock"
            async with grpc.aio.insecure_channel(socket) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                await one_at_a_time(stub, next(phases))  # warm up connections and caches
                empty = await empty_calls(stub, rounds)
                before = server_side(agent.metrics())
                sequential = await one_at_a_time(stub, next(phases), api, work / "floor")
                inside = server_side(agent.metrics(), before)
                parallel = {n: await in_flight(stub, next(phases)) for n in concurrent}
            reads = claim_reads(agent.metrics())
            memory_after = memory_mib(agent.pid)
            status_lag = await status_caught_up(agent)
            await asyncio.sleep(SETTLE_SECONDS)
            memory_settled = memory_mib(agent.pid)
            peer = await pydra(pydra_python, work, claims[:rounds]) if pydra_python else None
        finally:
            agent.stop()
    print(
        f"\nprepare/unprepare latency, {rounds} claims one at a time, "
        f"{' and '.join(map(str, concurrent))} in flight "
        f"(kubelet's view, gRPC over a unix socket, real API server)\n"
    )
    floor_times = sequential["floor"]
    floor_p50, floor_p99 = report("floor_get_claim_plus_atomic_write", floor_times)
    report("grpc_round_trip_empty_prepare", empty)
    mean_inside = inside[0] / inside[1] * 1000 if inside[1] else float("nan")
    print(f"{'prepare_inside_the_agent (mean)':<42} {mean_inside:8.2f} ms")
    print(f"BENCH prepare_inside_agent_mean {mean_inside:.3f} ms")
    prepare_p50, prepare_p99 = report("prepare_one_at_a_time", sequential["prepare"])
    report("unprepare_one_at_a_time", sequential["unprepare"])
    report("prepare_plus_unprepare_one_at_a_time", sequential["both"])
    for n, (timings, errors) in parallel.items():
        report(f"prepare_{n}_in_flight", timings["prepare"])
        report(f"unprepare_{n}_in_flight", timings["unprepare"])
        print(f"{f'claims with an error, {n} in flight':<42} {errors}")
        print(f"BENCH prepare_{n}_in_flight_errors {errors} claims")
    for source in ("cache", "api"):
        print(f"{f'claims read from the {source}':<42} {reads.get(source, 0):.0f}")
        print(f"BENCH claim_reads_{source} {reads.get(source, 0):.0f} claims")
    if peer is not None:
        pydra_p50, _ = report("pydra_tpu_prepare_one_at_a_time", peer["prepare"])
        report("pydra_tpu_prepare_plus_unprepare_one_at_a_time", peer["both"])
    print(f"{'claims status caught up after the run':<42} {status_lag:8.2f} s")
    print(f"BENCH status_caught_up_after_the_run {status_lag:.2f} s")
    for when, memory in (
        ("ready", memory_ready),
        ("after_the_run", memory_after),
        ("settled", memory_settled),
    ):
        print(
            f"{f'agent memory, {when}':<42} RSS={memory['VmRSS']:6.1f} MiB  "
            f"peak={memory['VmHWM']:6.1f} MiB"
        )
        print(f"BENCH agent_rss_{when} {memory['VmRSS']:.1f} MiB")
    print(f"BENCH agent_rss_peak {memory_settled['VmHWM']:.1f} MiB")
    ratio = prepare_p50 / floor_p50
    print(f"\nprepare p50 / floor p50 = {ratio:.2f} (goal <= 1.2)")
    print(f"BENCH prepare_p50_over_floor_p50 {ratio:.3f} ratio")
    ratio99 = prepare_p99 / floor_p99
    print(f"prepare p99 / floor p99 = {ratio99:.2f} (goal <= 2)")
    print(f"BENCH prepare_p99_over_floor_p99 {ratio99:.3f} ratio")
    if peer is not None:
        print(f"prepare p50 / pydra prepare p50 = {prepare_p50 / pydra_p50:.2f}")
        print(f"BENCH prepare_p50_over_pydra_p50 {prepare_p50 / pydra_p50:.3f} ratio")
    print(f"BENCH floor_mean {statistics.mean(floor_times) * 1000:.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--in-flight",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[100, 1000],
        help="comma-separated claim counts started together [default: 100,1000]",
    )
    parser.add_argument("--pydra-python", help="interpreter with kubernetes-pydra installed")
    parser.add_argument("--containerd-dir", type=Path, required=True)
    parser.add_argument("--images-dir", type=Path, required=True)
    parser.add_argument(
        "--agent-api-qps",
        type=float,
        help="the agent's client-side rate limit (--api-qps; 0: none) [default: the agent's]",
    )
    args = parser.parse_args()
    agent_args = () if args.agent_api_qps is None else (f"--api-qps={args.agent_api_qps:g}",)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp, ControlPlane() as cp:
        work = Path(tmp)
        (work / "floor").mkdir()
        runtime = NodeRuntime.from_builds(cp.bin_dir, args.containerd_dir, args.images_dir)
        with RealNode(cp, NODE, 1, work / "node", runtime) as node:
            asyncio.run(
                run(cp, node, work, args.rounds, args.in_flight, args.pydra_python, agent_args)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

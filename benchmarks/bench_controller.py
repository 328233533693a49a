"""The controller at scale: 1,000 nodes x 8 devices published, 5,000 claims.

Creates the slices (one per node, as the agents would) and the claims directly on the real API
server (a fifth of the claims allocated, written through the status subresource as the scheduler
would), then starts one controller process and measures:

- the time from its start until its metrics show the complete view (every device, every claim);
- the lag from a claim change (a new claim) to the metric reflecting it, p50 and p99;
- its resident memory afterwards.

Goals (from the issue): complete view <= 10 s, lag p99 <= 1 s, memory <= 300 MiB. Prints numbers
and ``BENCH <name> <value> <unit>`` lines; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

from stats import percentile

from dra_gpu import kube
from dra_gpu.testing import ControllerProcess, ControlPlane, eventually

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.example.com"


def series(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )


async def populate(api: kube.Kube, nodes: int, devices: int, claims: int) -> None:
    sem = asyncio.Semaphore(16)

    async def slice_of(i: int) -> None:
        node = f"bench-{i:04d}"
        async with sem:
            await api.create(
                f"{RESOURCE}/resourceslices",
                {
                    "metadata": {"name": f"{node}-gpu"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [
                            {
                                "name": f"gpu-{d}",
                                "capacity": {"memory": {"value": "80Gi"}},
                                "attributes": {"index": {"int": d}},
                            }
                            for d in range(devices)
                        ],
                    },
                },
            )

    async def claim_of(i: int) -> None:
        path = f"{RESOURCE}/namespaces/bench/resourceclaims"
        async with sem:
            created = await api.create(
                path,
                {
                    "metadata": {"name": f"claim-{i:05d}"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": "bench-gpu"}}
                            ]
                        }
                    },
                },
            )
            if i % 5 == 0:  # a fifth allocated, one device each
                node = f"bench-{(i // 5) % nodes:04d}"
                created["status"] = {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": DRIVER,
                                    "pool": node,
                                    "device": f"gpu-{(i // 5 // nodes) % devices}",
                                }
                            ]
                        }
                    }
                }
                await api.replace(f"{path}/claim-{i:05d}/status", created)

    await api.create("/api/v1/namespaces", {"metadata": {"name": "bench"}})
    await asyncio.gather(*(slice_of(i) for i in range(nodes)))
    await asyncio.gather(*(claim_of(i) for i in range(claims)))


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match[1]) / 1024 if match else float("nan")


async def run(
    cp: ControlPlane, work: Path, nodes: int, devices: int, claims: int, changes: int
) -> None:
    async with await kube.Kube.connect(cp.kubeconfig) as api:
        t0 = time.perf_counter()
        await populate(api, nodes, devices, claims)
        print(f"populated {nodes} slices and {claims} claims in {time.perf_counter() - t0:.1f}s")
        controller = ControllerProcess("bench", cp.kubeconfig, work, resync_seconds=30)
        started = time.perf_counter()
        controller.spawn()
        try:
            while True:
                try:
                    text = controller.metrics()
                except OSError:
                    text = ""
                published = sum(
                    float(v)
                    for v in re.findall(
                        r'dra_gpu_devices\{node="[^"]+",state="published"\} (\S+)', text
                    )
                )
                if published == nodes * devices and series(text, "dra_gpu_claims") == claims:
                    break
                await asyncio.sleep(0.05)
            complete = time.perf_counter() - started
            lags = []
            for i in range(changes):
                before = series(controller.metrics(), "dra_gpu_claims")
                t = time.perf_counter()
                await api.create(
                    f"{RESOURCE}/namespaces/bench/resourceclaims",
                    {
                        "metadata": {"name": f"late-{i}"},
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": "gpu", "exactly": {"deviceClassName": "bench-gpu"}}
                                ]
                            }
                        },
                    },
                )
                await eventually(
                    lambda before=before: series(controller.metrics(), "dra_gpu_claims") > before,
                    timeout=60,
                    interval=0.01,
                    what="the new claim counted",
                )
                lags.append(time.perf_counter() - t)
            memory = rss_mib(controller.pid or 0)
        finally:
            controller.stop()
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    print(f"\ncontroller, {nodes} nodes x {devices} devices, {claims} claims")
    print(f"  complete view after start   {complete:7.2f} s   (goal <= 10 s)")
    print(
        f"  claim change -> metric lag  p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms"
        "   (goal p99 <= 1 s)"
    )
    print(f"  resident memory             {memory:7.1f} MiB (goal <= 300 MiB)")
    print(f"BENCH controller_complete_view {complete:.3f} s")
    print(f"BENCH controller_lag_p50 {p50 * 1000:.1f} ms")
    print(f"BENCH controller_lag_p99 {p99 * 1000:.1f} ms")
    print(f"BENCH controller_rss {memory:.1f} MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--claims", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp, ControlPlane() as cp:
        asyncio.run(run(cp, Path(tmp), args.nodes, args.devices, args.claims, args.changes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

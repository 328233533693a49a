"""The admission webhook's latency with the controller under the scale benchmark's load.

The ``dra-gpu controller`` process against the real API server (the local control plane),
holding ``bench_controller``'s cluster (nodes with 8 GPUs of a few products, classes with
selectors, allocated claims with running pods, pending claims with waiting pods, other pods),
its webhook on, its certificate self-issued into its Secret. Once its view is complete, a
stream of claim changes runs (new claims at ``--rate`` per second, as the scale benchmark's
stream) while AdmissionReviews are sent to the webhook over one kept-alive HTTPS connection, as
the API server sends them, one after the other — twice: at start-up, while Kopf still hands
the controller its initial listings (every Pod of the cluster, at about a millisecond of Kopf's
own each: reported as ``startup``), and then ``--reviews`` of them once Kopf has caught up
(its log says so), the steady state the goal is about:

- ``good``: a claim with a valid config and a selector other claims use (its outcomes known);
- ``bad``: a claim with a config prepare would refuse (refused, no explanation);
- ``unsatisfiable``: more memory than any GPU has (admitted with a warning);
- ``fresh``: a selector no claim used before (every device's CEL outcome worked out anew);
- ``template``: a ResourceClaimTemplate with a valid config.

Printed: p50/p99/max per case and overall, the controller's own histogram, and ``BENCH``
lines; nothing is asserted. Goal (issue 30): p99 <= 20 ms; ``mix`` is every case but
``fresh`` (a selector nobody used before is worked out on every device, with breaks for the
event loop, and bounded by a budget: reported on its own).

Run: ``.venv/bin/python benchmarks/bench_admission.py [--nodes 1000 --claims 5000 ...]``
(``make bench``: ``bench_controller``'s ``MAKE_BENCH`` size).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from bench_controller import (
    DRIVER,
    KOPF_CAUGHT_UP,
    KOPF_CAUGHT_UP_WITHIN,
    RESOURCE,
    Cluster,
    LogWatch,
    Shape,
    _api_body,
    claim_body,
    heartbeat_forever,
    node_name,
    populate,
    rss_mib,
    series,
)
from stats import percentile

from dra_gpu import kube
from dra_gpu.devices import opaque

SERVICE_NAME = "dra-gpu-webhook.default.svc"
CASES = ("good", "bad", "unsatisfiable", "fresh", "template")


def _config(**fields: Any) -> dict[str, Any]:
    parameters = {"apiVersion": opaque.API_VERSION, "kind": opaque.KIND, **fields}
    return {"opaque": {"driver": DRIVER, "parameters": parameters}}


def _memory(quantity: str) -> list[dict[str, Any]]:
    expression = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{quantity}")) >= 0'
    return [{"cel": {"expression": expression}}]


def review_object(case: str, i: int, classes: int) -> tuple[str, dict[str, Any]]:
    """The resource and the object of the ``i``-th review of ``case``."""
    request: dict[str, Any] = {"deviceClassName": f"gpu-class-{i % classes:02d}"}
    config = [_config(sharing={"strategy": "TimeSlicing"})]
    if case == "bad":
        config = [_config(sharing={"strategy": "MPS"})]
    elif case == "unsatisfiable":
        request["selectors"] = _memory("160Gi")
    elif case == "fresh":
        request["selectors"] = _memory(f"{1 + i % 79}Gi{'' if i % 2 else ' + 0'}")
        request["selectors"][0]["cel"]["expression"] += f" && {i} > 0"
    else:
        request["selectors"] = _memory("24Gi")
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": request}], "config": config}}
    meta = {"namespace": "team-0", "name": f"review-{case}-{i}"}
    if case == "template":
        return "resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": meta,
            "spec": {"spec": spec},
        }
    return "resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": spec,
    }


def admission_review(resource: str, body: dict[str, Any]) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a CREATE."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": body["kind"]},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource},
            "requestKind": {"group": "resource.k8s.io", "version": "v1", "kind": body["kind"]},
            "requestResource": {
                "group": "resource.k8s.io",
                "version": "v1",
                "resource": resource,
            },
            "name": body["metadata"]["name"],
            "namespace": body["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
            "object": body,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


async def ca_of(api: kube.Kube) -> bytes:
    """The CA bundle the leader stored in its Secret (what it puts in the caBundle)."""
    while True:
        try:
            secret = await api.get("/api/v1/namespaces/default/secrets/dra-gpu-webhook-tls")
            return base64.b64decode(secret["data"]["ca.crt"])
        except kube.ApiError as exc:
            if exc.status != 404:
                raise
        await asyncio.sleep(0.2)


async def claim_stream(api: kube.Kube, shape: Shape, rate: float) -> None:
    """New claims at ``rate`` per second, until cancelled (the scale benchmark's stream)."""
    for i in itertools.count():
        started = time.perf_counter()
        await api.create(
            f"{RESOURCE}/namespaces/team-0/resourceclaims",
            _api_body(claim_body(40_000_000 + 10 * i, shape.classes)),
        )
        await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - started)))


async def measure(
    session: aiohttp.ClientSession,
    url: str,
    shape: Shape,
    reviews: int,
    until: Callable[[], bool] = lambda: False,
    unwarned: list[int] | None = None,
) -> dict[str, list[float]]:
    """``reviews`` reviews, the cases in turn, one after the other (fewer if ``until``). An
    unsatisfiable claim admitted without its warning (the controller's budget for working it
    out ran out: it is admitted unexplained) fails the run, or is noted in ``unwarned``."""
    took: dict[str, list[float]] = {case: [] for case in CASES}
    for i in range(reviews):
        if until():
            break
        case = CASES[i % len(CASES)]
        resource, body = review_object(case, i, shape.classes)
        review = admission_review(resource, body)
        started = time.perf_counter()
        async with session.post(f"{url}/{resource}", json=review) as answer:
            payload = await answer.json()
        took[case].append(time.perf_counter() - started)
        allowed = payload["response"]["allowed"]
        if allowed == (case == "bad"):
            raise AssertionError(f"review {case} {i}: unexpected answer {payload['response']}")
        if case == "unsatisfiable" and not payload["response"].get("warnings"):
            if unwarned is None:
                raise AssertionError(f"review {case} {i}: no warning in {payload['response']}")
            unwarned.append(i)
    return took


async def run(shape: Shape, reviews: int, rate: float) -> None:
    from dra_gpu.testing import ControllerProcess, ControlPlane, eventually
    from dra_gpu.testing._control_plane import free_port

    cluster = Cluster(shape)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp, ControlPlane() as cp:
        async with await kube.Kube.connect(cp.kubeconfig) as api:
            nodes = [node_name(i) for i in range(shape.nodes)]
            heartbeats = asyncio.create_task(heartbeat_forever(api, nodes), name="heartbeats")
            await populate(api, cluster)
            port = free_port()
            controller = ControllerProcess(
                "bench", cp.kubeconfig, Path(tmp), resync_seconds=30, webhook_port=port
            )
            caught_up = LogWatch(controller.log_file, {"kopf_pods": KOPF_CAUGHT_UP})
            logs = asyncio.create_task(caught_up.run_forever(), name="log")
            controller.spawn()
            stream: asyncio.Task[None] | None = None
            unwarned: list[int] = []
            try:

                def complete() -> bool:
                    try:
                        text = controller.metrics("dra_gpu_claims")
                    except OSError:  # not listening yet
                        return False
                    return series(text, "dra_gpu_claims") >= shape.claims

                await eventually(
                    complete,
                    timeout=900,
                    interval=0.2,
                    what="the controller's view complete",
                )
                context = ssl.create_default_context(cadata=(await ca_of(api)).decode())
                resolver = {SERVICE_NAME: "127.0.0.1"}
                connector = aiohttp.TCPConnector(ssl=context, limit=1, resolver=_Resolver(resolver))
                url = f"https://{SERVICE_NAME}:{port}"
                async with aiohttp.ClientSession(connector=connector) as session:
                    await _until_serving(session, url)
                    stream = asyncio.create_task(claim_stream(api, shape, rate), name="stream")
                    startup = await measure(
                        session,
                        url,
                        shape,
                        reviews,
                        until=lambda: "kopf_pods" in caught_up.seen,
                        unwarned=unwarned,
                    )
                    await caught_up.wait("kopf_pods", KOPF_CAUGHT_UP_WITHIN)
                    took = await measure(session, url, shape, reviews)
                memory = rss_mib(controller.pid or 0)
                histogram = controller.metrics("dra_gpu_admission_duration_seconds_sum")
            finally:
                if stream is not None:
                    stream.cancel()
                logs.cancel()
                heartbeats.cancel()
                controller.stop()
    print(
        f"\nadmission under load: {shape.nodes} nodes x {shape.gpus}, {shape.classes} classes, "
        f"{shape.claims} claims ({shape.pending} pending), {shape.claims + shape.other_pods} "
        f"pods, claims created at {rate:g}/s meanwhile; reviews one at a time"
    )
    startup_mix = _mix(startup)
    print(
        f"  during start-up (Kopf listing): {len(startup_mix)} reviews of the mix; "
        f"{len(unwarned)} of {len(startup['unsatisfiable'])} unsatisfiable claims admitted "
        "without their warning (the budget ran out)"
    )
    if startup_mix:
        _report("startup_mix", startup_mix)
    print(f"  once Kopf caught up: {reviews} reviews")
    every = [t for times in took.values() for t in times]
    for case, times in [*took.items(), ("mix", _mix(took)), ("all", every)]:
        _report(case, times)
    handled = sum(
        float(line.rsplit(" ", 1)[1])
        for line in histogram.splitlines()
        if line.startswith("dra_gpu_admission_duration_seconds_sum")
    )
    answered = reviews + sum(len(times) for times in startup.values())
    print(f"  the handlers' own time: {handled / answered * 1000:.2f} ms per review on average")
    print(f"  controller resident memory {memory:.1f} MiB")
    print(f"BENCH admission_handler_mean {handled / answered * 1000:.2f} ms")
    print(f"BENCH admission_controller_rss {memory:.1f} MiB")


def _mix(took: dict[str, list[float]]) -> list[float]:
    """What a cluster applies: claims from templates and their templates, with selectors in
    use; a selector nobody used before ("fresh") is the rare, expensive case, apart."""
    return [t for case, times in took.items() if case != "fresh" for t in times]


def _report(case: str, times: list[float]) -> None:
    p50, p99 = percentile(times, 50) * 1000, percentile(times, 99) * 1000
    print(f"  {case:<14} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  max {max(times) * 1000:6.1f} ms")
    print(f"BENCH admission_{case}_p50 {p50:.1f} ms")
    print(f"BENCH admission_{case}_p99 {p99:.1f} ms")


async def _until_serving(session: aiohttp.ClientSession, url: str) -> None:
    resource, body = review_object("good", 0, 1)
    deadline = time.monotonic() + 120
    while True:
        try:
            async with session.post(f"{url}/{resource}", json=admission_review(resource, body)):
                return
        except (aiohttp.ClientError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class _Resolver(aiohttp.abc.AbstractResolver):
    """The Service's DNS name to the controller on loopback (the name the certificate has)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[Any]:
        address = self.names.get(host, host)
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": family,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--claims", type=int, default=1_800)
    parser.add_argument("--pending", type=int, default=300)
    parser.add_argument("--other-pods", type=int, default=10_000)
    parser.add_argument("--reviews", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=10.0, help="claims created per second")
    args = parser.parse_args()
    shape = Shape(args.nodes, 8, args.classes, args.claims, args.pending, args.other_pods)
    asyncio.run(run(shape, args.reviews, args.rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())

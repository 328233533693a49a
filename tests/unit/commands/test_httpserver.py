"""The metrics and health endpoints of both processes (``httpserver.serving``), on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import urllib.error
import urllib.request

import prometheus_client

from dra_gpu import httpserver


@dataclasses.dataclass(frozen=True)
class Where:
    metrics_port: int
    health_port: int
    bind_address: str = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def ok() -> tuple[bool, str]:
    return True, "ok"


async def not_yet() -> tuple[bool, str]:
    return False, "slices not published yet"


async def fetch(port: int, path: str) -> tuple[int, str]:
    """GET in a thread (the server answers on this test's event loop)."""
    return await asyncio.to_thread(_get, port, path)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_metrics_whole_or_by_name_and_the_probes_on_one_port() -> None:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Gauge("dra_gpu_a", "A.", registry=registry).set(1)
    prometheus_client.Gauge("dra_gpu_b", "B.", ["node"], registry=registry).labels("n").set(2)
    port = free_port()
    async with httpserver.serving(
        Where(metrics_port=port, health_port=port), registry=registry, healthz=ok, readyz=not_yet
    ) as ports:
        assert ports == [port]  # one listener serves all four paths
        status, whole = await fetch(port, "/metrics")
        assert status == 200
        assert "dra_gpu_a 1.0" in whole
        assert 'dra_gpu_b{node="n"} 2.0' in whole
        status, one = await fetch(port, "/metrics?name[]=dra_gpu_b")
        assert status == 200
        assert 'dra_gpu_b{node="n"} 2.0' in one
        assert "dra_gpu_a" not in one
        assert await fetch(port, "/healthz") == (200, "ok\n")
        assert await fetch(port, "/readyz") == (503, "slices not published yet\n")

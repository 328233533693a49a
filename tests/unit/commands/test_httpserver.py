"""The metrics and health endpoints of both processes (``httpserver.serving``), on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import urllib.error
import urllib.request
from contextlib import AbstractAsyncContextManager

import prometheus_client
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from dra_gpu.serving import httpserver
from tests.support.ports import free_port


@dataclasses.dataclass(frozen=True)
class Where:
    metrics_port: int
    health_port: int
    bind_address: str = "127.0.0.1"


async def ok() -> tuple[bool, str]:
    return True, "ok"


async def not_yet() -> tuple[bool, str]:
    return False, "slices not published yet"


def on_one_port(port: int, *, readyz: httpserver.Check) -> AbstractAsyncContextManager[list[int]]:
    """Metrics and probes on ``port``, the default registry's metrics."""
    return httpserver.serving(
        Where(metrics_port=port, health_port=port),
        registry=prometheus_client.REGISTRY,
        healthz=ok,
        readyz=readyz,
    )


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


class _Slow:
    """A collector that takes ``seconds`` to collect, and tells in which thread it ran."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.threads: list[str] = []
        self.started = threading.Event()

    def collect(self) -> list[Metric]:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        time.sleep(self.seconds)  # Python holding the interpreter, as a big page's writing does
        return [GaugeMetricFamily("dra_gpu_slow", "Slow.", value=1)]

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily("dra_gpu_slow", "Slow.")]


async def test_a_scrape_is_written_out_off_the_event_loop() -> None:
    registry = prometheus_client.CollectorRegistry()
    slow = _Slow(1.0)
    registry.register(slow)
    port = free_port()
    async with httpserver.serving(
        Where(metrics_port=port, health_port=port), registry=registry, healthz=ok, readyz=ok
    ):
        scrape = asyncio.create_task(fetch(port, "/metrics"))
        assert await asyncio.to_thread(slow.started.wait, 5)
        # The loop answers meanwhile: the probe is back before the page.
        assert await fetch(port, "/healthz") == (200, "ok\n")
        assert not scrape.done()
        status, page = await scrape
    assert status == 200
    assert "dra_gpu_slow 1.0" in page
    assert [name.startswith("metrics") for name in slow.threads] == [True]


async def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes, read until the server closes (or 5 s of silence)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        chunks = []
        while data := await asyncio.wait_for(reader.read(65536), 5):
            chunks.append(data)
        return b"".join(chunks)
    finally:
        writer.close()


async def test_metrics_and_probes_on_separate_ports_and_a_zero_port_turns_a_part_off() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics, health = free_port(), free_port()
    async with httpserver.serving(
        Where(metrics_port=metrics, health_port=health), registry=registry, healthz=ok, readyz=ok
    ) as ports:
        assert ports == [metrics, health]
        assert (await fetch(metrics, "/healthz"))[0] == 404
        assert await fetch(health, "/healthz") == (200, "ok\n")
    async with httpserver.serving(
        Where(metrics_port=0, health_port=health), registry=registry, healthz=ok, readyz=ok
    ) as ports:
        assert ports == [health]


async def test_unknown_paths_other_methods_and_head_are_answered_as_before() -> None:
    port = free_port()
    async with on_one_port(port, readyz=ok):
        missing = await exchange(
            port, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert missing.startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert missing.endswith(b"\r\n\r\n404: Not Found")
        post = (
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        refused = await exchange(port, post)
        assert refused.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
        assert b"\r\nAllow: GET, HEAD\r\n" in refused
        head = await exchange(
            port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert head.endswith(b"Content-Length: 3\r\nConnection: close\r\n\r\n")  # no body


async def test_keep_alive_serves_one_request_after_the_other_on_one_connection() -> None:
    port = free_port()
    async with on_one_port(port, readyz=not_yet):
        two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n"
        answers = await exchange(port, two + b"Connection: close\r\n\r\n")
    assert answers.count(b"HTTP/1.1 ") == 2
    assert answers.endswith(b"slices not published yet\n")


async def test_what_is_not_http_gets_400_and_a_slow_client_holds_up_nobody() -> None:
    port = free_port()
    async with on_one_port(port, readyz=ok):
        _, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"GET /heal")  # and nothing more: it waits, the others do not
        await slow.drain()
        garbage = await exchange(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert await fetch(port, "/healthz") == (200, "ok\n")
        # The server stops with the slow client's connection still open.
    slow.close()

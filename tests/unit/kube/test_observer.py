"""``Kube``'s ``RequestObserver``: every request told with its verb, its answer's code and its
time — a 2xx, an error status, a watch, a request that got no answer — and the metrics a
component passes as one (``serving.metrics.ApiRequests``) counting them."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry

from dra_gpu import kube
from dra_gpu.kube import transport
from dra_gpu.kube.client import verb_of
from dra_gpu.serving import metrics
from tests.support.api_servers import answer, chunked_head, read_request, serving


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def __call__(self, verb: str, code: str, seconds: float) -> None:
        self.calls.append((verb, code, seconds))


async def test_the_observer_gets_verb_and_code_of_answers_errors_and_watches() -> None:
    answers = [
        answer(b'{"kind": "Node"}'),
        answer(b'{"kind": "Status", "reason": "NotFound"}', "404 Not Found"),
        answer(b'{"kind": "Node"}', "201 Created"),
        chunked_head(),  # a watch: told once it streams, before any event
    ]
    done = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        for reply in answers:
            await read_request(reader)
            writer.write(reply)
        await done.wait()  # the watch's stream stays open

    seen = Recorder()
    async with (
        serving(handler) as server,
        kube.Kube(transport.Client(server.url()), observer=seen) as api,
    ):
        await api.get("/api/v1/nodes/a")
        with pytest.raises(kube.ApiError):
            await api.get("/api/v1/nodes/b")
        await api.create("/api/v1/nodes", {"metadata": {"name": "c"}})
        response = await api.send("GET", "/api/v1/nodes", query={"watch": True})
        assert [(verb, code) for verb, code, _ in seen.calls] == [
            ("GET", "200"),
            ("GET", "404"),
            ("POST", "201"),
            ("WATCH", "200"),
        ]
        response.release()
        done.set()
    assert all(0 <= seconds < 30 for _, _, seconds in seen.calls)


async def test_a_request_without_an_answer_is_told_as_error() -> None:
    with socket.socket() as holder:  # bound, never listening: the connection is refused
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        seen = Recorder()
        async with kube.Kube(transport.Client(f"http://127.0.0.1:{port}"), observer=seen) as api:
            with pytest.raises(kube.CONNECTION_ERRORS):
                await api.patch("/api/v1/nodes/a", {"metadata": {}})
    assert [(verb, code) for verb, code, _ in seen.calls] == [("PATCH", kube.NO_ANSWER)]


def test_a_verb_is_the_method_and_watch_for_a_watching_get() -> None:
    assert verb_of("get") == "GET"
    assert verb_of("GET", {"watch": "true", "resourceVersion": "5"}) == "WATCH"
    assert verb_of("GET", {"watch": False}) == "GET"
    assert verb_of("DELETE", {"watch": True}) == "DELETE"


def test_api_requests_count_by_verb_and_code_and_time_by_verb() -> None:
    registry = CollectorRegistry()
    requests = metrics.ApiRequests(registry)
    observer: kube.RequestObserver = requests  # what a component passes to its client
    observer("GET", "200", 0.003)
    observer("GET", "200", 0.2)
    observer("PUT", "409", 0.02)
    observer("WATCH", kube.NO_ANSWER, 0.01)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("dra_gpu_api_requests_total", verb="GET", code="200") == 2
    assert value("dra_gpu_api_requests_total", verb="PUT", code="409") == 1
    assert value("dra_gpu_api_requests_total", verb="WATCH", code="<error>") == 1
    assert value("dra_gpu_api_request_duration_seconds_count", verb="GET") == 2
    assert value("dra_gpu_api_request_duration_seconds_bucket", verb="GET", le="0.005") == 1
    assert value("dra_gpu_api_request_duration_seconds_sum", verb="PUT") == pytest.approx(0.02)

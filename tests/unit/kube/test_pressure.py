"""``kube.Kube`` under pressure, against a scripted API server that answers as the real one does
when it is loaded, restarting or has moved on (``tests.support.api_servers``): one test per rule
the client follows from client-go (``kube.retries``: Retry-After; ``kube.throttling``: the rate
limit; ``kube.backoff``: back-off with jitter, in the client and in the agent's lock;
``kube.watch``: a broken watch resumes, only 410 relists, random timeouts) and the paging of
every list. Time is a ``FakeTime``: every wait is recorded, none is slept."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import config, kube
from dra_gpu.agent import cdi, commits, runner, status
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.controller import wiring
from dra_gpu.kube import backoff, retries, throttling, transport, watch
from dra_gpu.resource import bodies
from dra_gpu.testing import eventually
from tests.support.api_servers import (
    FakeTime,
    Reply,
    Request,
    Script,
    bookmark,
    error_event,
    event,
    gone,
    internal_error,
    listing,
    ok,
    read_request,
    scripted_api,
    serving,
    stream,
    too_many_requests,
    unavailable,
    watch_list_refused,
    watch_listed,
)

PODS = "/api/v1/pods"
DRIVER = "gpu.example.com"
NODE = "node-01"


async def collect(stream_: Any, count: int, *, until: str | None = None) -> list[tuple[str, str]]:
    """The first ``count`` items of a ``watch_forever`` (or up to the one named ``until``), as
    ``(kind, name or resourceVersion)``; the stream is closed after."""
    seen: list[tuple[str, str]] = []
    try:
        async for kind, obj in stream_:
            meta = obj.get("metadata", {})
            seen.append((kind, meta.get("name") or meta.get("resourceVersion", "")))
            if len(seen) == count or (until is not None and seen[-1][1] == until):
                break
    finally:
        await stream_.aclose()
    return seen


def versions(requests: list[Request]) -> list[str]:
    return [r.query["resourceVersion"] for r in requests]


# ---- 1. Retry-After: 429 and 5xx that carry it are sent again, as client-go's WithRetry ----


async def test_a_get_answered_429_waits_its_retry_after_and_is_sent_again() -> None:
    time = FakeTime()
    script = Script(GET=[too_many_requests(3), unavailable(retry_after=2), ok({"kind": "Node"})])
    async with scripted_api(script, timing=time.timing) as api:
        assert await api.get("/api/v1/nodes/a") == {"kind": "Node"}
    assert time.slept == [3.0, 2.0]
    assert len(script.requests) == 3


@pytest.mark.parametrize(
    ("reply", "sent"),
    [
        (too_many_requests(1), 2),  # the server did nothing and says when: again
        (unavailable(retry_after=1), 2),  # a 5xx with Retry-After: client-go sends writes again
        (unavailable(), 1),  # a 5xx without it: the caller hears at once
        (internal_error(), 1),
        (too_many_requests(None), 1),  # checkWait needs the header, for 429 too
    ],
)
async def test_a_write_is_sent_again_only_when_the_server_said_when(
    reply: Reply, sent: int
) -> None:
    time = FakeTime()
    script = Script(POST=[reply, ok({"kind": "Event"})])
    async with scripted_api(script, timing=time.timing) as api:
        if sent == 2:
            assert await api.create("/api/v1/namespaces/ns/events", {}) == {"kind": "Event"}
        else:
            with pytest.raises(kube.ApiError) as raised:
                await api.create("/api/v1/namespaces/ns/events", {})
            assert raised.value.status == reply.code
    assert len(script.requests) == sent
    assert time.slept == [1.0] * (sent - 1)


async def test_a_request_is_sent_again_at_most_ten_times() -> None:
    time = FakeTime()
    script = Script(GET=[too_many_requests(1)])
    async with scripted_api(script, timing=time.timing) as api:
        with pytest.raises(kube.ApiError) as raised:
            await api.get("/api/v1/nodes/a")
    assert (raised.value.status, raised.value.retry_after) == (429, 1.0)
    assert len(script.requests) == 1 + retries.MAX_RETRIES == 11
    assert time.slept == [1.0] * 10


async def test_a_retry_after_too_long_to_wait_inside_a_request_goes_to_the_caller() -> None:
    time = FakeTime()
    script = Script(GET=[too_many_requests(120), ok({})])
    async with scripted_api(script, timing=time.timing) as api:
        with pytest.raises(kube.ApiError) as raised:
            await api.get("/api/v1/nodes/a")
    assert raised.value.retry_after == 120.0  # a loop above (a watch) waits it itself
    assert (len(script.requests), time.slept) == (1, [])


async def test_a_read_whose_connection_closed_unanswered_is_sent_again_a_write_is_not() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader, server)
        if n % 2 == 1:  # the even ones close before answering (an API server going away)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")

    time = FakeTime()
    async with (
        serving(handler) as server,
        kube.Kube(transport.Client(server.url()), timing=time.timing) as api,
    ):
        assert await api.get("/api/v1/nodes/a") == {}
        assert (len(server.requests), time.slept) == (2, [retries.NO_ANSWER_WAIT])
        with pytest.raises(transport.ConnectionClosed):
            await api.patch("/api/v1/nodes/a", {"metadata": {}})  # may have been applied
        assert (len(server.requests), time.slept) == (3, [retries.NO_ANSWER_WAIT])


def test_retry_after_is_read_as_client_go_reads_it() -> None:
    assert retries.after_answer(429, "3") == 3.0
    assert retries.after_answer(503, "-2") == 0.0
    assert retries.after_answer(429, None) is None
    assert retries.after_answer(503, "Wed, 21 Oct 2026 07:28:00 GMT") is None  # Atoi refuses
    assert retries.after_answer(404, "3") is None  # only 429 and 5xx
    assert retries.after_error("POST", transport.ConnectionClosed("x")) is None
    assert retries.after_error("GET", ConnectionRefusedError()) is None  # nothing answered
    assert retries.after_error("WATCH", TimeoutError()) == 1.0


# ---- 2. A token bucket per process: burst, then qps; watches are not throttled ---------------


async def test_the_rate_limit_lets_a_burst_through_then_spaces_requests_by_one_over_qps() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    frozen = backoff.Timing(clock=lambda: 0.0, sleep=sleep)
    bucket = throttling.TokenBucket(qps=10, burst=3, timing=frozen)
    assert await asyncio.gather(*(bucket.wait() for _ in range(5))) == pytest.approx(
        [0, 0, 0, 0.1, 0.2]
    )
    assert waits == pytest.approx([0.1, 0.2])  # each takes its turn, first come first served


async def test_every_request_but_a_watch_waits_for_the_rate_limit() -> None:
    time = FakeTime()
    limiter = throttling.TokenBucket(qps=5, burst=2, timing=time.timing)
    script = Script(GET=[ok({})], WATCH=[stream(event("ADDED", "a", "6"))])
    async with scripted_api(script, timing=time.timing, limiter=limiter) as api:
        for _ in range(4):
            await api.get("/api/v1/nodes/a")
        assert time.slept == pytest.approx([0.2, 0.2])
        async for _event in api.watch_once(PODS, "5"):
            pass
    assert time.slept == pytest.approx([0.2, 0.2])  # the watch did not wait
    assert limiter.waited_seconds == pytest.approx(0.4)


async def test_a_client_limited_apart_has_its_own_bucket_over_the_same_connections() -> None:
    time = FakeTime()
    limiter = throttling.TokenBucket(qps=5, burst=1, timing=time.timing)
    script = Script(GET=[ok({})], POST=[ok({})])
    async with scripted_api(script, timing=time.timing, limiter=limiter) as api:
        events = api.limited(10, 2, "--event-qps, --event-burst")
        assert events.limiter is not None
        assert events.limiter.flags.startswith("--event-qps")
        await api.get("/api/v1/nodes/a")  # the main bucket's one token
        for _ in range(3):
            await events.create("/api/v1/namespaces/ns/events", {})  # 2 at once, then 10/s
        assert time.slept == pytest.approx([0.1])
        await api.get("/api/v1/nodes/a")  # waits for its own bucket only
        assert time.slept == pytest.approx([0.1, 0.1])  # 0.2 s after the first, 0.1 s passed
        assert events.http is api.http
        assert api.limited(0, 0, "").limiter is None  # 0: no limit


async def test_connect_sets_the_rate_limit_and_zero_turns_it_off(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        ' "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],'
        ' "users": [{"name": "u", "user": {}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}'
    )
    async with await kube.Kube.connect(kubeconfig, qps=20, burst=40) as api:
        assert api.limiter is not None
        assert (api.limiter.qps, api.limiter.burst) == (20, 40)
    async with await kube.Kube.connect(kubeconfig) as api:
        assert api.limiter is None


def test_the_rate_limit_settings_default_per_process_and_come_from_flags_or_env() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.AgentSettings)
    args = parser.parse_args(["--node-name", "n", "--backend", "nvml", "--api-qps", "7.5"])
    agent = config.settings_from(config.AgentSettings, args, {"DRA_GPU_API_BURST": "9"})
    assert (agent.api_qps, agent.api_burst) == (7.5, 9)
    defaults = config.AgentSettings(node_name="n", backend="nvml")
    assert (defaults.api_qps, defaults.api_burst) == (50.0, 100)
    controller = config.ControllerSettings()
    assert (controller.api_qps, controller.api_burst) == (50.0, 100)
    assert (controller.event_qps, controller.event_burst) == (100.0, 200)  # Events apart
    with pytest.raises(ValueError, match="--event-burst / DRA_GPU_EVENT_BURST: a burst of 0"):
        config.ControllerSettings(event_burst=0)
    with pytest.raises(ValueError, match="--api-burst / DRA_GPU_API_BURST: a burst of 0"):
        config.ControllerSettings(api_burst=0)
    with pytest.raises(ValueError, match="--api-qps / DRA_GPU_API_QPS: -1 requests"):
        config.AgentSettings(node_name="n", backend="nvml", api_qps=-1)
    assert config.ControllerSettings(api_qps=0, api_burst=0).api_qps == 0  # no limit


# ---- 3. One back-off with jitter, as wait.Backoff, for every retry loop ----------------------


def test_the_back_off_doubles_to_its_cap_and_its_jitter_never_compounds() -> None:
    policy = backoff.Backoff(duration=0.8, factor=2.0, jitter=1.0, cap=30.0)
    calm = policy.delays(backoff.Timing(random=lambda: 0.0))
    assert [calm.next() for _ in range(9)] == pytest.approx(
        [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30, 30]
    )
    drawn = policy.delays(backoff.Timing(random=lambda: 0.5))
    assert [drawn.next() for _ in range(3)] == pytest.approx([1.2, 2.4, 4.8])
    steps = backoff.Backoff(duration=1, factor=3, jitter=0, steps=2).delays()
    assert [steps.next() for _ in range(4)] == [1, 3, 9, 9]  # grows twice, then stays


def test_kopfs_retries_of_a_failed_request_are_on_the_back_off_drawn_anew_per_request() -> None:
    retries_ = wiring._Retries()
    assert len(retries_) == 3  # Kopf counts the tries it logs from this
    drawn = [list(retries_) for _ in range(20)]  # Kopf iterates it once per request
    for delays in drawn:
        for delay, base in zip(delays, (1.0, 2.0, 4.0), strict=True):
            assert base <= delay <= 1.5 * base
    assert len({tuple(d) for d in drawn}) > 1  # each request its own jitter


async def test_the_back_off_starts_over_after_two_quiet_minutes() -> None:
    time = FakeTime(draw=0.0)
    delays = watch.BACKOFF.delays(time.timing, reset_after=watch.BACKOFF_RESET)
    assert [await delays.wait() for _ in range(3)] == pytest.approx([0.8, 1.6, 3.2])
    time.now += 121  # healthy for a while
    assert delays.next() == pytest.approx(0.8)
    assert await delays.wait(at_least=5.0) == 5.0  # the server's Retry-After, when longer


async def test_the_serialize_lock_is_polled_with_a_jittered_back_off(tmp_path: Path) -> None:
    path = tmp_path / "serialize.lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # another agent holds the lock
    fcntl.flock(other, fcntl.LOCK_EX)
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 6:
            fcntl.flock(other, fcntl.LOCK_UN)  # it lets go

    lock = commits.SerializeLock(path, timing=backoff.Timing(sleep=sleep, random=lambda: 1.0))
    try:
        async with lock.held():
            assert lock.locked
    finally:
        lock.close()
        os.close(other)
    # 2 ms doubling to the 50 ms cap, each up to half again (the jitter drew its maximum)
    assert pauses == pytest.approx([0.003, 0.006, 0.012, 0.024, 0.048, 0.075])


async def test_waiting_for_the_api_server_backs_off_with_jitter_and_honours_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    script = Script(GET=[unavailable(), too_many_requests(5), ok({})])
    async with scripted_api(script, timing=time.timing) as api:
        assert await api.wait_until_ready(asyncio.Event())
    assert time.slept == pytest.approx([1.25, 5.0])  # 1 s and half of its jitter; then 5 s
    assert len(script.requests) == 3  # the probe itself sends nothing again
    said = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert said[0].endswith("attempt 1, next in 1 s (+0.2 s jitter)")
    assert said[1].endswith("attempt 2, next in 5 s (its Retry-After)")


async def test_the_status_writer_backs_off_while_writes_fail_and_starts_over_after_one_works() -> (
    None
):
    script = Script(PATCH=[internal_error(), internal_error(), ok({}), internal_error(), ok({})])
    ref = ClaimRef("ns", "c", bodies.ClaimUID("u1"))
    entry = {"driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    async with scripted_api(script) as api:
        policy = backoff.Backoff(duration=0.01, jitter=0.0)
        writer = status.StatusWriter(api, NODE, delay_seconds=0.0, retry=policy)
        task = asyncio.create_task(writer.run_forever())
        try:
            writer.set_devices(ref, [entry])
            await eventually(lambda: writer.pending() == 0, what="written after two failures")
            assert len(script.of("PATCH")) == 3
            assert writer.retries.taken == 0  # the write that worked started it over
            writer.set_devices(ref, [])
            await eventually(lambda: writer.pending() == 0, what="removed after one failure")
            assert writer.retries.base == 0.01  # the failure after it: the first delay again
        finally:
            task.cancel()
    assert len(script.of("PATCH")) == 5


# ---- 4. A broken watch resumes from its resourceVersion; only 410 relists ---------------------


async def test_a_watch_broken_by_a_5xx_a_cut_stream_or_an_error_event_resumes_where_it_was() -> (
    None
):
    time = FakeTime()
    script = Script(
        GET=[listing([], "5")],
        WATCH=[
            internal_error(),  # the request: 500, no Retry-After
            stream(event("ADDED", "a", "6"), end="cut"),  # the connection cut mid-stream
            stream(bookmark("8"), error_event(500, "InternalError")),
            stream(event("MODIFIED", "a", "9"), end="hold"),
        ],
    )
    calls: list[str] = []
    async with scripted_api(script, timing=time.timing) as api:
        seen = await collect(
            api.watch_forever(
                PODS,
                on_break=lambda: calls.append("break"),
                on_resume=lambda: calls.append("resume"),
            ),
            3,
        )
    assert seen == [("SYNC", "5"), ("ADDED", "a"), ("MODIFIED", "a")]
    assert len(script.of("GET")) == 1  # never listed again
    assert versions(script.of("WATCH")) == ["5", "5", "6", "8"]  # the bookmark's version too
    assert time.slept == pytest.approx([1.2, 2.4, 4.8])  # 0.8 s doubling, jitter drawn 0.5
    assert calls == ["break", "resume"] * 3


async def test_a_watch_answered_429_waits_as_the_server_asks_then_resumes() -> None:
    time = FakeTime()
    script = Script(
        GET=[listing([], "5")],
        WATCH=[
            too_many_requests(7),  # the request waits 7 s and is sent again (WithRetry)
            too_many_requests(None),  # no Retry-After: the watch loop backs off
            stream(error_event(429, "TooManyRequests", retryAfterSeconds=9)),
            stream(event("ADDED", "a", "6"), end="hold"),
        ],
    )
    async with scripted_api(script, timing=time.timing) as api:
        seen = await collect(api.watch_forever(PODS), 2)
    assert seen == [("SYNC", "5"), ("ADDED", "a")]
    assert versions(script.of("WATCH")) == ["5", "5", "5", "5"]
    assert len(script.of("GET")) == 1
    assert time.slept == pytest.approx([7.0, 1.2, 9.0])  # the ERROR event's retryAfterSeconds


async def test_only_410_gone_lists_again_and_after_a_back_off() -> None:
    time = FakeTime()
    script = Script(
        GET=[listing([], "5"), listing([], "20"), listing([], "30")],
        WATCH=[
            stream(event("ADDED", "a", "6"), error_event(410, "Expired")),  # in the stream
            gone("20"),  # the watch request itself
            stream(event("ADDED", "b", "31"), end="hold"),
        ],
    )
    calls: list[str] = []
    async with scripted_api(script, timing=time.timing) as api:
        seen = await collect(
            api.watch_forever(
                PODS,
                on_break=lambda: calls.append("break"),
                on_resume=lambda: calls.append("resume"),
            ),
            5,
        )
    assert seen == [("SYNC", "5"), ("ADDED", "a"), ("SYNC", "20"), ("SYNC", "30"), ("ADDED", "b")]
    assert versions(script.of("WATCH")) == ["5", "20", "30"]
    assert time.slept == pytest.approx(
        [1.2, 2.4]
    )  # a fleet told 410 at once does not relist at once
    assert calls == ["break", "break"]  # relisted: nothing resumed


async def test_a_watch_that_ends_at_once_without_an_event_broke_one_that_had_events_did_not() -> (
    None
):
    time = FakeTime()
    script = Script(
        GET=[listing([], "5")],
        WATCH=[stream(), stream(bookmark("7")), stream(event("ADDED", "a", "8"), end="hold")],
    )
    async with scripted_api(script, timing=time.timing) as api:
        seen = await collect(api.watch_forever(PODS), 2)
    assert seen == [("SYNC", "5"), ("ADDED", "a")]
    assert versions(script.of("WATCH")) == ["5", "5", "7"]
    assert time.slept == pytest.approx([1.2])  # only the empty, immediate end backed off


async def test_watch_timeouts_are_random_between_five_and_ten_minutes() -> None:
    draws = iter([0.0, 0.999, 0.5])
    timing = backoff.Timing(random=lambda: next(draws))
    assert [watch.random_timeout(timing) for _ in range(3)] == [300, 599, 450]
    time = FakeTime(draw=0.25)
    script = Script(GET=[listing([], "5")], WATCH=[stream(event("ADDED", "a", "6"), end="hold")])
    async with scripted_api(script, timing=time.timing) as api:
        await collect(api.watch_forever(PODS), 2)
    assert script.of("WATCH")[0].query["timeoutSeconds"] == "375"  # 300 * (1 + 0.25)
    assert script.of("WATCH")[0].query["allowWatchBookmarks"] == "true"


async def states_and_events(stream_: Any, count: int) -> list[tuple[str, list[str] | str]]:
    """The first ``count`` items of a ``watch_forever``: a state (``SYNC``, ``PAGE``) as the
    names it holds, an event as its object's name; the stream is closed after."""
    seen: list[tuple[str, list[str] | str]] = []
    try:
        async for kind, obj in stream_:
            if kind in ("SYNC", "PAGE"):
                seen.append((kind, [item["metadata"]["name"] for item in obj["items"]]))
            else:
                seen.append((kind, obj["metadata"]["name"]))
            if len(seen) == count:
                break
    finally:
        await stream_.aclose()
    return seen


def named(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


async def test_a_watch_list_sends_the_state_then_events_and_after_any_break_the_state_again() -> (
    None
):
    time = FakeTime()
    script = Script(
        WATCH=[
            watch_listed([named("a", "5")], "6", event("MODIFIED", "b", "7"), end="cut"),
            unavailable(),  # 503, no Retry-After
            watch_listed([named("a", "5"), named("b", "7")], "8", end="end"),  # at once: broke
            watch_listed([named("b", "7")], "9"),
        ]
    )
    calls: list[str] = []
    async with scripted_api(script, timing=time.timing) as api:
        seen = await states_and_events(
            api.watch_forever(
                PODS,
                watch_list=True,
                on_break=lambda: calls.append("break"),
                on_resume=lambda: calls.append("resume"),
            ),
            4,
        )
    assert seen == [("SYNC", ["a"]), ("MODIFIED", "b"), ("SYNC", ["a", "b"]), ("SYNC", ["b"])]
    assert script.of("GET") == []  # never a list, never a watch from an old resourceVersion
    for request in script.of("WATCH"):
        assert request.query["sendInitialEvents"] == "true"
        assert request.query["resourceVersionMatch"] == "NotOlderThan"
        assert request.query.get("resourceVersion", "") == ""  # the newest state
        assert request.query["allowWatchBookmarks"] == "true"
    assert calls == ["break"] * 3  # nothing resumed: every state is whole
    assert time.slept == pytest.approx([1.2, 2.4, 4.8])  # the same back-off as a watch's


async def test_a_watch_lists_state_comes_in_pages_when_asked() -> None:
    script = Script(WATCH=[watch_listed([named(n, "5") for n in "abc"], "6")])
    async with scripted_api(script, timing=FakeTime().timing) as api:
        seen = await states_and_events(api.watch_forever(PODS, watch_list=True, page_size=2), 3)
    assert seen == [("PAGE", ["a", "b"]), ("PAGE", ["c"]), ("SYNC", [])]


async def test_a_server_that_refuses_watch_lists_is_listed_and_watched_instead() -> None:
    time = FakeTime()
    script = Script(
        GET=[listing([named("a", "5")], "5")],
        WATCH=[watch_list_refused(), stream(event("ADDED", "b", "6"), end="hold")],
    )
    async with scripted_api(script, timing=time.timing) as api:
        seen = await states_and_events(api.watch_forever(PODS, watch_list=True), 2)
    assert seen == [("SYNC", ["a"]), ("ADDED", "b")]
    refused, watched = script.of("WATCH")
    assert refused.query["sendInitialEvents"] == "true"
    assert "sendInitialEvents" not in watched.query
    assert watched.query["resourceVersion"] == "5"
    assert time.slept == []


# ---- 5. Every list paged ----------------------------------------------------------------------


def claim(name: str, device: str = "gpu-0") -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def test_a_corrupt_checkpoint_is_rebuilt_from_claims_listed_page_by_page(
    tmp_path: Path,
) -> None:
    settings = config.AgentSettings(
        node_name=NODE, backend="nvml", cdi_dir=tmp_path / "cdi", checkpoint_dir=tmp_path
    )
    for name, device in (("a", "gpu-0"), ("c", "gpu-1")):
        spec = cdi.claim_spec(DRIVER, f"uid-{name}", [(device, {"GPU": device})])
        cdi.write_claim_spec(settings.cdi_dir, spec, claim_uid=f"uid-{name}")
    script = Script(
        GET=[
            listing([claim("a")], "5", more="p2"),
            listing([claim("b"), claim("c", "gpu-1")], "5"),
        ]
    )
    async with scripted_api(script) as api:
        rebuilt = await runner.rebuild_checkpoint(settings, api)
    assert sorted(rebuilt.claims) == ["uid-a", "uid-c"]  # c only on the second page
    lists = script.of("GET")
    assert [r.query.get("limit") for r in lists] == ["500", "500"]
    assert [r.query.get("continue") for r in lists] == [None, "p2"]


class Arrivals(Script):
    """A script that tells the test of every request as it arrives."""

    def __init__(self, **replies: Any) -> None:
        super().__init__(**replies)
        self.arrived = asyncio.Event()

    def reply(self, request: Request) -> Reply:
        self.arrived.set()
        return super().reply(request)


async def test_a_slow_list_is_read_one_page_at_a_time() -> None:
    first_page = asyncio.Event()
    script = Arrivals(
        GET=[
            Reply(200, listing([{"n": 1}], "5", more="p2").body, hold=first_page),
            listing([{"n": 2}], "5"),
        ]
    )
    async with scripted_api(script) as api:
        items: list[Any] = []

        async def read() -> None:
            async for page in api.pages("/api/v1/things", page_size=1):
                items.extend(page["items"])

        reading = asyncio.create_task(read())
        await script.arrived.wait()
        for _ in range(20):  # let the client run: it must not ask for more meanwhile
            await asyncio.sleep(0)
        assert len(script.requests) == 1
        assert not items
        first_page.set()
        await reading
    assert items == [{"n": 1}, {"n": 2}]
    assert [r.query.get("continue") for r in script.requests] == [None, "p2"]

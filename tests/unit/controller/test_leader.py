"""Leader election's timing rules (``controller.leader``), client-go's: the pure rules with an
injected clock (observed-time expiry, whatever the holder's ``renewTime`` says); the leader's
renew deadline (a renewal that hangs ends the leadership exactly at the deadline, ``changed``
is set, ``acting`` cancels what was in flight); and two electors sharing one Lease on a
scripted API server on loopback (``tests.support.api_servers``) that keeps the Lease as the
real one would (404, 409 on a stale resourceVersion, a watch), whose answers to replica A the
test can stop: A stops leading before B takes over, and at no sampled moment do both lead."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs

import pytest

from dra_gpu import kube
from dra_gpu.controller import leader
from dra_gpu.controller.leader import LeaderElector, Observation
from dra_gpu.kube import transport
from tests.support.api_servers import (
    LAST_CHUNK,
    answer,
    chunk,
    chunked_head,
    read_request,
    serving,
)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/dra-gpu/leases"
LEASE = f"{LEASES}/controller"
WALL = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def held(by: str, renewed: datetime.datetime = WALL, seconds: int = 15) -> dict[str, Any]:
    return {
        "holderIdentity": by,
        "leaseDurationSeconds": seconds,
        "acquireTime": stamp(renewed),
        "renewTime": stamp(renewed),
        "leaseTransitions": 3,
    }


@dataclasses.dataclass
class Clock:
    """A monotonic clock the test moves."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def leads(elector: LeaderElector) -> bool:
    """``is_leader``, read now (a call: mypy would take two reads of the property for one)."""
    return elector.is_leader


# ---- the pure rules -------------------------------------------------------------------------


def test_a_record_seen_again_keeps_the_time_it_was_first_seen() -> None:
    first = leader.observe(None, held("a"), now=10.0)
    assert first == Observation(held("a"), 10.0)
    assert leader.observe(first, held("a"), now=20.0).at == 10.0
    renewed = held("a", WALL + datetime.timedelta(seconds=2))
    assert leader.observe(first, renewed, now=20.0) == Observation(renewed, 20.0)


@pytest.mark.parametrize(
    "skew",
    [datetime.timedelta(hours=-3), datetime.timedelta(0), datetime.timedelta(days=400)],
    ids=["renewTime-3h-in-the-past", "renewTime-now", "renewTime-a-year-ahead"],
)
def test_expiry_counts_from_when_the_record_was_seen_to_change_never_its_renew_time(
    skew: datetime.timedelta,
) -> None:
    """The holder's wall clock may be hours behind or a year ahead of ours: only how long the
    record has stood still on our clock matters."""
    record = held("a", renewed=datetime.datetime.now(datetime.UTC) + skew, seconds=15)
    seen = leader.observe(None, record, now=100.0)
    assert not leader.expired(seen, 100.0, default_seconds=60)
    assert not leader.expired(seen, 114.9, default_seconds=60)
    assert not leader.expired(seen, 115.0, default_seconds=60)  # expired only once past it
    assert leader.expired(seen, 115.01, default_seconds=60)
    # A renewal seen at 114 starts the count again, whatever renewTime it carries.
    again = leader.observe(seen, {**record, "renewTime": stamp(WALL)}, now=114.0)
    assert not leader.expired(again, 128.0, default_seconds=60)
    assert leader.expired(again, 129.5, default_seconds=60)


def test_a_released_lease_is_free_at_once_and_a_record_without_duration_uses_ours() -> None:
    released = {**held("a"), "holderIdentity": ""}
    assert leader.expired(leader.observe(None, released, now=5.0), 5.0, default_seconds=15)
    no_duration = {k: v for k, v in held("a").items() if k != "leaseDurationSeconds"}
    seen = leader.observe(None, no_duration, now=5.0)
    assert not leader.expired(seen, 19.0, default_seconds=15)
    assert leader.expired(seen, 20.5, default_seconds=15)


def test_a_standby_waits_a_jittered_retry_period_but_never_past_the_expiry() -> None:
    held = {"holderIdentity": "b", "leaseDurationSeconds": 15}
    assert leader.standby_wait(2.0, None, 0.0, 15, lambda: 0.0) == 2.0
    assert leader.standby_wait(2.0, None, 0.0, 15, lambda: 1.0) == pytest.approx(4.4)
    seen = Observation(held, 100.0)
    assert leader.standby_wait(2.0, seen, 101.0, 15, lambda: 0.5) == pytest.approx(3.2)
    # Expires at 115: the standby wakes just after it, whatever the jitter drew.
    assert leader.standby_wait(2.0, seen, 114.0, 15, lambda: 1.0) == pytest.approx(1.001)
    assert leader.standby_wait(2.0, seen, 120.0, 15, lambda: 1.0) == 0.0
    # Released: no expiry to wait for, the watch wakes it on a change.
    free = Observation({"holderIdentity": ""}, 100.0)
    assert leader.standby_wait(2.0, free, 200.0, 15, lambda: 0.0) == 2.0


def test_defaults_are_client_gos_proportions_and_a_deadline_past_the_lease_is_refused() -> None:
    api: Any = None
    elector = LeaderElector(api, namespace="dra-gpu", name="controller", identity="a")
    assert (elector.lease_seconds, elector.renew_deadline, elector.renew_seconds) == (15, 10, 2)
    short = LeaderElector(api, namespace="n", name="l", identity="a", lease_seconds=3)
    assert (short.renew_deadline, short.renew_seconds) == (2, 0.4)
    with pytest.raises(ValueError, match="shorter than the lease"):
        LeaderElector(api, namespace="n", name="l", identity="a", lease_seconds=3, renew_deadline=3)
    with pytest.raises(ValueError, match="shorter than the renew deadline"):
        LeaderElector(api, namespace="n", name="l", identity="a", renew_seconds=10)


# ---- the leader's deadline, with an injected clock -------------------------------------------


class StubApi:
    """The Lease in memory; ``get`` runs ``during_get`` first (a slow or a hanging request)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 1
        self.during_get: Any = None

    async def get(self, path: str) -> dict[str, Any]:
        if self.during_get is not None:
            await self.during_get()
        if self.lease is None:
            raise kube.ApiError("GET", path, 404, {"reason": "NotFound"})
        return json.loads(json.dumps(self.lease))

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._store(body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise kube.ApiError("PUT", path, 409, {"reason": "Conflict"})
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = json.loads(json.dumps(body))
        self.lease.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        return json.loads(json.dumps(self.lease))


def stub_elector(api: StubApi, clock: leader.Clock, **options: Any) -> LeaderElector:
    stub: Any = api
    return LeaderElector(
        stub, namespace="dra-gpu", name="controller", identity="a", clock=clock, **options
    )


async def test_the_leader_leads_until_its_last_renew_plus_the_deadline_not_a_moment_more() -> None:
    clock = Clock()
    api = StubApi()
    elector = stub_elector(api, clock)  # lease 15, deadline 10
    assert not leads(elector)
    assert elector.leading_until() is None
    assert await elector.try_acquire_or_renew()
    assert leads(elector)
    assert elector.changed.is_set()
    assert elector.leading_until() == 1010.0
    elector.changed.clear()
    # The request of a renewal took 4 s: the lease was renewed when it was *sent*.
    clock.now = 1005.0

    async def slow() -> None:
        clock.now += 4.0

    api.during_get = slow
    assert await elector.try_acquire_or_renew()
    assert clock.now == 1009.0
    assert elector.leading_until() == 1015.0
    assert not elector.changed.is_set()  # still leading: nothing to tell
    # No renewal since: read at any moment, is_leader says so by the clock alone.
    clock.now = 1014.999
    assert elector.is_leader
    clock.now = 1015.0
    assert not elector.is_leader


async def test_seeing_another_holder_ends_the_leadership_at_once() -> None:
    clock = Clock()
    api = StubApi()
    elector = stub_elector(api, clock)
    assert await elector.try_acquire_or_renew()
    assert api.lease is not None
    api.lease["spec"] = held("b")  # (an operator edited it by hand)
    clock.now += 1
    assert not await elector.try_acquire_or_renew()
    assert not leads(elector)
    assert elector.leading_until() is None


async def test_a_renewal_that_hangs_ends_the_leadership_at_the_deadline_and_says_so() -> None:
    loop = asyncio.get_running_loop()
    api = StubApi()
    # A clock far from the loop's: only differences count.
    elector = stub_elector(
        api, lambda: loop.time() + 1e6, lease_seconds=1.0, renew_deadline=0.3, renew_seconds=0.1
    )
    assert await elector.attempt()
    renewed = elector.leading_until()
    assert renewed is not None
    assert leads(elector)
    elector.changed.clear()
    hang = asyncio.Event()
    api.during_get = hang.wait
    attempt = asyncio.create_task(elector.attempt())
    await asyncio.wait_for(elector.changed.wait(), 2)
    assert not elector.is_leader
    assert elector.clock() >= renewed
    assert elector.clock() - renewed < 0.2  # at the deadline, not at some request timeout
    assert await attempt is False


async def test_acting_cancels_leader_work_at_the_deadline_and_renewals_extend_it() -> None:
    loop = asyncio.get_running_loop()
    api = StubApi()
    elector = stub_elector(api, loop.time, lease_seconds=1.0, renew_deadline=0.3, renew_seconds=0.1)
    with pytest.raises(leader.NotLeading):
        async with elector.acting():
            pass
    assert await elector.attempt()
    started = loop.time()

    async def renew_twice() -> None:
        for _ in range(2):
            await asyncio.sleep(0.15)
            assert await elector.attempt()

    renewing = asyncio.create_task(renew_twice())
    with pytest.raises(TimeoutError):
        async with elector.acting():
            await asyncio.Event().wait()  # a write that never gets an answer
    await renewing
    # Two renewals at +0.15 and +0.3 kept it going until +0.6, then it ended by itself.
    assert 0.55 < loop.time() - started < 1.0
    assert not elector.is_leader


# ---- two electors, one Lease, on a scripted API server ----------------------------------------


@dataclasses.dataclass
class LeaseServer:
    """The Lease as the API server keeps it, served to each replica on a port of its own;
    ``answering[identity]`` cleared: that replica's requests get no answer (they hang)."""

    objects: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    version: int = 100
    answering: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    watchers: list[asyncio.Queue[dict[str, Any]]] = dataclasses.field(default_factory=list)

    def store(self, path: str, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = obj
        for queue in self.watchers:
            queue.put_nowait({"type": kind, "object": obj})
        return obj

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET":
            if path not in self.objects:
                return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
            return 200, self.objects[path]
        if method == "POST":
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return 409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"}
            return 201, self.store(target, body, "ADDED")
        if method == "PUT":
            current = self.objects.get(path)
            if current is None:
                return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
            return 200, self.store(path, body, "MODIFIED")
        return 405, {"kind": "Status", "code": 405, "reason": "MethodNotAllowed"}

    async def watch(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float
    ) -> None:
        """Events as they happen for ``seconds``, or until the client goes away."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.watchers.append(queue)
        gone = asyncio.ensure_future(reader.read(1))  # the client closed: b""
        writer.write(chunked_head())
        try:
            async with asyncio.timeout(seconds):
                while not gone.done():
                    event = asyncio.ensure_future(queue.get())
                    await asyncio.wait([event, gone], return_when=asyncio.FIRST_COMPLETED)
                    if not event.done():
                        event.cancel()
                        return
                    writer.write(chunk(json.dumps(event.result()).encode() + b"\n"))
                    await writer.drain()
        except TimeoutError:
            pass
        finally:
            self.watchers.remove(queue)
            gone.cancel()
        writer.write(LAST_CHUNK)
        await writer.drain()
        writer.close()  # one watch per connection keeps this script simple


@contextlib.asynccontextmanager
async def replica_api(server: LeaseServer, identity: str) -> AsyncIterator[kube.Kube]:
    answering = server.answering.setdefault(identity, asyncio.Event())
    answering.set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader)
            head, _blank, payload = request.partition(b"\r\n\r\n")
            method, target, _version = head.split(b"\r\n")[0].decode().split(" ")
            path, _mark, query = target.partition("?")
            await answering.wait()  # paused: the request hangs, the connection stays open
            params = parse_qs(query)
            if method == "GET" and params.get("watch") == ["true"]:
                await server.watch(reader, writer, float(params["timeoutSeconds"][0]))
                return
            code, obj = server.answer(method, path, json.loads(payload) if payload else None)
            writer.write(answer(json.dumps(obj).encode(), f"{code} Status"))
            await writer.drain()

    async with serving(handler) as port, kube.Kube(transport.Client(port.url())) as api:
        try:
            yield api
        finally:
            answering.set()  # the scripts that still wait end before the server closes


def replica(api: kube.Kube, identity: str, **timing: Any) -> LeaderElector:
    timing = {"lease_seconds": 1.0, "renew_deadline": 0.5, "renew_seconds": 0.1, **timing}
    return LeaderElector(api, namespace="dra-gpu", name="controller", identity=identity, **timing)


@contextlib.asynccontextmanager
async def running(*electors: LeaderElector) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(e.run_forever(), name=e.identity) for e in electors]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def sample_until(
    done: Callable[[], bool], electors: tuple[LeaderElector, ...], within: float = 5.0
) -> list[tuple[float, tuple[bool, ...]]]:
    """``is_leader`` of each, every 5 ms, until ``done()`` (at most ``within`` s); the
    samples."""
    loop = asyncio.get_running_loop()
    samples: list[tuple[float, tuple[bool, ...]]] = []
    async with asyncio.timeout(within):
        while True:
            samples.append((loop.time(), tuple(e.is_leader for e in electors)))
            if done():
                return samples
            await asyncio.sleep(0.005)


async def sample_for(
    seconds: float, electors: tuple[LeaderElector, ...]
) -> list[tuple[float, tuple[bool, ...]]]:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    return await sample_until(lambda: loop.time() >= end, electors, within=seconds + 1)


async def test_a_leader_whose_requests_hang_stops_before_the_standby_takes_over() -> None:
    server = LeaseServer()
    async with replica_api(server, "a") as api_a, replica_api(server, "b") as api_b:
        a, b = replica(api_a, "a"), replica(api_b, "b")
        assert await a.attempt()  # A first
        async with running(a, b):
            await sample_until(lambda: b.observed is not None, (a, b))
            assert leads(a)
            assert not leads(b)
            # Both keep their roles while A renews: nearly twice the lease.
            steady = await sample_for(1.5, (a, b))
            assert {leading for _t, leading in steady} == {(True, False)}
            server.answering["a"].clear()  # A's requests go unanswered from now
            paused = asyncio.get_running_loop().time()
            samples = await sample_until(lambda: b.is_leader, (a, b))
    assert [t for t, leading in samples if all(leading)] == []  # never both
    a_stopped = next(t for t, (leading_a, _) in samples if not leading_a)
    b_started = next(t for t, (_, leading_b) in samples if leading_b)
    assert a_stopped < b_started
    # A stopped within its deadline of its last renewal (renewals every 0.1 s); B waited for
    # the record to stand still for the lease's 1 s.
    assert a_stopped - paused <= 0.5 + 0.1 + 0.2  # (+ a busy machine's lateness)
    assert b_started - a_stopped >= 0.4
    assert server.objects[LEASE]["spec"]["holderIdentity"] == "b"
    assert server.objects[LEASE]["spec"]["leaseTransitions"] == 1


async def test_failover_after_failover_never_two_leaders() -> None:
    """Five rounds (the e2e does twenty, with real processes). The paused one alternates; it
    answers again before the next round, finds the lease
    taken and stays a standby until it is its turn."""
    server = LeaseServer()
    overlaps = 0
    async with replica_api(server, "a") as api_a, replica_api(server, "b") as api_b:
        electors = (replica(api_a, "a"), replica(api_b, "b"))
        async with running(*electors):
            await sample_until(lambda: any(e.is_leader for e in electors), electors)
            for _round in range(5):
                old = next(e for e in electors if e.is_leader)
                new = next(e for e in electors if e is not old)
                server.answering[old.identity].clear()
                samples = await sample_until(functools.partial(leads, new), electors)
                overlaps += sum(1 for _t, leading in samples if all(leading))
                server.answering[old.identity].set()
                await asyncio.sleep(0.2)  # its hung requests end; it sees B hold the lease
                assert leads(new)
                assert not leads(old)
    assert overlaps == 0
    assert server.objects[LEASE]["spec"]["leaseTransitions"] == 5


async def test_a_released_lease_is_taken_over_at_once_through_the_watch() -> None:
    server = LeaseServer()
    async with replica_api(server, "a") as api_a, replica_api(server, "b") as api_b:
        # A long lease and slow retries: only the watch can explain a quick takeover.
        a = replica(api_a, "a", lease_seconds=30.0, renew_deadline=20.0, renew_seconds=5.0)
        b = replica(api_b, "b", lease_seconds=30.0, renew_deadline=20.0, renew_seconds=5.0)
        assert await a.attempt()
        async with running(b):
            await sample_until(lambda: b._seen is not None, (a, b))
            await asyncio.sleep(0.1)  # B is in its watch
            loop = asyncio.get_running_loop()
            released = loop.time()
            await a.release()
            assert not leads(a)
            assert a.changed.is_set()
            await sample_until(lambda: b.is_leader, (a, b), within=2.0)
            assert loop.time() - released < 1.0
    spec = server.objects[LEASE]["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1


async def test_two_replicas_racing_to_create_the_lease_make_one_leader() -> None:
    server = LeaseServer()
    async with replica_api(server, "a") as api_a, replica_api(server, "b") as api_b:
        a, b = replica(api_a, "a"), replica(api_b, "b")
        won = await asyncio.gather(a.attempt(), b.attempt())
    assert sorted(won) == [False, True]
    assert [leads(a), leads(b)] == list(won)

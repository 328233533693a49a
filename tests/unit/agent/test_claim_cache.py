"""Which claims the agent reads as this node's pods arrive, and when prepare may use the copy
instead of a GET (``agent.podclaims``, ``agent.claimcache``): first the decisions, pods and
claims in, no server; then the cache on a scripted API server, as the real one answers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import kube
from dra_gpu.agent import checkpoint, claimcache, claims
from dra_gpu.agent.claimcache import ClaimCache, Reading, ours
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.podclaims import ClaimKey, NodePods, claim_names, pod_claims
from dra_gpu.agent.state import Prepared
from dra_gpu.devices import simulated
from dra_gpu.resource import bodies
from dra_gpu.resource.bodies import ClaimUID
from dra_gpu.serving import metrics
from dra_gpu.testing import eventually
from tests.support.api_servers import (
    FakeTime,
    Reply,
    Request,
    Routed,
    internal_error,
    listing,
    ok,
    scripted_api,
    stream,
    watch_list_refused,
    watch_listed,
)
from tests.unit.agent import rig

DRIVER, NODE = "gpu.example.com", "node-01"
REF = ClaimRef("ns", "c", ClaimUID("u1"))
C, D = ClaimKey("ns", "c"), ClaimKey("ns", "d")


def claim(
    *,
    uid: str = "u1",
    name: str = "c",
    pool: str = NODE,
    driver: str = DRIVER,
    device: str = "gpu-0",
    holders: Sequence[str] = ("pod-1",),
    allocated: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        result = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
        status["allocation"] = {"devices": {"results": [result], "config": []}}
    if holders:
        status["reservedFor"] = [{"resource": "pods", "name": f"p-{u}", "uid": u} for u in holders]
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ns",
            "name": name,
            "resourceVersion": "1",
            "managedFields": [{"manager": "kube-scheduler"}],
        },
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": status,
    }


def pod(
    uid: str = "pod-1",
    *named: str,
    generated: Sequence[str] = (),
    phase: str = "Pending",
    deleting: bool = False,
    rv: str = "1",
) -> dict[str, Any]:
    """A pod bound to the node that uses the claims ``named`` (``c`` if none is given) and those
    generated for it under the names ``generated``."""
    named = named or ("c",)
    entries: list[dict[str, Any]] = [
        {"name": f"ref-{n}", "resourceClaimName": n} for n in named if n
    ]
    entries += [{"name": f"gen-{n}", "resourceClaimTemplateName": "t"} for n in generated]
    meta: dict[str, Any] = {
        "uid": uid,
        "namespace": "ns",
        "name": f"p-{uid}",
        "resourceVersion": rv,
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if generated:
        status["resourceClaimStatuses"] = [
            {"name": f"gen-{n}", "resourceClaimName": n} for n in generated
        ]
    return {
        "metadata": meta,
        "spec": {"nodeName": NODE, "resourceClaims": entries, "containers": [{"name": "main"}]},
        "status": status,
    }


def listed(*pods: dict[str, Any]) -> tuple[ClaimCache, list[Reading]]:
    """A cache that listed ``pods`` (one page), and the reads it asked for."""
    cache = ClaimCache(DRIVER, NODE)
    cache.page(list(pods))
    return cache, cache.synced()


def keys(readings: Sequence[Reading]) -> list[ClaimKey]:
    return [r.key for r in readings]


def answer(cache: ClaimCache, readings: Sequence[Reading], *bodies_: dict[str, Any] | None) -> None:
    for reading, body in zip(readings, bodies_, strict=True):
        cache.answered(reading, body)


def devices(body: dict[str, Any] | None, ref: ClaimRef = REF) -> list[str]:
    assert body is not None
    return [d.device for d in claims.allocated_devices(body, ref, DRIVER, NODE)]


# ---- which claims a pod uses, and where it is in its life ------------------------------------


def test_a_pod_uses_its_named_claims_and_the_generated_ones_its_status_names() -> None:
    body = pod("pod-1", "c", "d", generated=("p-gpu-x7k2q",))
    assert claim_names(body) == ["c", "d", "p-gpu-x7k2q"]
    assert pod_claims(body).claims == {C, D, ClaimKey("ns", "p-gpu-x7k2q")}


def test_a_generated_claim_is_unknown_until_the_status_names_it_and_none_may_be_needed() -> None:
    body = pod("pod-1", "", generated=("p-gpu-1",))
    body["status"].pop("resourceClaimStatuses")  # the resourceclaim controller has not made it
    assert claim_names(body) == []
    body["status"]["resourceClaimStatuses"] = [{"name": "gen-p-gpu-1"}]  # none was needed
    assert claim_names(body) == []
    assert claim_names({}) == []


def test_a_name_the_api_server_would_refuse_never_becomes_a_claim_to_read() -> None:
    assert pod_claims(pod("pod-1", "../secrets", "C")).claims == frozenset()
    body = pod("pod-1", "c")
    body["metadata"]["namespace"] = "a/b"
    assert pod_claims(body).claims == frozenset()


@pytest.mark.parametrize(
    ("phase", "deleting", "active", "starting"),
    [
        ("Pending", False, True, True),
        ("Running", False, True, False),
        ("Succeeded", False, False, False),
        ("Failed", False, False, False),
        ("Pending", True, False, False),
    ],
)
def test_a_pod_holds_its_claims_until_it_finishes_or_is_deleted(
    phase: str, deleting: bool, active: bool, starting: bool
) -> None:
    seen = pod_claims(pod("pod-1", phase=phase, deleting=deleting))
    assert (seen.active, seen.starting) == (active, starting)


def test_a_claim_is_released_when_the_last_active_pod_that_uses_it_goes() -> None:
    pods = NodePods([pod_claims(pod("pod-1", "c", "d")), pod_claims(pod("pod-2", "c"))])
    assert pods.starting() == {C, D}
    assert pods.remove("pod-1") == {D}  # pod-2 still uses c
    assert pods.used(C)
    assert not pods.used(D)
    assert pods.put(pod_claims(pod("pod-2", "c", phase="Succeeded"))) == {C}
    assert len(pods) == 0
    assert pods.remove("pod-3") == set()


# ---- what is read, and when a copy may be used ----------------------------------------------


def test_a_pod_still_to_start_gets_each_of_its_claims_read_once_and_a_running_one_none() -> None:
    cache, readings = listed(pod("pod-1", "c", "d"), pod("pod-2", "e", phase="Running"))
    assert keys(readings) == [C, D]
    assert cache.apply("MODIFIED", pod("pod-1", "c", "d", rv="2")) == []  # being read
    assert cache.apply("MODIFIED", pod("pod-2", "e", phase="Running", rv="2")) == []


def test_a_claim_reserved_for_a_pod_of_the_node_is_served_with_what_prepare_reads() -> None:
    cache, readings = listed(pod())
    answer(cache, readings, claim())
    body = cache.lookup(REF)
    assert devices(body) == ["gpu-0"]
    assert body is not None
    claims.check_identity(body, REF)
    assert bodies.allocation_configs(body) == []
    assert "managedFields" not in body["metadata"]
    assert "spec" not in body
    assert len(cache) == 1
    assert cache.apply("MODIFIED", pod(rv="2")) == []  # read: not read again


def test_a_copy_keeps_only_our_drivers_results_and_the_pods_it_is_reserved_for() -> None:
    body = claim(holders=("pod-1", "pod-2"))
    nic = {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "nic-0"}
    body["status"]["allocation"]["devices"]["results"].append(nic)
    body["status"]["reservedFor"].append({"apiGroup": "x.io", "resource": "jobs", "uid": "j"})
    copy = ours(body, DRIVER, NODE)
    assert copy is not None
    results = copy.body()["status"]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0"]
    assert copy.holders == ("pod-1", "pod-2")


def test_only_claims_with_our_devices_from_our_pool_are_kept() -> None:
    assert ours(claim(), DRIVER, NODE) is not None
    assert ours(claim(pool="node-02"), DRIVER, NODE) is None
    assert ours(claim(driver="nic.example.com"), DRIVER, NODE) is None
    assert ours(claim(allocated=False), DRIVER, NODE) is None
    assert ours({}, DRIVER, NODE) is None


def test_a_claim_not_allocated_and_reserved_yet_is_read_again_on_the_pods_next_change() -> None:
    cache, readings = listed(pod())
    answer(cache, readings, claim(allocated=False, holders=()))
    assert cache.lookup(REF) is None
    again = cache.apply("MODIFIED", pod(rv="2"))
    answer(cache, again, claim(holders=()))  # allocated, not reserved: may still be taken back
    assert cache.lookup(REF) is None
    again = cache.apply("MODIFIED", pod(rv="3"))
    answer(cache, again, claim())
    assert devices(cache.lookup(REF)) == ["gpu-0"]


def test_a_claim_reserved_with_no_device_of_ours_is_not_read_again() -> None:
    cache, readings = listed(pod())
    answer(cache, readings, claim(driver="nic.example.com"))
    assert cache.apply("MODIFIED", pod(rv="2")) == []
    assert cache.lookup(REF) is None
    assert len(cache) == 0


def test_a_claim_with_no_device_of_ours_is_read_again_once_its_holder_ends() -> None:
    cache, readings = listed(pod("pod-1", phase="Running"), pod("pod-2"))
    answer(cache, readings, claim(driver="nic.example.com", holders=("pod-1",)))
    assert cache.apply("MODIFIED", pod("pod-2", rv="2")) == []
    # pod-1's reservation may go now, and the claim be allocated again, other devices
    assert keys(cache.apply("MODIFIED", pod("pod-1", phase="Succeeded", rv="3"))) == [C]


def test_a_failed_read_is_tried_again_on_the_pods_next_change() -> None:
    cache, readings = listed(pod())
    answer(cache, readings, None)
    assert keys(cache.apply("MODIFIED", pod(rv="2"))) == [C]


def test_another_uid_under_the_same_name_is_not_used() -> None:
    cache, readings = listed(pod())
    answer(cache, readings, claim(uid="u0"))
    assert cache.lookup(REF) is None


def test_a_copy_reserved_only_for_pods_not_active_here_is_not_kept() -> None:
    cache, readings = listed(pod())
    answer(cache, readings, claim(holders=("pod-9",)))  # a pod not (or no longer) on the node
    assert cache.lookup(REF) is None
    assert len(cache) == 0


def test_a_generated_claim_is_read_once_the_pods_status_names_it() -> None:
    body = pod("pod-1", "", generated=("p-gpu-1",))
    body["status"].pop("resourceClaimStatuses")
    cache, readings = listed(body)
    assert readings == []
    assert keys(cache.apply("MODIFIED", pod("pod-1", "", generated=("p-gpu-1",), rv="2"))) == [
        ClaimKey("ns", "p-gpu-1")
    ]


def test_nothing_is_used_before_the_list_or_after_the_watch_broke_until_listed_again() -> None:
    cache = ClaimCache(DRIVER, NODE)
    assert cache.apply("ADDED", pod()) == []  # not listed yet: nothing read
    cache, readings = listed(pod())
    answer(cache, readings, claim())
    assert cache.lookup(REF) is not None
    cache.broken()
    assert cache.lookup(REF) is None
    cache.page([pod(rv="5")])
    again = cache.synced()
    assert cache.lookup(REF) is None  # read before the break: not used
    answer(cache, again, claim())
    assert cache.lookup(REF) is not None


def test_a_watch_resumed_after_a_break_uses_only_what_is_read_since() -> None:
    cache, readings = listed(pod("pod-1", "c", "d"))
    answer(cache, readings[:1], claim())
    cache.broken()
    answer(cache, readings[1:], claim(uid="u2", name="d"))  # in flight at the break
    again = cache.resumed()
    assert cache.lookup(REF) is None  # read before the break: may be stale, read with a GET
    assert keys(again) == [C, D]  # the pod is still to start: read again
    answer(cache, again, claim(device="gpu-3"), claim(uid="u2", name="d", device="gpu-1"))
    assert devices(cache.lookup(REF)) == ["gpu-3"]


def test_after_an_unprepare_only_a_read_sent_after_it_is_used() -> None:
    # The claim's pod ends, the kubelet unprepares; the claim is released, deallocated and
    # allocated again, another GPU, to a pod that starts here: a read that was on the wire at
    # the unprepare may carry the old allocation.
    cache, readings = listed(pod())
    answer(cache, readings, claim())
    cache.unprepared(REF)
    assert cache.lookup(REF) is None
    again = cache.apply("MODIFIED", pod(rv="2"))
    cache.unprepared(REF)
    answer(cache, again, claim())  # sent before the unprepare: not kept
    assert cache.lookup(REF) is None
    last = cache.apply("MODIFIED", pod(rv="3"))
    answer(cache, last, claim(device="gpu-1"))
    assert devices(cache.lookup(REF)) == ["gpu-1"]


def test_a_deleted_pod_drops_the_copies_that_no_other_pod_of_the_node_uses() -> None:
    cache, readings = listed(pod("pod-1", "c", "d"), pod("pod-2", "c"))
    answer(cache, readings, claim(holders=("pod-1", "pod-2")), claim(uid="u2", name="d"))
    assert len(cache) == 2
    assert cache.apply("DELETED", pod("pod-1", "c", "d", rv="2")) == []
    assert len(cache) == 1  # d goes; c is still reserved for pod-2
    assert cache.lookup(ClaimRef("ns", "d", ClaimUID("u2"))) is None
    assert devices(cache.lookup(REF)) == ["gpu-0"]
    cache.apply("DELETED", pod("pod-2", "c", rv="3"))
    assert len(cache) == 0
    assert len(cache.pods) == 0


def test_a_claim_given_to_the_next_pod_is_read_again_not_served_from_the_old_copy() -> None:
    cache, readings = listed(pod("pod-1"))
    answer(cache, readings, claim(holders=("pod-1",)))
    # pod-1 finishes (a Job's pod stays): its reservation may go at once, and the claim be
    # allocated again, to pod-2 on this node; the watch shows pod-1's end before pod-2's bind.
    assert cache.apply("MODIFIED", pod("pod-1", phase="Succeeded", rv="2")) == []
    assert cache.lookup(REF) is None
    again = cache.apply("ADDED", pod("pod-2", rv="3"))
    assert keys(again) == [C]
    assert cache.lookup(REF) is None  # not until read for pod-2
    answer(cache, again, claim(holders=("pod-2",), device="gpu-1"))
    assert devices(cache.lookup(REF)) == ["gpu-1"]


def test_a_shared_claim_is_read_again_when_the_pod_it_was_reserved_for_ends() -> None:
    cache, readings = listed(pod("pod-1", phase="Running"), pod("pod-2"))
    answer(cache, readings, claim(holders=("pod-1",)))  # pod-2 not reserved yet
    assert cache.lookup(REF) is not None  # held by pod-1: the allocation stays
    again = cache.apply("MODIFIED", pod("pod-1", phase="Failed", rv="2"))
    assert cache.lookup(REF) is None
    assert keys(again) == [C]  # pod-2 is still to start
    answer(cache, again, claim(holders=("pod-2",)))
    assert cache.lookup(REF) is not None


def test_a_read_on_the_wire_when_its_pod_goes_is_not_kept() -> None:
    cache, readings = listed(pod("pod-1"))
    cache.apply("DELETED", pod("pod-1", rv="2"))
    again = cache.apply("ADDED", pod("pod-2", rv="3"))
    assert keys(again) == [C]  # a read of its own: the first may carry pod-1's allocation
    answer(cache, readings, claim(holders=("pod-2",)))
    assert cache.lookup(REF) is None
    answer(cache, again, claim(holders=("pod-2",), device="gpu-1"))
    assert devices(cache.lookup(REF)) == ["gpu-1"]


def test_a_relist_in_pages_counts_once_complete_and_one_failed_half_way_starts_over() -> None:
    cache = ClaimCache(DRIVER, NODE)
    cache.page([pod("pod-1", "c")])
    cache.broken()  # the second page failed: watch_forever lists again from the start
    cache.page([pod("pod-2", "d")])
    cache.page([pod("pod-3", "e", phase="Running")])
    assert not cache.live
    readings = cache.synced()
    assert keys(readings) == [D]  # only in the list that completed
    assert "pod-1" not in cache.pods
    assert "pod-3" in cache.pods


# ---- the cache on a scripted API server ------------------------------------------------------

PODS_PATH = "/api/v1/pods"
CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"


def pods_listed(*pods: dict[str, Any]) -> Reply:
    return listing(list(pods), "10")


def pods_watched(*pods: dict[str, Any], rv: str = "10") -> Reply:
    """The watch-list of the node's pods: ``pods``, then nothing more (held open)."""
    return watch_listed(list(pods), rv)


@contextlib.asynccontextmanager
async def running(
    server: Routed, cache: ClaimCache, time: FakeTime | None = None
) -> AsyncIterator[kube.Kube]:
    """The cache's ``run_forever`` against ``server``, stopped at exit."""
    timing = (time or FakeTime()).timing
    async with scripted_api(server, timing=timing) as api:
        task = asyncio.create_task(cache.run_forever(api))
        try:
            yield api
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def watching(*events: dict[str, Any], hold: asyncio.Event | None = None) -> Reply:
    """A watch of pods that sends ``events`` (once ``hold`` is set) and stays open."""
    return Reply(200, events=events, end="hold", hold=hold)


def pod_event(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": body}


async def until(what: str, probe: Any) -> Any:
    return await eventually(probe, timeout=10, interval=0.005, what=what)


def claim_moved_once(moved: asyncio.Event) -> Callable[[Request], Reply]:
    """GETs of the claim: on gpu-0, then on gpu-2 once ``moved`` is set (what a read before a
    watch's break gives, and one after it)."""

    def current(request: Request) -> Reply:
        return ok(claim(device="gpu-2" if moved.is_set() else "gpu-0"))

    return current


def at_least(items: Sequence[object], count: int) -> bool:
    return len(items) >= count


async def test_only_this_nodes_pods_are_watched_and_a_pod_to_start_has_its_claim_read() -> None:
    server = Routed(
        {
            ("WATCH", PODS_PATH): [pods_watched(pod())],
            ("GET", f"{CLAIMS_PATH}/c"): [ok(claim())],
        }
    )
    cache = ClaimCache(DRIVER, NODE)
    async with running(server, cache):
        body = await until("the claim's copy", lambda: cache.lookup(REF))
        assert devices(body) == ["gpu-0"]
    assert server.of("GET", PODS_PATH) == []  # the pods came in the watch-list
    (watch,) = server.of("WATCH")
    assert watch.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert watch.query["sendInitialEvents"] == "true"
    assert [r.path for r in server.requests if "resourceclaims" in r.path] == [f"{CLAIMS_PATH}/c"]


async def test_a_pod_changed_once_its_claim_is_allocated_gets_the_claim_read_again() -> None:
    allocated = asyncio.Event()
    server = Routed(
        {
            # a server without watch-lists: listed, then watched
            ("WATCH", PODS_PATH): [
                watch_list_refused(),
                watching(pod_event("MODIFIED", pod(rv="11")), hold=allocated),
            ],
            ("GET", PODS_PATH): [pods_listed(pod())],
            ("GET", f"{CLAIMS_PATH}/c"): [ok(claim(allocated=False, holders=())), ok(claim())],
        }
    )
    cache = ClaimCache(DRIVER, NODE)
    async with running(server, cache):
        await until("the first read", lambda: server.of("GET", f"{CLAIMS_PATH}/c"))
        await until("its answer, which keeps nothing", lambda: cache.reading == 0)
        assert cache.lookup(REF) is None
        allocated.set()  # the pod's next change, after its claim was allocated
        assert devices(await until("the copy", lambda: cache.lookup(REF))) == ["gpu-0"]
    assert len(server.of("GET", f"{CLAIMS_PATH}/c")) == 2


async def test_at_most_a_few_claims_are_read_at_once() -> None:
    count = 3 * claimcache.READS
    answers = [asyncio.Event() for _ in range(count)]
    arrived: list[str] = []
    most = 0

    def slow(request: Request) -> Reply:
        nonlocal most
        arrived.append(request.path)
        released = sum(a.is_set() for a in answers)
        most = max(most, len(arrived) - released)
        name = request.path.rsplit("/", 1)[1]
        return Reply(200, claim(uid=f"u-{name}", name=name), hold=answers[len(arrived) - 1])

    pods = [pod(f"pod-{n}", f"c{n}") for n in range(count)]
    routes: dict[tuple[str, str], Any] = {
        ("WATCH", PODS_PATH): [pods_watched(*pods)],
    }
    routes |= {("GET", f"{CLAIMS_PATH}/c{n}"): slow for n in range(count)}
    cache = ClaimCache(DRIVER, NODE)
    async with running(Routed(routes), cache):
        for n, event in enumerate(answers):
            expected = min(count, n + claimcache.READS)
            await until(f"{expected} reads", functools.partial(at_least, arrived, expected))
            event.set()  # one answer: one more read may go
        await until("every copy", lambda: len(cache) == count)
    assert most == claimcache.READS


async def test_a_prepare_waits_for_the_caches_get_on_the_wire_instead_of_sending_its_own() -> None:
    answered = asyncio.Event()
    server = Routed(
        {
            ("WATCH", PODS_PATH): [pods_watched(pod())],
            ("GET", f"{CLAIMS_PATH}/c"): [Reply(200, claim(), hold=answered)],
        }
    )
    cache = ClaimCache(DRIVER, NODE)
    async with running(server, cache):
        await until("the cache's GET", lambda: server.of("GET", f"{CLAIMS_PATH}/c"))
        assert cache.lookup(REF) is None
        prepare = asyncio.create_task(cache.read(REF))
        await asyncio.sleep(0)
        assert not prepare.done()
        answered.set()
        assert devices(await prepare) == ["gpu-0"]
    assert len(server.of("GET", f"{CLAIMS_PATH}/c")) == 1


async def test_a_prepare_takes_over_a_read_still_waiting_for_its_slot_one_get_per_claim() -> None:
    slots_free = asyncio.Event()
    busy = [f"b{n}" for n in range(claimcache.READS)]  # their reads hold every slot

    def held(request: Request) -> Reply:
        name = request.path.rsplit("/", 1)[1]
        return Reply(200, claim(uid=f"u-{name}", name=name), hold=slots_free)

    routes: dict[tuple[str, str], Any] = {
        ("WATCH", PODS_PATH): [pods_watched(*(pod(f"pod-{n}", n) for n in busy), pod())],
        ("GET", f"{CLAIMS_PATH}/c"): [ok(claim())],
    }
    routes |= {("GET", f"{CLAIMS_PATH}/{n}"): held for n in busy}
    server = Routed(routes)
    cache = ClaimCache(DRIVER, NODE)
    async with running(server, cache) as api:
        await until("every slot taken", lambda: len(server.of("GET")) == len(busy))
        assert await cache.read(REF) is None  # queued, not on the wire: not waited for
        taken = cache.take(REF)
        assert taken is not None
        assert cache.take(REF) is None  # once
        second = asyncio.create_task(cache.read(REF))  # another prepare of the claim waits
        await asyncio.sleep(0)
        assert not second.done()
        cache.settle(taken, await api.get(f"{CLAIMS_PATH}/c"))  # the prepare's own GET
        assert devices(await second) == ["gpu-0"]
        slots_free.set()
        await until("the other reads", lambda: len(cache) == 1 + len(busy))
        assert cache.reading == 0
    assert len(server.of("GET", f"{CLAIMS_PATH}/c")) == 1  # the cache never sent its own


async def test_a_failed_read_leaves_the_prepare_to_read_the_claim_itself() -> None:
    answered = asyncio.Event()
    server = Routed(
        {
            ("WATCH", PODS_PATH): [pods_watched(pod())],
            ("GET", f"{CLAIMS_PATH}/c"): [dataclasses.replace(internal_error(), hold=answered)],
        }
    )
    cache = ClaimCache(DRIVER, NODE)
    async with running(server, cache):
        await until("the cache's GET", lambda: server.of("GET", f"{CLAIMS_PATH}/c"))
        prepare = asyncio.create_task(cache.read(REF))
        answered.set()
        assert await prepare is None  # a GET of its own follows (state.DeviceState)
        assert cache.live  # the cache goes on


async def test_a_watch_resumed_after_a_break_reads_again_the_claims_of_pods_still_to_start() -> (
    None
):
    resumed = asyncio.Event()
    server = Routed(
        {
            ("GET", PODS_PATH): [pods_listed(pod())],
            # a server without watch-lists; the stream is cut; watched again from
            # resourceVersion 10, which the server keeps
            ("WATCH", PODS_PATH): [watch_list_refused(), stream(end="cut"), watching(hold=resumed)],
            ("GET", f"{CLAIMS_PATH}/c"): claim_moved_once(resumed),
        }
    )
    cache = ClaimCache(DRIVER, NODE)
    time = FakeTime()
    async with running(server, cache, time):
        await until("the break", lambda: len(server.of("WATCH")) == 3)
        assert cache.lookup(REF) is None  # broken: not live
        resumed.set()
        body = await until("a copy read after the break", lambda: cache.lookup(REF))
        assert devices(body) == ["gpu-2"]
    assert [r.query["resourceVersion"] for r in server.of("WATCH")[1:]] == ["10", "10"]
    assert len(server.of("GET", PODS_PATH)) == 1  # never listed again


async def test_a_watch_list_sent_again_after_a_break_reads_again_the_claims_of_pods_to_start() -> (
    None
):
    again = asyncio.Event()
    server = Routed(
        {
            ("WATCH", PODS_PATH): [
                watch_listed([pod()], "10", end="cut"),
                watch_listed([pod()], "12", hold=again),
            ],
            ("GET", f"{CLAIMS_PATH}/c"): claim_moved_once(again),
        }
    )
    cache = ClaimCache(DRIVER, NODE)
    async with running(server, cache, FakeTime()):
        await until("the break", lambda: len(server.of("WATCH")) == 2)
        assert cache.lookup(REF) is None  # broken: not live
        assert watch_live() == 0
        again.set()
        body = await until("a copy read after the break", lambda: cache.lookup(REF))
        assert devices(body) == ["gpu-2"]
        assert watch_live() == 1
    assert server.of("GET", PODS_PATH) == []  # one request each time: the state and the events


# ---- prepare with the cache ------------------------------------------------------------------


class CountedClaimsApi(rig.ClaimsApi):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get(self, path: str) -> dict[str, Any]:
        self.gets += 1
        return await super().get(path)


def watch_live() -> float | None:
    return metrics.AGENT.get_sample_value("dra_gpu_watch_live", {"resource": "pods"})


def claim_reads(source: str) -> float:
    found = metrics.AGENT.get_sample_value("dra_gpu_claim_reads_total", {"source": source})
    return found or 0.0


async def test_prepare_reads_the_copy_and_after_an_unprepare_sends_a_get_of_its_own(
    tmp_path: Path,
) -> None:
    api = CountedClaimsApi()
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    ref = api.allocate("c", [result])
    cache, readings = listed(pod())
    # The copy and the API server disagree here only to tell which one prepare read.
    answer(cache, readings, claim(uid=ref.uid, device="gpu-1"))
    profile = f"nodes:\n  {NODE}:\n    devices:\n    - count: 2\n      memory: 8Gi\n"
    backend = simulated.SimulatedBackend(simulated.parse_profile(profile), NODE)
    state = rig.device_state(tmp_path, backend, api, cache=cache)
    state.load(checkpoint.Checkpoint())
    cached, asked = claim_reads("cache"), claim_reads("api")

    prepared = (await state.prepare_all([ref]))[ref.uid]
    assert isinstance(prepared, Prepared)
    assert [d.device for d in prepared.devices] == ["gpu-1"]
    assert (api.gets, claim_reads("cache") - cached) == (0, 1)

    assert (await state.unprepare_all([ref]))[ref.uid] is None
    prepared = (await state.prepare_all([ref]))[ref.uid]
    assert isinstance(prepared, Prepared)
    assert [d.device for d in prepared.devices] == ["gpu-0"]
    assert (api.gets, claim_reads("api") - asked) == (1, 1)
    await state.aclose()

"""When prepare may use the watch's copy of a claim instead of a GET (``agent.claimcache``)."""

from __future__ import annotations

from typing import Any

from dra_gpu.agent import claims
from dra_gpu.agent.claimcache import ClaimCache, ours
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.resource import bodies
from dra_gpu.resource.bodies import ClaimUID

DRIVER, NODE = "gpu.example.com", "node-01"
REF = ClaimRef("ns", "c", ClaimUID("u1"))


def claim(
    *,
    uid: str = "u1",
    name: str = "c",
    rv: str = "1",
    pool: str = NODE,
    driver: str = DRIVER,
    device: str = "gpu-0",
    reserved: bool = True,
    allocated: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        result = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
        status["allocation"] = {"devices": {"results": [result], "config": []}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ns",
            "name": name,
            "resourceVersion": rv,
            "managedFields": [{"manager": "kube-scheduler"}],
        },
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": status,
    }


def listed(cache: ClaimCache, items: list[dict[str, Any]]) -> None:
    """A (re)list in one page."""
    cache.page(items)
    cache.synced()


def live(*items: dict[str, Any]) -> ClaimCache:
    cache = ClaimCache(DRIVER, NODE)
    listed(cache, list(items))
    return cache


def devices(body: dict[str, Any] | None) -> list[str]:
    assert body is not None
    return [d.device for d in claims.allocated_devices(body, REF, DRIVER, NODE)]


def test_a_reserved_claim_of_our_pool_is_served_with_what_prepare_reads_and_nothing_else() -> None:
    body = live(claim()).lookup(REF)
    assert devices(body) == ["gpu-0"]
    assert body is not None
    claims.check_identity(body, REF)
    assert bodies.allocation_configs(body) == []
    assert "managedFields" not in body["metadata"]
    assert "spec" not in body


def test_a_copy_keeps_only_our_drivers_results() -> None:
    body = claim()
    nic = {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "nic-0"}
    body["status"]["allocation"]["devices"]["results"].append(nic)
    copy = ours(body, DRIVER, NODE)
    assert copy is not None
    results = copy.body()["status"]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0"]


def test_only_claims_with_our_devices_from_our_pool_are_kept() -> None:
    assert ours(claim(), DRIVER, NODE) is not None
    assert ours(claim(pool="node-02"), DRIVER, NODE) is None
    assert ours(claim(driver="nic.example.com"), DRIVER, NODE) is None
    assert ours(claim(allocated=False), DRIVER, NODE) is None
    assert ours({}, DRIVER, NODE) is None
    assert len(live(claim(), claim(name="d", pool="node-02"))) == 1


def test_a_copy_not_reserved_for_a_pod_is_not_used() -> None:
    # Its allocation may still be taken back and given again: only a reservation fixes it.
    assert live(claim(reserved=False)).lookup(REF) is None


def test_another_uid_under_the_same_name_is_not_used() -> None:
    assert live(claim(uid="u0")).lookup(REF) is None


def test_nothing_is_used_before_the_list_or_after_the_watch_broke_until_the_next_list() -> None:
    cache = ClaimCache(DRIVER, NODE)
    cache.apply("ADDED", claim())
    assert cache.lookup(REF) is None  # not listed yet
    listed(cache, [claim()])
    assert cache.lookup(REF) is not None
    cache.broken()
    assert cache.lookup(REF) is None
    listed(cache, [claim()])
    assert cache.lookup(REF) is not None


def test_a_watch_resumed_after_a_break_uses_only_copies_its_events_make() -> None:
    cache = live(claim(), claim(uid="u2", name="d", device="gpu-1"))
    cache.broken()
    assert cache.lookup(REF) is None
    cache.resumed()  # watched again from where it broke: the missed events are coming
    assert cache.lookup(REF) is None  # made before the break: may be stale, read with a GET
    cache.apply("MODIFIED", claim(rv="7", device="gpu-3"))  # a missed event, replayed
    assert devices(cache.lookup(REF)) == ["gpu-3"]
    assert cache.lookup(ClaimRef("ns", "d", ClaimUID("u2"))) is None


def test_watch_events_add_change_and_remove_copies() -> None:
    cache = live()
    assert cache.lookup(REF) is None
    cache.apply("ADDED", claim(reserved=False))
    assert cache.lookup(REF) is None
    cache.apply("MODIFIED", claim(rv="2"))
    assert devices(cache.lookup(REF)) == ["gpu-0"]
    cache.apply("MODIFIED", claim(rv="3", pool="node-02"))  # impossible while reserved; still
    assert cache.lookup(REF) is None
    assert len(cache) == 0
    cache.apply("MODIFIED", claim(rv="4"))
    cache.apply("DELETED", claim(rv="5"))
    assert cache.lookup(REF) is None
    assert len(cache) == 0


def test_a_relist_replaces_every_copy() -> None:
    cache = live(claim())
    listed(cache, [])
    assert cache.lookup(REF) is None
    assert len(cache) == 0


def test_after_an_unprepare_copies_wait_until_the_claim_is_seen_released() -> None:
    # Pod 1 ends, the kubelet unprepares; the claim is released, deallocated and allocated
    # again, another GPU, to pod 2 on this node. A watch behind by all of that still holds the
    # old copy: it must not be used, nor a late copy of the old reservation.
    cache = live(claim())
    cache.unprepared(REF.uid)
    assert cache.lookup(REF) is None
    cache.apply("MODIFIED", claim(rv="2"))  # a late event of the old reservation
    assert cache.lookup(REF) is None
    cache.apply("MODIFIED", claim(rv="3", reserved=False))  # released
    cache.apply("MODIFIED", claim(rv="4", allocated=False, reserved=False))
    cache.apply("MODIFIED", claim(rv="5", device="gpu-1"))  # pod 2's allocation
    assert devices(cache.lookup(REF)) == ["gpu-1"]


def test_an_unprepared_claim_that_goes_away_is_forgotten() -> None:
    cache = live(claim())
    cache.unprepared(REF.uid)
    cache.apply("DELETED", claim(rv="2"))
    cache.apply("ADDED", claim(rv="3"))  # the same UID cannot come back; a copy would be used
    assert cache.lookup(REF) is not None


def test_a_relist_keeps_an_unprepared_claim_distrusted_while_it_is_still_reserved() -> None:
    cache = live(claim())
    cache.unprepared(REF.uid)
    listed(cache, [claim(rv="2")])  # a pod on this node reserved it again, same allocation
    assert cache.lookup(REF) is None
    listed(cache, [claim(rv="3", reserved=False)])
    cache.apply("MODIFIED", claim(rv="4"))
    assert cache.lookup(REF) is not None
    cache.unprepared(REF.uid)
    listed(cache, [])  # gone meanwhile
    cache.apply("ADDED", claim(rv="5"))
    assert cache.lookup(REF) is not None


def test_a_relist_in_pages_is_used_once_complete_and_keeps_what_was_unprepared_meanwhile() -> None:
    other = ClaimRef("ns", "d", ClaimUID("u2"))
    cache = live(claim())
    cache.broken()  # the watch broke: a relist follows, in pages
    cache.page([claim(rv="2")])
    cache.unprepared(REF.uid)  # the kubelet unprepares it between two pages
    cache.page([claim(uid="u2", name="d", rv="3", device="gpu-1")])
    assert cache.lookup(other) is None  # not before the list is complete
    cache.synced()
    assert devices(cache.lookup(other)) == ["gpu-1"]
    assert cache.lookup(REF) is None  # still reserved, unprepared here: distrusted


def test_a_relist_that_fails_half_way_is_started_again_from_nothing() -> None:
    cache = ClaimCache(DRIVER, NODE)
    cache.page([claim(rv="2")])
    cache.broken()  # the second page failed: watch_forever lists again from the start
    cache.page([claim(uid="u2", name="d", rv="3")])
    cache.synced()
    assert cache.lookup(REF) is None  # only in the abandoned list
    assert len(cache) == 1

"""Claims allocated from this node's pool, as one watch of the API server sees them: prepare
without a GET.

The kubelet names a claim (namespace, name, UID) and prepare needs its allocation. Reading it
with a GET costs a round trip to the API server on every pod start, the largest part of a
prepare. This cache keeps, from one list-then-watch of every ResourceClaim, a small copy of
those whose allocation holds devices of our driver from our pool: UID, whether a pod has it
reserved, and our part of the allocation (everything else, managed fields included, is dropped
as each event arrives). ``lookup`` answers for a claim only when its copy is one a GET would
have given in substance:

- same UID (a claim deleted and re-created under the same name is another claim);
- reserved for a pod: the API server refuses to change or remove the allocation of a claim
  that some pod has reserved, so while that holds the allocation read here is the one the
  kubelet's pod runs with;
- the watch is live: listed and not broken since, or watched again from where it broke (then
  only copies made from events since count: the events missed meanwhile are replayed in
  order, but a copy made before may be stale until its event comes); while it relists or
  reconnects, every prepare reads with a GET;
- not unprepared here since: after the kubelet unprepares a claim, its copies are not trusted
  until the watch shows the claim without a reservation (or without an allocation, or gone).
  A claim of a finished pod may be deallocated and allocated again, other devices, to a new
  pod on this node: a lagging watch must not hand out the old devices.

What remains is a watch that lags behind a whole unreserve, deallocate, allocate and bind of a
claim that was never prepared here (a pod deleted between scheduling and starting): the watch
carries the API server's events in order, milliseconds behind the scheduler's, while that chain
takes several API round trips through other components. ``--claim-reads get`` turns the cache
off. A miss, for whatever reason, is a GET, as without the cache (``metrics.CLAIM_READS`` counts
both).

Costs: one watch per node over every claim of the cluster (the API server's watch cache serves
them); each event is decoded and dropped unless it is ours; a (re)list comes in pages of
``LIST_PAGE`` claims, so that one page is decoded at a time; memory in proportion to this
node's claims only.

Owns: nothing on disk; the copies are read by ``state.DeviceState`` only.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.resource import bodies

log = logging.getLogger(__name__)

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
LIST_PAGE = 500
"""Claims per page of a (re)list: every node lists every claim of the cluster, so one page at a
time is decoded and kept only where it is ours (kubectl pages by 500 too)."""


Result = tuple[tuple[str, Any], ...]
"""One allocation result as its (key, value) pairs."""


@dataclasses.dataclass(slots=True)
class Copy:
    """What is kept of a claim: enough for prepare (``claims.check_identity``,
    ``claims.allocated_devices``, ``bodies.allocation_configs``). A node keeps a copy of each
    of its claims, so a copy is a few hundred bytes, not the decoded claim's tree of dicts:
    tuples, with the names that repeat from claim to claim interned."""

    uid: bodies.ClaimUID
    namespace: str
    name: str
    reserved: bool
    results: tuple[Result, ...]
    """Our driver's results."""
    config: tuple[Any, ...]
    """The allocation's configs, as decoded."""

    def body(self) -> kube.Body:
        """The claim as a GET would give prepare what it reads."""
        return {
            "metadata": {"uid": self.uid, "namespace": self.namespace, "name": self.name},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [dict(r) for r in self.results],
                        "config": list(self.config),
                    }
                }
            },
        }


def ours(claim: Mapping[str, Any], driver: str, pool: str) -> Copy | None:
    """The claim's ``Copy`` if its allocation holds a device of ``driver`` from ``pool``."""
    results = tuple(
        tuple((sys.intern(k), sys.intern(v) if isinstance(v, str) else v) for k, v in r.items())
        for r in bodies.allocation_results(claim)
        if r.get("driver") == driver
    )
    if not any(("pool", pool) in r for r in results):
        return None
    meta = bodies.metadata(claim)
    return Copy(
        uid=bodies.claim_uid(claim),
        namespace=sys.intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        reserved=bodies.reserved(claim),
        results=results,
        config=tuple(bodies.allocation_configs(claim)),
    )


class ClaimCache:
    """The copies, by namespace and name, and whether they may be used now."""

    def __init__(self, driver: str, pool: str) -> None:
        self.driver, self.pool = driver, pool
        self._copies: dict[tuple[str, str], Copy] = {}
        self._distrusted: set[bodies.ClaimUID] = set()
        """UIDs unprepared here whose copies are not used until the claim is seen released."""
        self.live = False
        """Listed, and the watch not broken since."""
        self._next: dict[tuple[str, str], Copy] | None = None
        """The copies of a (re)list under way."""
        self._still_distrusted: set[bodies.ClaimUID] = set()
        """UIDs distrusted whose claims the list under way shows still reserved."""

    def __len__(self) -> int:
        return len(self._copies)

    def lookup(self, ref: ClaimRef) -> kube.Body | None:
        """The claim as prepare needs it, or None: read it with a GET."""
        copy = self._copies.get((ref.namespace, ref.name)) if self.live else None
        usable = (
            copy is not None
            and copy.reserved
            and copy.uid == ref.uid
            and ref.uid not in self._distrusted
        )
        return copy.body() if usable and copy is not None else None

    def unprepared(self, uid: bodies.ClaimUID) -> None:
        """The kubelet unprepared this claim: distrust its copies until it is released."""
        self._distrusted.add(uid)
        if self._next is not None:  # a list under way may have passed the claim already
            self._still_distrusted.add(uid)

    def page(self, items: list[kube.Body]) -> None:
        """One page of a (re)list: its claims become copies once the list is complete."""
        if self._next is None:
            self._next, self._still_distrusted = {}, set()
        for claim in items:
            copy = ours(claim, self.driver, self.pool)
            if copy is not None:
                self._next[(copy.namespace, copy.name)] = copy
            uid = bodies.claim_uid(claim)
            if copy is not None and copy.reserved and uid in self._distrusted:
                self._still_distrusted.add(uid)  # not released yet
            else:
                self._still_distrusted.discard(uid)

    def synced(self) -> None:
        """The (re)list is complete: the copies are what it said, and the cache is live. A
        claim unprepared here that the list no longer has was released meanwhile."""
        self._copies, self._next = self._next or {}, None
        self._distrusted, self._still_distrusted = self._still_distrusted, set()
        self.live = True

    def broken(self) -> None:
        """The watch broke (or a list failed half way): nothing is used until the next
        complete list."""
        self.live = False
        self._next = None

    def resumed(self) -> None:
        """The watch broke and was watched again from where it was: the events missed are
        coming, in order, but a copy they will change may be stale until then. So the copies
        made before the break go (a prepare of one of those claims reads it with a GET), and
        the cache is live with those the events make from now on."""
        self._copies = {}
        self.live = True

    def apply(self, kind: str, claim: kube.Body) -> None:
        """One watch event (ADDED, MODIFIED, DELETED)."""
        meta = bodies.metadata(claim)
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        copy = None if kind == "DELETED" else ours(claim, self.driver, self.pool)
        if copy is None:
            self._copies.pop(key, None)
        elif copy != self._copies.get(key):  # most events change nothing kept (status.devices)
            self._copies[key] = copy
        if copy is None or not copy.reserved:
            self._distrusted.discard(bodies.claim_uid(claim))

    async def run_forever(self, api: kube.Kube) -> NoReturn:
        """List and watch every claim, forever (``kube.Kube.watch_forever`` watches again from
        where it broke, or relists after ``410 Gone``; ``broken`` is called when it breaks,
        ``resumed`` when it is watched again)."""
        claims = api.watch_forever(
            CLAIMS, on_break=self.broken, on_resume=self.resumed, page_size=LIST_PAGE
        )
        async for kind, obj in claims:
            if kind == "PAGE":
                self.page(obj.get("items", []))
            elif kind == "SYNC":
                self.synced()
                log.info("claim cache: %d claim(s) of node %s", len(self), self.pool)
            else:
                self.apply(kind, obj)
        raise AssertionError("watch_forever never ends")

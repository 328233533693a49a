"""Claims of the pods bound to this node, read as each pod arrives: prepare without a GET.

The kubelet names a claim (namespace, name, UID) and prepare needs its allocation. Reading it
with a GET when the kubelet asks costs a round trip to the API server on every pod start, the
largest part of a prepare. The kubelet asks only once the pod is bound to this node and its
claims are allocated and reserved for it (the scheduler writes both before it binds). So this
cache watches this node's pods (``fieldSelector=spec.nodeName=<node>``, as the kubelet does)
and, as a pod still to start appears in that watch, reads each of its claims with one GET
(``podclaims`` says which: named claims, and generated ones once the pod's status names them),
at most ``READS`` at once. Of a claim with devices of our driver from our pool it keeps a small
``Copy``: UID, the pods it is reserved for, our part of the allocation (everything else,
managed fields included, is dropped as the answer arrives). A claim not yet allocated and
reserved is read again on the pod's next change (MODIFIED), never polled.

``lookup`` answers for a claim only when its copy is one a GET would give now, in substance:

- same UID (a claim deleted and re-created under the same name is another claim);
- reserved for a pod that the watch shows active on this node (``podclaims.PodClaims.active``):
  the API server refuses to change or remove the allocation of a claim that some pod has
  reserved, and the resourceclaim controller takes a bound pod's reservation away only once
  the pod has finished or is gone; so while that pod is active, the allocation read is the one
  the kubelet's pod runs with. When the last such pod finishes, is being deleted or is gone, the
  copy goes, and a claim that no active pod of the node uses any more is forgotten;
- the watch is live: listed and not broken since, or watched again from where it broke (then
  only copies read since count: the pods' events missed meanwhile are replayed in order, but a
  copy read before may be stale until then); while it relists or reconnects, every prepare
  reads with a GET;
- read after the last unprepare of the claim here: an unprepare drops the copy, and a read in
  flight then is not kept. A claim of a finished pod may be deallocated and allocated again,
  other devices, to a new pod on this node: its next prepare needs a GET made after the
  unprepare.

A copy is as fresh as the GET that made it. What remains is a watch that lags behind the whole
chain that gives a claim to another pod: the first pod's end (written by the kubelet), the
controller's unreserve, a deallocate, an allocate and the bind of the second pod. A copy read
for the first pod is used for the second only while the watch still shows the first active,
though each of those steps is an API round trip through another component and the watch
carries the API server's events in order, milliseconds behind. ``--claim-reads get`` turns
the cache off (no pod watch). A miss, for whatever reason, is a GET, as without the cache
(``metrics.CLAIM_READS`` counts both).

A prepare that finds the cache's GET of its claim on the wire waits for it (``read``) instead
of sending a second one: that GET was sent after the pod was bound, when the claim was already
allocated and reserved for it, so it reads what the prepare's own would, and it answers sooner;
the prepare counts as a cache read. If it fails, or is not kept (an unprepare, a break), the
prepare reads the claim itself. A read still waiting for its slot is not waited for but taken
over (``take``): the prepare's own GET, sent at once, is that read, and the cache does not send
it again — one GET per claim, not two, when a burst of prepares outruns the cache's reads under
the client's rate limit (measured: 1,000 claims bound at once, 559 read twice before).

Costs: one watch of this node's pods (the API server's watch cache indexes pods by node, so
other nodes' pods cost this watch nothing), listed in pages of ``LIST_PAGE``; about one GET per
claim per pod bound here (and again, after a relist or a resumed watch, for the pods still to
start); no event at all for other nodes' claims or pods; memory for this node's pods that use
claims (UID, claim names) and copies of their claims only.

Owns: nothing on disk; the copies are read by ``state.DeviceState`` only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.agent import podclaims
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.podclaims import ClaimKey, NodePods
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

PODS = "/api/v1/pods"
LIST_PAGE = 500
"""Pods per page of a (re)list of this node's pods (kubectl pages by 500 too)."""
READS = 4
"""Claims the cache reads at once. A node's pods start a few at a time; a burst (a node
drained onto, a Job of many pods) queues here instead of opening as many connections and
sending as many requests at once; prepares that miss read with slots of their own."""


Result = tuple[tuple[str, Any], ...]
"""One allocation result as its (key, value) pairs."""


@dataclasses.dataclass(slots=True)
class Copy:
    """What is kept of a claim: enough for prepare (``claims.check_identity``,
    ``claims.allocated_devices``, ``bodies.allocation_configs``) and to know how long it holds.
    A node keeps a copy of each claim its pods are to prepare, so a copy is a few hundred
    bytes, not the decoded claim's tree of dicts: tuples, with the names that repeat from
    claim to claim interned."""

    uid: bodies.ClaimUID
    namespace: str
    name: str
    holders: tuple[str, ...]
    """UIDs of the pods it is reserved for (``status.reservedFor``)."""
    results: tuple[Result, ...]
    """Our driver's results."""
    config: tuple[Any, ...]
    """The allocation's configs, as decoded."""

    @property
    def reserved(self) -> bool:
        return bool(self.holders)

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


def holders(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """UIDs of the pods the claim is reserved for."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(
        str(r["uid"])
        for r in reserved
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid")
    )


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
        holders=holders(claim),
        results=results,
        config=tuple(bodies.allocation_configs(claim)),
    )


@dataclasses.dataclass(eq=False)
class Reading:
    """One read of a claim by the cache: queued for a slot, then sent, then done."""

    key: ClaimKey
    sent: bool = False
    """The GET is on the wire (it holds a slot, or a prepare sends it: ``taken``)."""
    taken: bool = False
    """A prepare sends this read itself (``ClaimCache.take``) and ends it (``settle``)."""
    spoiled: bool = False
    """An unprepare of the claim, a break of the watch, or the claim's last pod gone came
    after the read was queued: what it reads may be older than that, and is not kept."""
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set once the read is over, whatever it brought (or if it was never sent)."""


class ClaimCache:
    """The copies, by namespace and name, the pods of this node they are kept for, and whether
    they may be used now. The methods but ``read`` and ``run_forever`` do no I/O: they say which
    claims to read (``Reading``s, for ``run_forever`` to send) and keep what ``answered`` is
    given."""

    def __init__(self, driver: str, node: str) -> None:
        self.driver, self.node = driver, node
        self.pool = node
        """Our devices' pool on this node is named after the node."""
        self.pods = NodePods()
        self._copies: dict[ClaimKey, Copy] = {}
        self._elsewhere: dict[ClaimKey, tuple[str, ...]] = {}
        """Claims read allocated with no device of ours from our pool, and the pods they are
        reserved for: not read again while one of those is active here (the allocation stays)."""
        self._reading: dict[ClaimKey, Reading] = {}
        """Reads queued or on the wire, not spoiled."""
        self.live = False
        """Listed, and the watch not broken since (or watched again from where it broke)."""
        self._next: NodePods | None = None
        """The pods of a (re)list under way."""
        self._slots = asyncio.Semaphore(READS)

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def reading(self) -> int:
        """Reads queued or on the wire."""
        return len(self._reading)

    # ---- what prepare asks ---------------------------------------------------------------

    def lookup(self, ref: ClaimRef) -> kube.Body | None:
        """The claim as prepare needs it, or None: read it with a GET."""
        copy = self._copies.get(ClaimKey(ref.namespace, ref.name)) if self.live else None
        if copy is None or copy.uid != ref.uid or not self._held(copy):
            return None
        return copy.body()

    async def read(self, ref: ClaimRef) -> kube.Body | None:
        """``lookup``, or, while the cache's GET of the claim is on the wire, what it brings
        (see the module: it was sent after the pod was bound); None: read it with a GET."""
        found = self.lookup(ref)
        reading = self._reading.get(ClaimKey(ref.namespace, ref.name))
        if found is not None or not self.live or reading is None or not reading.sent:
            return found
        await reading.done.wait()
        return self.lookup(ref)

    def take(self, ref: ClaimRef) -> Reading | None:
        """The cache's read of the claim while it still waits for its slot, handed to a prepare
        that found no copy: the cache will not send it; the prepare's GET, sent now, is that read
        (other prepares of the claim wait for it, an unprepare spoils it) and ends it with
        ``settle``. None: no such read."""
        reading = self._reading.get(ClaimKey(ref.namespace, ref.name)) if self.live else None
        if reading is None or reading.sent:
            return None
        reading.sent = reading.taken = True
        return reading

    def settle(self, reading: Reading, claim: kube.Body | None) -> None:
        """What the prepare's GET of a ``take``n read brought (None: it failed)."""
        self.answered(reading, claim)
        reading.done.set()

    def unprepared(self, ref: ClaimRef) -> None:
        """The kubelet unprepared this claim: its copy goes, and a read of it in flight is not
        kept. Its next use needs a GET sent after now."""
        self._forget([ClaimKey(ref.namespace, ref.name)])

    # ---- what the pod watch says ---------------------------------------------------------

    def page(self, items: Sequence[kube.Body]) -> None:
        """One page of a (re)list of the node's pods: they count once the list is complete."""
        if self._next is None:
            self._next = NodePods()
        for pod in items:
            self._next.put(podclaims.pod_claims(pod))

    def synced(self) -> list[Reading]:
        """The (re)list is complete: the pods are what it said, the cache is live, and nothing
        read before it counts. The claims to read: those of the pods still to start."""
        self.pods, self._next = self._next or NodePods(), None
        self._forget(self._kept())
        self._set_live(True)
        return self._to_read(self.pods.starting())

    def broken(self) -> None:
        """The watch broke (or a list failed half way): nothing is used until the next complete
        list or a watch resumed, and nothing read before counts then."""
        self._set_live(False)
        self._next = None
        self._forget(self._kept())

    def resumed(self) -> list[Reading]:
        """The watch broke and was watched again from where it was: the events missed are
        coming, in order. The copies read before the break went with it; the cache is live with
        what is read from now on: the claims of the pods still to start, as far as the pods
        known say (the events to come may add some)."""
        self._set_live(True)
        return self._to_read(self.pods.starting())

    def _set_live(self, live: bool) -> None:
        self.live = live
        metrics.WATCH_LIVE.labels("pods").set(1 if live else 0)

    def apply(self, kind: str, pod: kube.Body) -> list[Reading]:
        """One watch event (ADDED, MODIFIED, DELETED) of a pod of this node; the claims to read
        now: the pod's, if it is still to start and they are not read yet (a claim read before
        it was allocated and reserved is read again), and those whose copy went with it that
        another pod still to start uses."""
        seen = podclaims.pod_claims(pod)
        was_active = seen.uid in self.pods
        dropped = self.pods.remove(seen.uid) if kind == "DELETED" else self.pods.put(seen)
        if was_active and seen.uid not in self.pods:  # its reservations may go any moment
            dropped |= {key for key, copy in self._copies.items() if not self._held(copy)}
            dropped |= {key for key, pods in self._elsewhere.items() if not self._any_active(pods)}
        self._forget(dropped)
        wanted = dropped if kind == "DELETED" else dropped | seen.claims
        return self._to_read(wanted)

    def answered(self, reading: Reading, claim: kube.Body | None) -> None:
        """What a read brought (None: it failed, or the claim is not there yet): a copy of the
        claim, if it is ours and reserved for an active pod of the node. Anything else is
        read again on a pod's next change."""
        if self._reading.get(reading.key) is reading:
            del self._reading[reading.key]
        if reading.spoiled or claim is None or not self.live or not self.pods.used(reading.key):
            return
        copy = ours(claim, self.driver, self.pool)
        if copy is not None:
            if self._held(copy):
                self._copies[reading.key] = copy
        elif bodies.allocation(claim) is not None and self._any_active(held := holders(claim)):
            self._elsewhere[reading.key] = held

    # ---- helpers -------------------------------------------------------------------------

    def _held(self, copy: Copy) -> bool:
        """Whether a pod the claim is reserved for is active on this node."""
        return self._any_active(copy.holders)

    def _any_active(self, pods: Iterable[str]) -> bool:
        return any(uid in self.pods for uid in pods)

    def _kept(self) -> set[ClaimKey]:
        """Every claim the cache has something of: a copy, a mark, a read."""
        return set(self._copies) | set(self._elsewhere) | set(self._reading)

    def _forget(self, keys: Iterable[ClaimKey]) -> None:
        for key in keys:
            self._copies.pop(key, None)
            self._elsewhere.pop(key, None)
            reading = self._reading.pop(key, None)
            if reading is not None:
                reading.spoiled = True

    def _to_read(self, keys: Iterable[ClaimKey]) -> list[Reading]:
        """Reads of those of ``keys`` that a pod still to start uses and that are not read yet
        (nor being read)."""
        if not self.live:
            return []
        readings = []
        for key in sorted(keys):
            known = key in self._copies or key in self._elsewhere or key in self._reading
            if known or not self.pods.starting_use(key):
                continue
            reading = self._reading[key] = Reading(key)
            readings.append(reading)
        return readings

    # ---- I/O -----------------------------------------------------------------------------

    async def run_forever(self, api: kube.Kube) -> NoReturn:
        """List and watch this node's pods, forever, and read their claims as they say
        (``kube.Kube.watch_forever`` with watch-lists: the node's pods, then their events, the
        pods again after every break, one request each; ``broken`` is called when it breaks,
        ``resumed`` when, on a server without watch-lists, it is watched again from where it
        broke). The reads are tasks of this one, at most ``READS`` on the wire at once."""
        async with asyncio.TaskGroup() as reads:

            def start(readings: list[Reading]) -> None:
                for reading in readings:
                    key = reading.key
                    name = f"claim-read {key.namespace}/{key.name}"
                    reads.create_task(self._read(api, reading), name=name)

            pods = api.watch_forever(
                PODS,
                on_break=self.broken,
                on_resume=lambda: start(self.resumed()),
                page_size=LIST_PAGE,
                watch_list=True,
                fieldSelector=f"spec.nodeName={self.node}",
            )
            async for kind, obj in pods:
                if kind == "PAGE":
                    self.page(obj.get("items") or [])
                elif kind == "SYNC":
                    readings = self.synced()
                    log.info(
                        "claim cache: %d pod(s) of node %s use claims; reading %d claim(s)",
                        len(self.pods),
                        self.node,
                        len(readings),
                    )
                    start(readings)
                else:
                    start(self.apply(kind, obj))
        raise AssertionError("watch_forever never ends")

    async def _read(self, api: kube.Kube, reading: Reading) -> None:
        try:
            async with self._slots:
                if reading.taken or reading.spoiled:  # taken: a prepare sends it, ends it
                    return
                reading.sent = True
                claim = await _get(api, reading.key)
            self.answered(reading, claim)
        finally:
            if not reading.taken:
                if self._reading.get(reading.key) is reading:  # cancelled: not answered
                    del self._reading[reading.key]
                reading.done.set()


async def _get(api: kube.Kube, key: ClaimKey) -> kube.Body | None:
    """The claim, or None (said in the log) where it cannot be read now: a prepare reads it
    itself."""
    path = ClaimRef(key.namespace, key.name, bodies.ClaimUID("")).path  # the UID is not in it
    try:
        return await api.get(path)
    except kube.ApiError as exc:
        if exc.not_found:
            log.info("claim cache: ResourceClaim %s/%s is not there yet", *key)
            return None
        why = str(exc)
    except (OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    log.warning(
        "claim cache: cannot read ResourceClaim %s/%s now (its prepare will): %s", *key, why
    )
    return None

"""The controller's start: a view complete for the explanations before Kopf has handed it over.

Kopf lists each kind at start and hands the objects over one at a time, at 1-2 ms of its own
per object: at 1,000 nodes x 8 and 20,000 pods the last DeviceClass, slice and claim came
28 s after start, the last Pod one to two minutes after. A claim explained on such a view is
told that no device fits while the slices still arrive, and told again once they are there. So
every replica reads what an explanation reads itself, into the same view
(``ClusterView.offer``), and the leader explains and checks nothing before these reads are
done (``complete``; ``Controller.reconcile_once``):

- DeviceClasses, ResourceSlices, ResourceClaims, Nodes and DeviceTaintRules (in the version
  served, if any): one paged list of each kind;
- Pods not bound to a node (``fieldSelector=spec.nodeName=``): the waiting pods, whichever way
  they name their claims. The pods an explanation of a pending claim reads are those; bound
  pods come with Kopf;
- then, until Kopf has handed over its Pod listing (its first Pod watch event after it), the
  pod of a pending claim made from a template when the view has none using the claim
  (``owners.unseen``): read by name (``fieldSelector=metadata.name=``, the ``list`` the chart
  grants already), and again after a back-off while the pod does not name the claim yet. That
  is how a claim created while Kopf still lists the Pods finds its pod at once. A claim
  referenced by name has no owner to read: its waiting pods are those of the list, or come
  with Kopf.

Kopf stays the watcher of every kind: these are reads, each once. Each list is requested only
after Kopf has handed over an object of its kind, so Kopf's own listing is older than what is
read, and whatever is read, Kopf's stream tells of too, its deletion included: nothing read
outlives the object. A kind of which Kopf has handed over nothing within ``FIRST_WAIT`` is
probed (``limit=1``): empty, it is complete (there is nothing to read); otherwise the list waits
for Kopf's first object of it (``KOPF_WAIT`` at most: then the kind is left to Kopf, and the
leader does not wait for ever). A list whose continue token expired (410) starts again; a
failure is tried again after a back-off (``LIST_BACKOFF``); a refusal (401, 403, 404) is
logged and leaves that kind to Kopf alone (the leader then starts without it, as it did before
these reads existed).

Owns: ``StartUp``: the reads, what Kopf has handed over so far (``heard``, called by
``wiring`` for each of Kopf's events), when the reads are done (``complete``, ``phases``).
Must not: decide what the view takes of a read (``ClusterView.offer``), explain anything, or
watch (Kopf does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from dra_gpu import kube
from dra_gpu.controller import owners, view
from dra_gpu.controller.view import ClusterView
from dra_gpu.kube import backoff, watch

log = logging.getLogger(__name__)

RESOURCE = "/apis/resource.k8s.io"
PAGE_SIZE = 500
"""Objects per page of a list (Kopf's own listings use as many)."""
FIRST_WAIT = 1.0
"""Seconds to wait for Kopf's first object of a kind before probing whether there is any."""
KOPF_WAIT = 60.0
"""Seconds to wait at most for Kopf's first object of a kind that has some (then the kind is
left to Kopf: the leader does not wait for ever)."""
LIST_BACKOFF = backoff.Backoff(1.0, cap=30.0)
"""Between two tries of a list that failed."""
READ_BACKOFF = backoff.Backoff(0.25, cap=4.0)
"""Between two reads of a pod that did not name its claim yet."""
READ_TRIES = 8
"""Reads of one claim's pod at most (about 15 s with ``READ_BACKOFF``)."""
READ_PARALLEL = 8
"""Pods read by name at a time."""
REFUSED = (401, 403, 404)
"""Answers a list does not retry: the kind is left to Kopf."""


@dataclasses.dataclass(frozen=True)
class Listing:
    """One of the start-up's lists: the objects of ``kind`` at ``path`` that ``query`` selects."""

    kind: str
    path: str
    query: Mapping[str, str] = dataclasses.field(default_factory=dict)


def listings(taint_rules: str | None) -> tuple[Listing, ...]:
    """The lists of the start-up; ``taint_rules``: the version of resource.k8s.io that serves
    DeviceTaintRules (None: none is)."""
    found = [
        Listing("DeviceClass", f"{RESOURCE}/v1/deviceclasses"),
        Listing("ResourceSlice", f"{RESOURCE}/v1/resourceslices"),
        Listing("ResourceClaim", f"{RESOURCE}/v1/resourceclaims"),
        Listing("Node", "/api/v1/nodes"),
        Listing("Pod", "/api/v1/pods", {"fieldSelector": "spec.nodeName="}),
    ]
    if taint_rules is not None:
        found.append(Listing("DeviceTaintRule", f"{RESOURCE}/{taint_rules}/devicetaintrules"))
    return tuple(found)


class StartUp:
    """The start-up reads of one replica (``run``), fed what Kopf hands over (``heard``)."""

    def __init__(
        self,
        api: kube.Kube,
        cluster: ClusterView,
        changed: Callable[[], None],
        *,
        timing: backoff.Timing = backoff.REAL,
    ) -> None:
        self.api = api
        self.view = cluster
        self.changed = changed
        """Called when a read changed the view (a pass is due), and when the reads are done."""
        self.timing = timing
        self.complete = False
        """Every list is done: the view holds each kind as it was at least at its list."""
        self.phases: dict[str, float] = {}
        """Seconds from ``run`` to each list done (by kind), to ``complete`` and to the end of
        the reads by name (``pods read``): for the log and the benchmark."""
        self.offered = 0
        """Objects the reads changed the view with (the rest Kopf had handed over already)."""
        self._first = {kind: asyncio.Event() for kind in view.KINDS}
        self._pods_listed = asyncio.Event()  # Kopf's first Pod watch event: its listing is over
        self._due: set[str] = set()  # pending claims whose pod is to be read
        self._wanted = asyncio.Event()
        self._reading: set[str] = set()
        self._started = 0.0

    # ---- what Kopf hands over ----------------------------------------------------------------

    def heard(self, kind: str, event_type: str | None) -> None:
        """Kopf handed over an object of ``kind`` (``event_type`` None: from its listing)."""
        first = self._first.get(kind)
        if first is not None and not first.is_set():
            first.set()
        if kind == "Pod" and event_type is not None and not self._pods_listed.is_set():
            self._pods_listed.set()
            self._wanted.set()  # the readers stop
            if self._started:
                self.phases["Kopf's pods"] = self._since()
                log.info(
                    "Kopf has handed over its Pod listing, %.1f s after the start-up began",
                    self.phases["Kopf's pods"],
                )

    def note(self, claim_keys: Iterable[str]) -> None:
        """Claims that changed (a pass's batch): those pending whose pod the view does not know
        are read, while the reads by name go on."""
        if not self.complete or self._pods_listed.is_set():
            return
        for key in claim_keys:
            if key not in self._reading and owners.unseen(self.view, key) is not None:
                self._due.add(key)
        if self._due:
            self._wanted.set()

    # ---- the reads ---------------------------------------------------------------------------

    async def run(self, taint_rules: str | None) -> None:
        """The lists, then the pods read by name until Kopf has handed over its Pod listing;
        returns then (the view is Kopf's alone again)."""
        self._started = self.timing.clock()
        self.view.begin_reads()
        try:
            async with asyncio.TaskGroup() as lists:
                for listing in listings(taint_rules):
                    lists.create_task(self._list(listing), name=f"start-up list {listing.kind}")
            self.complete = True
            self.phases["complete"] = self._since()
            log.info(
                "start-up lists done in %.1f s (%s; %d objects ahead of Kopf): explaining",
                self.phases["complete"],
                ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items() if k in view.KINDS),
                self.offered,
            )
            self.changed()
            self.note(self.view.pending_keys())
            await self._read_pods()
        finally:
            self.view.end_reads()
            self.phases.setdefault("pods read", self._since())

    def _since(self) -> float:
        return self.timing.clock() - self._started

    async def _list(self, listing: Listing) -> None:
        first = self._first[listing.kind]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_WAIT):
                await first.wait()
        if not first.is_set():
            probe = await self._try(listing, lambda: self._page(listing, limit=1))
            if probe is None or (not probe.get("items") and not _more(probe)):
                self.phases[listing.kind] = self._since()
                return  # none (what comes later, Kopf brings), or not ours to list
            try:
                async with asyncio.timeout(KOPF_WAIT):
                    await first.wait()  # Kopf's listing first: see the module's docstring
            except TimeoutError:
                log.warning(
                    "start-up: Kopf handed over no %s within %.0f s; explanations start "
                    "without listing them",
                    listing.kind,
                    KOPF_WAIT,
                )
                self.phases[listing.kind] = self._since()
                return
        await self._try(listing, lambda: self._offer_all(listing))
        self.phases[listing.kind] = self._since()

    async def _page(self, listing: Listing, **paging: Any) -> kube.Body:
        return await self.api.get(listing.path, **listing.query, **paging)

    async def _offer_all(self, listing: Listing) -> kube.Body:
        """Every page of the list, each object offered to the view as it comes."""
        count = 0
        async for page in watch.pages(self.api, listing.path, PAGE_SIZE, **listing.query):
            changed = False
            for item in page.get("items") or []:
                if isinstance(item, dict) and self.view.offer(listing.kind, item):
                    changed = True
                    self.offered += 1
                count += 1
            if changed:
                self.changed()
            await asyncio.sleep(0)  # Kopf's events and the probes between two pages
        log.debug("start-up: %d %s objects listed", count, listing.kind)
        return {}

    async def _try(
        self, listing: Listing, attempt: Callable[[], Awaitable[kube.Body]]
    ) -> kube.Body | None:
        """``attempt`` until it succeeds: again at once after a 410 (a list's continue token
        expired), after a back-off on any other failure; None after a refusal."""
        delays = LIST_BACKOFF.delays(self.timing)
        while True:
            try:
                result: kube.Body = await attempt()
                return result
            except kube.ApiError as exc:
                if exc.status == 410:  # its continue token expired: from the start again
                    log.info("start-up list of %s expired; listing again", listing.kind)
                    await self.timing.sleep(delays.next())
                    continue
                if exc.status in REFUSED:
                    log.warning(
                        "start-up: cannot list %s (%s); explanations start without it",
                        listing.kind,
                        exc,
                    )
                    return None
                failure: Exception = exc
            except kube.CONNECTION_ERRORS as exc:
                failure = exc
            delay = delays.next()
            log.warning(
                "start-up list of %s failed (%s); trying again in %.1f s",
                listing.kind,
                failure,
                delay,
            )
            await self.timing.sleep(delay)

    async def _read_pods(self) -> None:
        """Read the pods ``note`` asks for, ``READ_PARALLEL`` at a time, until Kopf has handed
        over its Pod listing."""
        running: set[asyncio.Task[None]] = set()
        async with asyncio.TaskGroup() as readers:
            while not self._pods_listed.is_set():
                await self._wanted.wait()
                self._wanted.clear()
                while self._due and len(self._reading) < READ_PARALLEL:
                    key = self._due.pop()
                    self._reading.add(key)
                    task = readers.create_task(self._read_pod(key), name=f"start-up read {key}")
                    running.add(task)
                    task.add_done_callback(running.discard)
            for task in running:
                task.cancel()  # Kopf has them all now
        self.phases["pods read"] = self._since()

    async def _read_pod(self, claim_key: str) -> None:
        delays = READ_BACKOFF.delays(self.timing)
        try:
            for _ in range(READ_TRIES):
                pod = owners.unseen(self.view, claim_key)
                if pod is None or self._pods_listed.is_set():
                    return  # the view has it, the claim went, or Kopf took over
                try:
                    found = await self.api.get(
                        f"/api/v1/namespaces/{pod.namespace}/pods",
                        fieldSelector=f"metadata.name={pod.name}",
                    )
                except kube.ApiError as exc:
                    if exc.status in REFUSED:
                        log.warning("start-up: cannot read pod %s (%s)", pod.key, exc)
                        return
                    log.debug("start-up: reading pod %s failed: %s", pod.key, exc)
                except kube.CONNECTION_ERRORS as exc:
                    log.debug("start-up: reading pod %s failed: %s", pod.key, exc)
                else:
                    items = [
                        p
                        for p in found.get("items") or []
                        if isinstance(p, dict)
                        and (not pod.uid or p.get("metadata", {}).get("uid") == pod.uid)
                    ]
                    if not items:
                        return  # gone (a namesake is not the claim's pod)
                    if self.view.offer("Pod", items[0]):
                        self.offered += 1
                        self.changed()
                    if owners.unseen(self.view, claim_key) is None:
                        return
                await delays.wait()
        finally:
            self._reading.discard(claim_key)
            if self._due:
                self._wanted.set()


def _more(page: kube.Body) -> bool:
    return bool((page.get("metadata") or {}).get("continue"))

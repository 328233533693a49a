"""Explanations of pending claims, worked out again only for claims whose inputs changed.

Owns: which pending claims — those a pod waits for, of a class that may be ours — need a fresh
explanation after a batch of changes; computing those against one ``explain.World`` per pass
(over the view's indexes and a ``Layout`` kept until a pool changes); queueing those with a
missing piece and posting them from a task of its own (``post_forever``) through the
``posting.Reporter``, which posts an explanation only when its meaning (``meanings.Meaning``: the
reason, the piece, what blocks) is not what it last posted for that claim. The queue holds the
newest explanation per claim, and only one whose meaning is news: a device taken or freed makes
every claim of its class worth working out again (its counts moved), seldom worth telling again.
New waiting pods' claims go in a lane of their own, beside the re-posts a changed reason causes;
the claims a new leader finds waiting (its first sweep, ``restart``) go with the others, so a pod
created meanwhile does not wait behind them. A lane whose posts failed tries again after a
back-off (``RETRY``: jittered, growing, reset by a success).

A claim's explanation reads the claim, the pods that use it (the first waiting one's node
constraints), its DeviceClasses, and what those classes can see of the cluster. That last part
is summed up as an epoch per class name, bumped when something the class's requests could read
changes:

- the class itself (created, edited, deleted);
- a pool with a device the class does not rule out with a plain "no", before or after the
  change; any incomplete pool (requests mention them); any pool at all while the class has no
  such device (its message then lists devices of other classes) or has node-independent ones;
- the holders of a device the class admits, or of a device that consumes a counter set such a
  device consumes (a partition taken leaves less of the GPU's counters for the others);
- a node with a device the class does not rule out; any node while it has node-independent
  devices (they can run on every node).

A claim is explained again when its stamp, its pods' stamps or an epoch of its classes moved
(``ClusterView.stamp`` moves only when a field the controller keeps changes).

The fourth piece, the driver: an allocated claim of our driver whose pod is bound to a node and
still Pending, while the kubelet's latest prepare failure on that pod (``PrepareFailures`` puts
it in the view) concerns it, is explained as ``DriverNotReady`` — which driver, on which node,
since when, what the kubelet said — again only when the claim, the pod or the failure changes
(not at each of the kubelet's retries). Once its pod runs, the claim and the pod get one Normal
``Prepared`` Event, and the claim is forgotten.

Must not: read or write the API itself (the Reporter does), or block the loop for long: it
yields between batches of claims and leaves the rest for the next pass if the view changed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn

from dra_gpu import cel
from dra_gpu.controller import explain, kubelet, meanings, published, selections
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.selectors import class_drivers, class_selectors
from dra_gpu.controller.view import Changes, ClusterView, PoolKey
from dra_gpu.kube import backoff
from dra_gpu.resource import bodies

log = logging.getLogger(__name__)

SLICE = 0.004
"""Seconds of explaining between two yields to the event loop: what an admission review,
a scrape or a probe waits at most behind the explanations (10 ms before: the admission
benchmark's p99 was that slice; start-up at 1,000 x 8 was no slower with 4 ms)."""
PARALLEL = 16
"""Claims posted at a time (each a few Events, posted together)."""
URGENT_PARALLEL = 4
"""The same, for new waiting pods' claims, posted beside the others."""
BULK = 2_000
"""A batch of changes this large (a start, a relist) makes every class's claims stale at once
instead of being traced one change at a time."""
RETRY = backoff.Backoff(1.0, cap=30.0)
"""Between two tries of a lane whose posts failed (the API server refused or did not answer)."""


class Stale(NamedTuple):
    """A pending claim whose explanation's inputs changed (``Explainer.stale``)."""

    key: str
    """``namespace/name`` of the claim."""
    waiting: list[dict[str, Any]]
    """Its pods, the one it is explained for first."""
    inputs: tuple[Any, ...]
    """What the explanation is worked out from: the claim's stamp, its pods' stamps, then its
    classes' epochs, or the kubelet's ``PrepareFailure`` for the driver's part."""
    urgent: bool
    """Whether the claim's own inputs (the claim, its pods) changed: posted in the lane of
    new waiting pods."""


@dataclasses.dataclass(frozen=True)
class _Done:
    """A claim's explanation, and the inputs it was worked out from."""

    key: str
    inputs: tuple[Any, ...]
    uid: bodies.ClaimUID
    claim: dict[str, Any]
    waiting: list[dict[str, Any]]
    result: explain.Explanation | None
    """None: the claim's classes all belong to other drivers."""

    @functools.cached_property
    def meaning(self) -> meanings.Meaning | None:
        """What ``result`` means (what decides whether it is posted again)."""
        return meanings.of(self.result) if self.result is not None else None


class Explainer:
    def __init__(
        self,
        view: ClusterView,
        reporter: Reporter,
        driver: str,
        selections: Selections,
        *,
        timing: backoff.Timing = backoff.REAL,
    ) -> None:
        self.view = view
        self.timing = timing
        self.reporter = reporter
        self.driver = driver
        self.selections = selections
        self.epochs: collections.Counter[str] = collections.Counter()
        self.bulk = BULK
        self.explained = 0
        """Explanations computed so far (each claim whose inputs changed counts once)."""
        self._classes: dict[str, tuple[cel.Compiled, ...]] = {}
        self._counts: dict[str, list[int]] = {}  # class -> candidates, node-independent ones
        self._pool_counts: dict[PoolKey, dict[str, tuple[int, int]]] = {}
        self._layout: explain.Layout | None = None
        self._world: tuple[int, explain.World] | None = None  # and the generation it saw
        self._checks = explain.Checks(self.epochs.__getitem__)
        self._done: dict[str, _Done] = {}
        self._names: dict[str, tuple[int, list[str]]] = {}  # claim -> its stamp, its classes
        self._clean_at: int | None = None
        # Explanations to post: for claims whose own inputs changed, and the others.
        self._urgent: dict[str, _Done] = {}
        self._outbox: dict[str, _Done] = {}
        self._in_flight: set[str] = set()
        self._unprepared: dict[str, _Done] = {}  # claims told DriverNotReady: told when it runs
        self._sweeping = False  # the next pass is a new leader's first: its claims are a sweep
        self._sweep: set[str] = set()  # claims of that sweep not explained yet
        self._due = {id(self._urgent): asyncio.Event(), id(self._outbox): asyncio.Event()}

    # ---- what changed ----------------------------------------------------------------------

    def note(self, changes: Changes) -> None:
        """Take one batch of changes (every pass, leader or not): bump the epochs it touches."""
        if changes.pools:
            self._layout = None
        for name in sorted(changes.classes):
            self._recount_class(name)
        bulk = len(changes.pools) + len(changes.held) + len(changes.nodes) > self.bulk
        for key, before in changes.pools.items():
            self._pool_changed(key, before, bump=not bulk)
        if bulk:
            self.epochs.update(dict.fromkeys(self._classes, 1))
            return
        for device in changes.held:
            self._held_changed(device)
        for node in changes.nodes:
            self._node_changed(node)

    def restart(self) -> None:
        """Explain every pending claim again on the next pass (this replica now leads), in the
        lane of the others (a sweep), and read what the last Event on each claim meant: another
        leader may have posted since."""
        self._done.clear()
        self._clean_at = None
        self._sweeping = True
        self.reporter.forget()

    def _recount_class(self, name: str) -> None:
        self.epochs[name] += 1
        for counts in self._pool_counts.values():
            counts.pop(name, None)
        body = self.view.classes.get(name)
        if body is None:
            self._classes.pop(name, None)
            self._counts.pop(name, None)
            return
        compiled = self._classes[name] = class_selectors(body)
        totals = [0, 0]
        for key, pool in self.view.pools.items():
            row = self._count(compiled, pool)
            if any(row):
                self._pool_counts.setdefault(key, {})[name] = row
                totals[0] += row[0]
                totals[1] += row[1]
        self._counts[name] = totals

    def _count(self, compiled: tuple[cel.Compiled, ...], pool: published.Pool) -> tuple[int, int]:
        """Devices of a complete pool the class does not rule out, and those without a node."""
        if not pool.complete:
            return 0, 0
        outcomes = self.selections.outcomes(compiled, pool)
        found = [d for d, o in zip(pool.devices, outcomes, strict=True) if selections.candidate(o)]
        return len(found), sum(1 for d in found if d.node is None)

    def _pool_changed(self, key: PoolKey, before: published.Pool | None, *, bump: bool) -> None:
        after = self.view.pools.get(key)
        incomplete = (before is not None and not before.complete) or (
            after is not None and not after.complete
        )
        old_rows = self._pool_counts.pop(key, {})
        new_rows: dict[str, tuple[int, int]] = {}
        for name, compiled in self._classes.items():
            old = old_rows.get(name, (0, 0))
            new = self._count(compiled, after) if after is not None else (0, 0)
            if any(new):
                new_rows[name] = new
            totals = self._counts[name]
            was = tuple(totals)
            totals[0] += new[0] - old[0]
            totals[1] += new[1] - old[1]
            if bump and (
                incomplete or old[0] or new[0] or not was[0] or not totals[0] or was[1] or totals[1]
            ):
                self.epochs[name] += 1
        if new_rows:
            self._pool_counts[key] = new_rows

    def _held_changed(self, device: published.DeviceKey) -> None:
        pool = self.view.pools.get((device[0], device[1]))
        if pool is None or not pool.complete:
            return  # not in the World: nobody sees its holders
        positions = [i for i, d in enumerate(pool.devices) if d.name == device[2]]
        for counter_set in {s for i in positions for s, _ in pool.devices[i].consumes}:
            positions.extend(pool.consumers.get(counter_set, ()))
        for name, compiled in self._classes.items():
            outcomes = self.selections.outcomes(compiled, pool)
            if any(selections.admits(outcomes[i]) for i in positions):
                self.epochs[name] += 1

    def _node_changed(self, node: str) -> None:
        touched: set[str] = {n for n, counts in self._counts.items() if counts[1]}
        for key in self.view.pools_on_node(node):
            pool = self.view.pools[key]
            if not pool.complete:
                continue
            positions = [i for i, d in enumerate(pool.devices) if d.node == node]
            for name, compiled in self._classes.items():
                outcomes = self.selections.outcomes(compiled, pool)
                if any(selections.candidate(outcomes[i]) for i in positions):
                    touched.add(name)
        for name in touched:
            self.epochs[name] += 1

    # ---- explaining ------------------------------------------------------------------------

    def world(self) -> explain.World:
        """The World of this pass, over the view's indexes."""
        view = self.view
        if self._layout is None:
            self._layout = explain.Layout(view.pools.values(), self.selections)
        return explain.World(
            self._layout,
            view.holders,
            view.nodes,
            lambda: list(view.slices.values()),
            checks=self._checks,
            usage=view.usage,
        )

    def current_world(self) -> explain.World:
        """``world()``, built once per generation of the view (every reader of one pass, and
        admission between passes, shares it)."""
        if self._world is None or self._world[0] != self.view.generation:
            self._world = (self.view.generation, self.world())
        return self._world[1]

    def stale(self) -> list[Stale]:
        """Pending claims with a waiting pod whose explanation's inputs changed, each with
        whether its own inputs (the claim, its pods) changed: those come first — a new waiting
        pod is answered before claims that only see a device taken — then by name. Forgets
        claims no longer waiting."""
        view = self.view
        found = []
        waiting_keys = set()
        for key in view.pending_keys():
            claim = view.claims[key]
            pod_keys = view.pod_keys_of(key)
            waiting = [view.pods[p] for p in pod_keys if not view.pods[p]["spec"].get("nodeName")]
            if not waiting:
                continue
            waiting_keys.add(key)
            stamp = view.stamp("ResourceClaim", key)
            names = self._names.get(key)
            if names is None or names[0] != stamp:
                names = self._names[key] = (stamp, explain.class_names(claim))
            inputs: tuple[Any, ...] = (
                stamp,
                tuple(view.stamp("Pod", p) for p in pod_keys),
                tuple(self.epochs[n] for n in names[1]),
            )
            done = self._done.get(key)
            if done is None or done.inputs != inputs:
                own = done is None or done.inputs[:2] != inputs[:2]
                found.append((not own, key, waiting, inputs))
        for pod_key, failure in view.prepare_failures.items():
            pod = view.pods.get(pod_key)
            if pod is None or not _waits_for_prepare(pod, failure):
                continue
            for key in view.claim_keys_of_pod(pod_key):
                held = view.claims.get(key)
                if key in waiting_keys or held is None or not failure.concerns(held, self.driver):
                    continue
                waiting_keys.add(key)
                inputs = (view.stamp("ResourceClaim", key), (view.stamp("Pod", pod_key),), failure)
                done = self._done.get(key)
                if done is None or done.inputs != inputs:
                    found.append((False, key, [pod], inputs))
        for key in set(self._done) - waiting_keys:
            del self._done[key]
        for key in set(self._names) - waiting_keys:
            del self._names[key]
        self._sweep &= waiting_keys
        for queue in (self._urgent, self._outbox):
            for key in set(queue) - waiting_keys:
                result = queue[key].result
                if result is None or result.reason != explain.Reason.PREPARED:
                    del queue[key]  # an all-clear is still due
        found.sort(key=lambda entry: entry[:2])
        return [Stale(key, waiting, inputs, not later) for later, key, waiting, inputs in found]

    def last(self, key: str) -> explain.Explanation | None:
        """The explanation last worked out for a pending claim (None: none, or not ours)."""
        done = self._done.get(key)
        return done.result if done is not None else None

    def refresh(self) -> int:
        """Work out every stale explanation now, without reporting; returns how many."""
        stale = self.stale()
        for entry in stale:
            self._done[entry.key] = self._explain(entry.key, entry.waiting, entry.inputs)
        self._clean_at = self.view.generation
        return len(stale)

    async def explain_pending(self) -> None:
        """Work out the stale claims' explanations, queue those with a missing piece for
        ``post_due``, and forget, in the Reporter, claims no longer pending (explained anew if
        they are again).

        The queue keeps the newest explanation per claim: one that a newer one replaced before
        it was posted is never posted. Works in slices of ``SLICE`` seconds and stops early when
        the view changed meanwhile: the rest comes in the next pass, after what just changed (a
        new waiting pod goes first)."""
        view = self.view
        if self._clean_at == view.generation:
            return  # nothing changed since every explanation was last worked out
        generation = view.generation  # what ``stale`` sees: a change after it comes next pass
        stale = self.stale()
        if self._sweeping:  # a new leader's first pass: every claim waiting now is a sweep
            self._sweeping = False
            self._sweep = {entry.key for entry in stale}
        await asyncio.sleep(0)  # the list took up to a few ms: a break before the first slice
        reached = 0
        started = time.monotonic()
        while reached < len(stale):
            if time.monotonic() - started >= SLICE:
                await asyncio.sleep(0)  # let watch events and /metrics in
                if view.generation != generation:
                    break
                started = time.monotonic()
            entry = stale[reached]
            key = entry.key
            done = self._done[key] = self._explain(key, entry.waiting, entry.inputs)
            self._urgent.pop(key, None)
            self._outbox.pop(key, None)
            urgent = entry.urgent and key not in self._sweep
            self._sweep.discard(key)
            if done.result is not None and done.result.missing:
                assert done.meaning is not None
                result = done.result
                if self.reporter.is_news(done.uid, result.reason, result.message, done.meaning):
                    (self._urgent if urgent else self._outbox)[key] = done
                elif result.reason == explain.Reason.DRIVER_NOT_READY:
                    self._unprepared[key] = done  # told already: its all-clear is still due
            reached += 1
        left = stale[reached:]
        if left:
            log.debug("explained %d claims; %d wait for the next pass", reached, len(left))
        else:
            self._clean_at = generation
        self._note_prepared()
        # Claims still pending and ours, whether explained now or before; and those not reached.
        keep = {d.uid for d in self._done.values() if d.result is not None}
        keep |= {bodies.claim_uid(view.claims[entry.key]) for entry in left}
        self.reporter.keep_only(keep)
        self._wake_lanes()

    def _note_prepared(self) -> None:
        """Queue the all-clear for claims told DriverNotReady whose pod now runs; forget those
        whose pod went away."""
        for key, told in list(self._unprepared.items()):
            if key in self._done:
                continue  # still waiting for the driver
            pod = self.view.pods.get(_key_of(told.waiting[0]))
            claim = self.view.claims.get(key)
            if pod is None or claim is None or _uid(pod) != _uid(told.waiting[0]):
                del self._unprepared[key]
            elif (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                del self._unprepared[key]
                result = explain.prepared(claim, pod, self.view.classes)
                self._outbox[key] = _Done(key, (), told.uid, claim, [pod], result)

    def _wake_lanes(self) -> None:
        for queue in (self._urgent, self._outbox):
            if queue:
                self._due[id(queue)].set()

    def queued(self) -> int:
        return len(self._urgent) + len(self._outbox)

    def lanes(self) -> tuple[list[str], list[str]]:
        """The claims queued in the lane of new waiting pods, and in the other one."""
        return list(self._urgent), list(self._outbox)

    def drop_queue(self) -> None:
        """Post nothing queued (this replica no longer leads)."""
        self._urgent.clear()
        self._outbox.clear()
        self._unprepared.clear()

    async def post_due(self) -> int:
        """Post every queued explanation; returns how many (``post_forever`` without the
        waiting: for tests and benchmarks). A failure is raised, its claim queued again."""
        posted = 0
        while self._urgent or self._outbox:
            counts = await asyncio.gather(
                self._drain(self._urgent, URGENT_PARALLEL), self._drain(self._outbox, PARALLEL)
            )
            posted += sum(counts)
        return posted

    async def post_forever(self) -> NoReturn:
        """Post what ``explain_pending`` queues, as it comes, in two lanes: new waiting pods'
        explanations never wait behind a long run of others (a class edited, a pool
        republished can change the meaning of every claim of a class)."""
        async with asyncio.TaskGroup() as lanes:
            lanes.create_task(self._lane(self._urgent, URGENT_PARALLEL), name="urgent")
            lanes.create_task(self._lane(self._outbox, PARALLEL), name="others")
        raise asyncio.CancelledError  # both lanes cancelled on their own: a stop

    async def _lane(self, queue: dict[str, _Done], parallel: int) -> NoReturn:
        due = self._due[id(queue)]
        delays = RETRY.delays(self.timing)
        while True:
            await due.wait()
            due.clear()
            try:
                await self._drain(queue, parallel)
            except Exception as exc:
                delay = delays.next()
                log.warning("posting explanations failed (%s); trying again in %.1f s", exc, delay)
                await self.timing.sleep(delay)
                due.set()
            else:
                delays.reset()

    async def _drain(self, queue: dict[str, _Done], parallel: int) -> int:
        """Post from ``queue``, ``parallel`` claims at a time, skipping claims whose earlier
        explanation is being posted (one claim's posts stay in order)."""
        posted = 0
        while True:
            batch = []
            for key in list(queue):
                if key not in self._in_flight:
                    batch.append(queue.pop(key))
                    self._in_flight.add(key)
                    if len(batch) == parallel:
                        break
            if not batch:
                return posted
            try:
                outcomes = await asyncio.gather(
                    *(self._post(done) for done in batch), return_exceptions=True
                )
            finally:
                self._in_flight.difference_update(done.key for done in batch)
                self._wake_lanes()  # the other lane may have skipped these claims
            failed = None
            for done, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    failed = failed or outcome
                    if done.key not in self._urgent and done.key not in self._outbox:
                        queue[done.key] = done
            posted += len(batch)
            if failed is not None:
                raise failed

    async def _post(self, done: _Done) -> None:
        assert done.result is not None
        assert done.meaning is not None
        reason, message = done.result.reason, done.result.message
        kind = "Warning" if done.result.missing else "Normal"
        await self.reporter.report(
            done.claim, done.waiting, str(reason), message, meaning=done.meaning, type_=kind
        )
        if reason == explain.Reason.DRIVER_NOT_READY:
            self._unprepared[done.key] = done

    def _explain(self, key: str, waiting: list[dict[str, Any]], inputs: tuple[Any, ...]) -> _Done:
        claim = self.view.claims[key]
        uid = bodies.claim_uid(claim)
        failure = inputs[2] if isinstance(inputs[2], kubelet.PrepareFailure) else None
        if failure is not None:  # the driver's part: only the claim's own pools are read
            pools = {published.result_key(r)[:2] for r in bodies.allocation_results(claim)}
            result = explain.explain_claim(
                claim,
                pod=waiting[0],
                classes=self.view.classes,
                slices=[s for pool in sorted(pools) for s in self.view.slices_of_pool(pool)],
                claims=(),
                nodes=self.view.nodes,
                prepare_failure=failure,
            )
            self.explained += 1
            return _Done(key, inputs, uid, claim, waiting, result)
        if not self._concerns_us(claim):
            return _Done(key, inputs, uid, claim, waiting, None)
        result = explain.explain(
            claim, self.current_world(), classes=self.view.classes, pod=waiting[0], detail=False
        )
        self.explained += 1
        return _Done(key, inputs, uid, claim, waiting, result)

    def _concerns_us(self, claim: Mapping[str, Any]) -> bool:
        """False when every request's class exists and selects another driver only."""
        for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
            choices = (
                [request["exactly"]]
                if "exactly" in request
                else request.get("firstAvailable") or []
            )
            for choice in choices:
                device_class = self.view.classes.get(choice.get("deviceClassName", ""))
                drivers = class_drivers(device_class) if device_class else set()
                if not drivers or self.driver in drivers:
                    return True
        return False


def _uid(body: Mapping[str, Any]) -> str:
    return str(body["metadata"].get("uid", ""))


def _key_of(body: Mapping[str, Any]) -> str:
    meta = body["metadata"]
    return f"{meta.get('namespace')}/{meta['name']}"


def _waits_for_prepare(pod: Mapping[str, Any], failure: kubelet.PrepareFailure) -> bool:
    """Bound to a node, still Pending, and the pod the kubelet spoke of (not a namesake)."""
    return (
        bool((pod.get("spec") or {}).get("nodeName"))
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
        and (not failure.pod_uid or failure.pod_uid == _uid(pod))
    )

"""The controller's cluster-wide numbers, kept up to date from what changed.

Owns the counts behind the gauges — devices and memory of our driver per node (published,
allocated, free), devices each DeviceClass admits (published, allocated, free), claims by state,
pools that are not complete, and per partitioned GPU and shared device of our driver the
counters, partitions, shared memory and shares in use; and when the oldest pending claim was
created (``dra_gpu_pending_claim_age_seconds`` is its age at each scrape). Every replica keeps
them (only the leader serves them: ``metrics.CLUSTER``). Each count is
a sum of per-pool contributions: a change to a pool's slices, or to the holders of one of its
devices, recounts that pool (a few devices), and an edited class is recounted over every pool
once. What it counts is what ``published.current_pools`` (complete pools only:
``published.Pool.complete``, the rule ``explain`` uses too), ``published.per_node`` with
``partitions.Usage`` (a device is free when a new claim could get it now: not held, its
counters not used up, a shared device with room for a share) and the class selectors say, so a
recount from scratch gives the same numbers (tests compare the two).

Must not: read the API or post anything; it sets gauges and reads the view.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from dra_gpu import cel
from dra_gpu.controller import partitions, published, selections, selectors
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.view import Changes, ClusterView, PoolKey
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

TAINT_EFFECTS = ("NoSchedule", "NoExecute")


class ClassRow(NamedTuple):
    """One pool's share of a DeviceClass's counts, which the tally adds up per class."""

    admitted: int
    """Devices of our driver the class admits."""
    allocated: int
    """Those of them allocated."""
    anywhere: int
    """Devices of any driver the class admits."""
    free: int
    """Devices of our driver the class admits that a new claim could get now."""


Series = dict[tuple[Any, tuple[str, ...]], float]
"""(gauge, its labels) -> value: a pool's series of the per-counter-set and per-shared-device
gauges."""


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Tally:
    def __init__(
        self,
        driver: str,
        selections: Selections,
        clock: Callable[[], datetime.datetime] = _utc_now,
    ) -> None:
        self.driver = driver
        self.selections = selections
        self.clock = clock
        self.oldest_pending: datetime.datetime | None = None
        """When the oldest pending claim was created; None: none is pending."""
        metrics.PENDING_CLAIM_AGE.set_function(lambda: pending_age(self.oldest_pending, clock()))
        self.classes: dict[str, tuple[cel.Compiled, ...]] = {}
        """Every DeviceClass's compiled selectors."""
        self.nodes: dict[str, list[int]] = {}
        """Node -> its pools' ``published.Counts`` added up, field by field (our driver)."""
        self.admitted: dict[str, list[int]] = {}
        """Class -> its pools' ``ClassRow`` added up, field by field."""
        self.problems: dict[PoolKey, published.PoolProblem] = {}
        """Pools (every driver) that are not complete (``published.Pool.complete``)."""
        self._pool_nodes: dict[PoolKey, dict[str, published.Counts]] = {}
        self._pool_classes: dict[PoolKey, dict[str, ClassRow]] = {}
        self.series: dict[PoolKey, Series] = {}
        """Per pool of our driver: its counter sets' and shared devices' series."""

    # ---- updating ------------------------------------------------------------------------

    def update(self, view: ClusterView, changes: Changes) -> None:
        """Take one batch of changes (``ClusterView.take_changes``) and set the gauges."""
        touched_nodes: set[str] = set()
        touched_classes: set[str] = set()
        for name in sorted(changes.classes):
            touched_classes.add(name)
            self._recount_class(view, name)
        pools = set(changes.pools) | {(driver, pool) for driver, pool, _ in changes.held}
        for key in sorted(pools):
            nodes, classes = self._recount_pool(view, key)
            touched_nodes |= nodes
            touched_classes |= classes
        if changes.claims:  # the pending claims' creation times, not their number, matter
            self.oldest_pending = oldest_created(view.pending_claims())
        self._set_gauges(touched_nodes, touched_classes, view)

    def _recount_class(self, view: ClusterView, name: str) -> None:
        body = view.classes.get(name)
        for rows in self._pool_classes.values():
            rows.pop(name, None)
        if body is None:
            self.classes.pop(name, None)
            self.admitted.pop(name, None)
            return
        compiled = self.classes[name] = selectors.class_selectors(body)
        totals = [0, 0, 0, 0]
        for key, pool in view.pools.items():
            if not pool.complete:
                continue
            row = self._class_row(view, compiled, pool)
            if any(row):
                self._pool_classes.setdefault(key, {})[name] = row
                for i in range(4):
                    totals[i] += row[i]
        self.admitted[name] = totals

    def _recount_pool(self, view: ClusterView, key: PoolKey) -> tuple[set[str], set[str]]:
        """Replace the pool's contributions; returns the nodes and classes whose sums moved."""
        pool = view.pools.get(key)
        problem = pool.problem() if pool is not None else None
        if problem is None:
            self.problems.pop(key, None)
        else:
            self.problems[key] = problem
        node_rows: dict[str, published.Counts] = {}
        class_rows: dict[str, ClassRow] = {}
        series: Series = {}
        if pool is not None and pool.complete:
            node_rows = self._node_rows(view, pool)
            for name, compiled in self.classes.items():
                row = self._class_row(view, compiled, pool)
                if any(row):
                    class_rows[name] = row
            if pool.driver == self.driver:
                series = pool_series(view.usage, pool)
        self._replace_series(key, series)
        nodes = self._replace(
            self.nodes, self._pool_nodes, key, node_rows, len(published.Counts._fields)
        )
        classes = self._replace(
            self.admitted, self._pool_classes, key, class_rows, len(ClassRow._fields)
        )
        return nodes, classes

    def _replace_series(self, key: PoolKey, series: Series) -> None:
        old = self.series.pop(key, {})
        if series:
            self.series[key] = series
        for (gauge, labels), value in series.items():
            if old.get((gauge, labels)) != value:
                gauge.labels(*labels).set(value)
        for gauge, labels in old.keys() - series.keys():
            _remove(gauge, *labels)

    @staticmethod
    def _replace(
        totals: dict[str, list[int]],
        contributions: dict[PoolKey, dict[str, Any]],
        key: PoolKey,
        rows: dict[str, Any],
        width: int,
    ) -> set[str]:
        old = contributions.pop(key, {})
        if rows:
            contributions[key] = rows
        moved = set()
        for name in set(old) | set(rows):
            before, after = old.get(name, (0,) * width), rows.get(name, (0,) * width)
            if before == after:
                continue
            total = totals.setdefault(name, [0] * width)
            for i in range(width):
                total[i] += after[i] - before[i]
            moved.add(name)
        return moved

    def _node_rows(self, view: ClusterView, pool: published.Pool) -> dict[str, published.Counts]:
        """The pool's share of each node's counts (the same rule as a full count)."""
        return published.per_node(pool.devices, view.holders, self.driver, view.usage)

    def _class_row(
        self, view: ClusterView, compiled: tuple[cel.Compiled, ...], pool: published.Pool
    ) -> ClassRow:
        outcomes = self.selections.outcomes(compiled, pool)
        ours = pool.driver == self.driver
        admitted = allocated = anywhere = free = 0
        available = view.usage.available
        for device, outcome in zip(pool.devices, outcomes, strict=True):
            if not selections.admits(outcome):
                continue
            anywhere += 1
            if ours:
                admitted += 1
                allocated += device.key in view.holders
                free += available(device)
        return ClassRow(admitted, allocated, anywhere, free)

    def _set_gauges(self, nodes: Iterable[str], classes: Iterable[str], view: ClusterView) -> None:
        for node in nodes:
            published, allocated, memory, memory_allocated, *tainted, free = self.nodes[node]
            if published == 0:  # no device of ours on it any more: drop its series
                del self.nodes[node]
                for state in ("published", "allocated", "free"):
                    _remove(metrics.DEVICES, node, state)
                    _remove(metrics.MEMORY, node, state)
                for effect in TAINT_EFFECTS:
                    _remove(metrics.TAINTED_DEVICES, node, effect)
                continue
            for effect, count in zip(TAINT_EFFECTS, tainted, strict=True):
                metrics.TAINTED_DEVICES.labels(node, effect).set(count)
            metrics.DEVICES.labels(node, "published").set(published)
            metrics.DEVICES.labels(node, "allocated").set(allocated)
            metrics.DEVICES.labels(node, "free").set(free)
            metrics.MEMORY.labels(node, "published").set(memory)
            metrics.MEMORY.labels(node, "allocated").set(memory_allocated)
            metrics.MEMORY.labels(node, "free").set(memory - memory_allocated)
        for name in classes:
            counts = self.admitted.get(name)
            if counts is None:
                for state in ("published", "allocated", "free"):
                    _remove(metrics.CLASS_DEVICES, name, state)
                continue
            metrics.CLASS_DEVICES.labels(name, "published").set(counts[0])
            metrics.CLASS_DEVICES.labels(name, "allocated").set(counts[1])
            metrics.CLASS_DEVICES.labels(name, "free").set(counts[3])
        for state in ("pending", "allocated", "reserved"):
            metrics.CLAIMS.labels(state).set(view.claim_states[state])
        metrics.INCONSISTENT_POOLS.set(sum(p.driver == self.driver for p in self.problems.values()))


def oldest_created(claims: Iterable[Mapping[str, Any]]) -> datetime.datetime | None:
    """The earliest ``metadata.creationTimestamp`` of ``claims`` (one without a readable one
    is left out); None for none."""
    oldest = None
    for claim in claims:
        created = timestamp((claim.get("metadata") or {}).get("creationTimestamp"))
        if created is not None and (oldest is None or created < oldest):
            oldest = created
    return oldest


def pending_age(oldest: datetime.datetime | None, now: datetime.datetime) -> float:
    """Seconds since ``oldest`` (0 for None, never below 0: a clock behind the API server's)."""
    if oldest is None:
        return 0.0
    return max((now - oldest).total_seconds(), 0.0)


def timestamp(value: object) -> datetime.datetime | None:
    """An API timestamp (RFC 3339, ``...Z``), aware; None for none or one that does not parse."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def _remove(gauge: Any, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)


def pool_series(usage: partitions.Usage, pool: published.Pool) -> Series:
    """The series of one complete pool of our driver: per counter set, each counter family used
    and free and the devices allocated from it; per shared device, its memory and shares."""
    found: Series = {}
    if pool.counter_sets:
        used = usage.pool(pool.key)
        for name, counter_set in pool.counter_sets.items():
            node = counter_set.node or pool.pool
            families = partitions.families(counter_set.counters, used.used.get(name, {}))
            for counter, (taken, free) in families.items():
                found[(metrics.COUNTERS, (node, name, counter, "used"))] = float(taken)
                found[(metrics.COUNTERS, (node, name, counter, "free"))] = float(free)
            found[(metrics.PARTITIONS_ALLOCATED, (node, name))] = used.allocated.get(name, 0)
    for device in pool.devices:
        if not device.shared:
            continue
        node = device.node or pool.pool
        published, allocated = usage.memory(device)
        found[(metrics.SHARED_MEMORY, (node, device.name, "published"))] = published
        found[(metrics.SHARED_MEMORY, (node, device.name, "used"))] = allocated
        found[(metrics.SHARED_MEMORY, (node, device.name, "free"))] = published - allocated
        found[(metrics.SHARES, (node, device.name))] = usage.shares(device.key)
    return found

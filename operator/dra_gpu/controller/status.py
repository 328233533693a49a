"""``dra-gpu status``: our driver's GPUs per node, as the controller's metrics count them.

Reads ResourceSlices and ResourceClaims once (``snapshot``) and counts with the metrics' own
readings: complete pools only (``published.Pool.complete``), ``published.per_node`` with
``partitions.Usage`` for devices published, allocated and free (free: a new claim could get it
now) and their memory, and per counter set (a partitioned GPU) and shared device what the
allocations use (``dra_gpu_counters``, ``dra_gpu_partitions_allocated``, ``dra_gpu_shares``,
``dra_gpu_shared_memory_bytes``). A table like ``kubectl top``; ``-o wide`` adds taints and
counters, ``-o json|yaml`` the whole count (``document``). Pools still being written are not
counted: ``Status.notes`` names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_gpu.controller import output, partitions, published, snapshot
from dra_gpu.controller.view import ClusterView
from dra_gpu.devices.model import format_bytes
from dra_gpu.resource import names

READS = "ResourceSlices and ResourceClaims"


@dataclasses.dataclass(frozen=True)
class Counter:
    """One counter family of a counter set: what allocations use of it, what is left."""

    name: str
    used: published.Amount
    free: published.Amount


@dataclasses.dataclass(frozen=True)
class CounterSet:
    """A pool's counter set (a partitionable GPU) on a node."""

    name: str
    partitions_allocated: int
    counters: tuple[Counter, ...]


@dataclasses.dataclass(frozen=True)
class Shared:
    """A device several claims may hold shares of."""

    device: str
    shares: int
    memory: published.Memory


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    node: str
    counts: published.Counts
    counter_sets: tuple[CounterSet, ...] = ()
    shared: tuple[Shared, ...] = ()

    @property
    def partitions_allocated(self) -> int:
        return sum(c.partitions_allocated for c in self.counter_sets)

    @property
    def shares(self) -> int:
        return sum(s.shares for s in self.shared)


@dataclasses.dataclass(frozen=True)
class Status:
    driver: str
    nodes: tuple[NodeStatus, ...]
    notes: tuple[str, ...] = ()
    """The pools of our driver that are not counted, and why."""


def count(view: ClusterView, driver: str) -> Status:
    """The view's devices of ``driver`` per node, in natural node order."""
    rows: dict[str, list[int]] = {}
    sets: dict[str, list[CounterSet]] = {}
    shared: dict[str, list[Shared]] = {}
    notes = []
    for key in sorted(view.pools):
        pool = view.pools[key]
        if pool.driver != driver:
            continue
        if not pool.complete:
            notes.append(f"{pool.why_incomplete}: not counted")
            continue
        for node, counts in published.per_node(
            pool.devices, view.holders, driver, view.usage
        ).items():
            row = rows.setdefault(node, [0] * len(published.Counts._fields))
            for i, value in enumerate(counts):
                row[i] += value
        for node, counter_set in _counter_sets(view.usage, pool):
            sets.setdefault(node, []).append(counter_set)
        for device in pool.devices:
            if device.shared:
                node = device.node or pool.pool
                found = Shared(
                    device.name, view.usage.shares(device.key), view.usage.memory(device)
                )
                shared.setdefault(node, []).append(found)
    nodes = tuple(
        NodeStatus(
            node,
            published.Counts(*row),
            tuple(sets.get(node, ())),
            tuple(sorted(shared.get(node, ()), key=lambda s: names.natural(s.device))),
        )
        for node, row in sorted(rows.items(), key=lambda item: names.natural(item[0]))
    )
    return Status(driver, nodes, tuple(notes))


def _counter_sets(usage: partitions.Usage, pool: published.Pool) -> list[tuple[str, CounterSet]]:
    """The pool's counter sets, each on its node, as ``tallies.pool_series`` counts them."""
    if not pool.counter_sets:
        return []
    used = usage.pool(pool.key)
    found = []
    for name, counter_set in sorted(pool.counter_sets.items()):
        families = partitions.families(counter_set.counters, used.used.get(name, {}))
        counters = tuple(Counter(c, u, f) for c, (u, f) in families.items())
        allocated = used.allocated.get(name, 0)
        found.append((counter_set.node or pool.pool, CounterSet(name, allocated, counters)))
    return found


async def status_command(
    kubeconfig: Path | None,
    *,
    driver: str,
    source: str | None = None,
    context: str | None = None,
) -> Status:
    async with snapshot.session(kubeconfig, source=source, context=context, needs=READS) as api:
        view = await snapshot.load_view(api, ("ResourceSlice", "ResourceClaim"))
    return count(view, driver)


# ---- printing (pure) ---------------------------------------------------------------------------


def _number(value: published.Amount) -> int | float:
    return value if isinstance(value, int) else float(value)


def document(status: Status) -> dict[str, Any]:
    """``-o json|yaml``: per node, devices, memory bytes, counter sets and shared devices."""
    return {
        "driver": status.driver,
        "nodes": [
            {
                "node": n.node,
                "devices": {
                    "published": n.counts.published,
                    "allocated": n.counts.allocated,
                    "free": n.counts.free,
                    "taintedNoSchedule": n.counts.tainted_no_schedule,
                    "taintedNoExecute": n.counts.tainted_no_execute,
                },
                "memoryBytes": {
                    "published": n.counts.memory,
                    "allocated": n.counts.memory_allocated,
                    "free": n.counts.memory - n.counts.memory_allocated,
                },
                "counterSets": [
                    {
                        "name": c.name,
                        "partitionsAllocated": c.partitions_allocated,
                        "counters": [
                            {"name": k.name, "used": _number(k.used), "free": _number(k.free)}
                            for k in c.counters
                        ],
                    }
                    for c in n.counter_sets
                ],
                "sharedDevices": [
                    {
                        "device": s.device,
                        "shares": s.shares,
                        "memoryBytes": {
                            "published": s.memory.published,
                            "used": s.memory.allocated,
                            "free": s.memory.published - s.memory.allocated,
                        },
                    }
                    for s in n.shared
                ],
            }
            for n in status.nodes
        ],
        "notCounted": list(status.notes),
    }


def render(status: Status, out: str) -> str:
    """The table (``wide``: with taints and each counter set's free counters), or the
    document."""
    if out in ("json", "yaml"):
        return output.dump(document(status), out)
    headers = ["node", "devices", "allocated", "free", "memory", "memory-allocated"]
    headers += ["partitions", "shares"]
    if out == "wide":
        headers += ["tainted", "counters-free"]
    rows: list[Sequence[str]] = []
    for n in status.nodes:
        c = n.counts
        cells = [n.node, str(c.published), str(c.allocated), str(c.free)]
        cells += [format_bytes(c.memory), format_bytes(c.memory_allocated)]
        cells += [str(n.partitions_allocated), str(n.shares)]
        if out == "wide":
            cells.append(f"{c.tainted_no_schedule + c.tainted_no_execute}")
            cells.append("; ".join(_free_counters(s) for s in n.counter_sets))
        rows.append(cells)
    return output.table(headers, rows)


def _free_counters(counter_set: CounterSet) -> str:
    """``gpu-0-counters: memory-slice 3/8, compute-slices 4/7``: free of all, per family."""
    shown = ", ".join(
        f"{k.name} {partitions.show(k.free)}/{partitions.show(k.used + k.free)}"
        for k in counter_set.counters
    )
    return f"{counter_set.name}: {shown}"

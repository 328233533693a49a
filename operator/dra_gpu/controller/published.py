"""What the slices publish, read from API bodies (pure: no I/O, no metrics).

One reading of ResourceSlices serves both the controller's metrics and ``explain``: a pool
counts only at its newest generation, as the scheduler reads it; what the claims hold of its
devices is ``claimed``'s reading.

The same readings come in two forms: functions over whole lists (``read_pools``,
``current_pools``), and pieces the controller's view keeps up to date one object at a time
(``read_pool`` per pool). A ``PublishedDevice`` lives as long as its slice is unchanged, and
carries what is worth computing once per slice version: its CEL values, its memory, its sort
key, the counters it consumes and its capacities with their request policies; ``per_node``
adds devices up into a node's row of the metrics.

Partitions and shares (Kubernetes' partitionable devices and consumable capacity) are read
here too: a pool's counter sets (``sharedCounters``, in slices of their own or beside devices),
each device's ``consumesCounters``, ``allowMultipleAllocations`` and capacity ``requestPolicy``.
What allocations leave free is ``partitions``'s business.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Container, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple, Protocol

from dra_gpu import cel
from dra_gpu.resource import names
from dra_gpu.resource.quantities import exact_value

Body = Mapping[str, Any]
DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how allocation results name a device."""
Amount = int | Fraction
"""A quantity's exact value: an int when whole (counters, bytes: quick to add up)."""


def result_key(result: Body) -> DeviceKey:
    return (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))


def amount(value: object) -> Amount | None:
    """A quantity of the API (``"40Gi"``, ``"1"``, or a bare number) exactly; None if unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    return _amount(str(value))


@functools.lru_cache(maxsize=4096)
def _amount(text: str) -> Amount | None:
    try:
        exact = exact_value(text)
    except ValueError:
        return None
    return int(exact) if exact.denominator == 1 else exact


@dataclasses.dataclass(frozen=True)
class Capacity:
    """One capacity of a device, with the request policy a share of it follows.

    Without a policy, a request takes what it asks, and a request that asks nothing takes all
    of it (the scheduler's ``calculateConsumedCapacity``)."""

    value: Amount
    default: Amount | None = None
    minimum: Amount | None = None
    """``validRange.min`` (a range needs one)."""
    maximum: Amount | None = None
    step: Amount | None = None
    valid_values: tuple[Amount, ...] = ()
    """``validValues``, in the order published (the API wants them ascending)."""

    @classmethod
    def read(cls, body: object) -> Capacity | None:
        if not isinstance(body, Mapping):
            return None
        value = amount(body.get("value"))
        if value is None:
            return None
        policy = body.get("requestPolicy")
        if not isinstance(policy, Mapping):
            return cls(value)
        valid = policy.get("validRange")
        valid = valid if isinstance(valid, Mapping) else {}
        values = policy.get("validValues")
        return cls(
            value,
            amount(policy.get("default")),
            amount(valid.get("min")),
            amount(valid.get("max")),
            amount(valid.get("step")),
            tuple(
                v
                for v in (amount(x) for x in (values if isinstance(values, list) else ()))
                if v is not None
            ),
        )


@dataclasses.dataclass(frozen=True)
class PublishedCounterSet:
    """One of a pool's ``sharedCounters``: a physical thing that devices consume parts of."""

    name: str
    node: str | None
    """The ``nodeName`` of the slice that publishes it."""
    counters: Mapping[str, Amount]


@dataclasses.dataclass(frozen=True, eq=False)
class PublishedDevice:
    """One device of one slice version; equal only to itself (caches key on it)."""

    driver: str
    pool: str
    node: str | None
    """The device's own ``nodeName``, else its slice's; None for node-independent pools."""
    body: Body

    @functools.cached_property
    def name(self) -> str:
        return str(self.body.get("name", ""))

    @functools.cached_property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    @property
    def label(self) -> str:
        return f"{self.node or self.pool}/{self.name}"

    @functools.cached_property
    def memory_bytes(self) -> int:
        value = (self.body.get("capacity") or {}).get("memory", {}).get("value")
        try:
            return int(exact_value(value)) if value else 0
        except ValueError:
            return 0

    @functools.cached_property
    def taints(self) -> tuple[Body, ...]:
        """The device's taints that keep claims off it (``NoSchedule``, ``NoExecute``); a
        ``None`` or unknown effect does not (as the API says consumers must treat it)."""
        return tuple(
            t
            for t in self.body.get("taints") or ()
            if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")
        )

    @property
    def worst_effect(self) -> str | None:
        """NoExecute, NoSchedule, or None for an untainted device."""
        effects = {t.get("effect") for t in self.taints}
        return "NoExecute" if "NoExecute" in effects else ("NoSchedule" if effects else None)

    @functools.cached_property
    def consumes(self) -> tuple[tuple[str, tuple[tuple[str, Amount], ...]], ...]:
        """``consumesCounters``: (counter set, ((counter, amount), ...)), in published order;
        an entry that does not read is left out (the API server refuses such a slice)."""
        found = []
        for entry in self.body.get("consumesCounters") or ():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("counters"), Mapping):
                continue
            counters = tuple(
                (str(name), value)
                for name, counter in entry["counters"].items()
                if isinstance(counter, Mapping)
                and (value := amount(counter.get("value"))) is not None
            )
            found.append((str(entry.get("counterSet", "")), counters))
        return tuple(found)

    @functools.cached_property
    def shared(self) -> bool:
        """``allowMultipleAllocations``: claims may each hold a share of it at once."""
        return self.body.get("allowMultipleAllocations") is True

    @functools.cached_property
    def capacities(self) -> Mapping[str, Capacity]:
        """Each readable capacity, by its qualified name as published."""
        raw = self.body.get("capacity")
        if not isinstance(raw, Mapping):
            return {}
        return {
            str(name): capacity
            for name, body in raw.items()
            if (capacity := Capacity.read(body)) is not None
        }

    @functools.cached_property
    def values(self) -> cel.DeviceValues:
        """The device as CEL selectors see it, checked once."""
        return cel.DeviceValues(self.driver, self.body)

    @functools.cached_property
    def order(self) -> tuple[tuple[str | int, ...], ...]:
        """Natural order: by node (or pool), driver, pool, name."""
        return (
            names.natural(self.node or self.pool),
            names.natural(self.driver),
            names.natural(self.pool),
            names.natural(self.name),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Pool:
    """A pool at its newest generation."""

    driver: str
    pool: str
    generation: int
    counts: tuple[int, ...]
    """``resourceSliceCount`` of each slice at that generation."""
    devices: tuple[PublishedDevice, ...]
    counter_sets: Mapping[str, PublishedCounterSet] = dataclasses.field(default_factory=dict)
    """The ``sharedCounters`` of its slices at that generation, by name."""

    @functools.cached_property
    def positions(self) -> Mapping[str, int]:
        """Device name -> its index in ``devices`` (the first, if a name repeats)."""
        found: dict[str, int] = {}
        for index, device in enumerate(self.devices):
            found.setdefault(device.name, index)
        return found

    @functools.cached_property
    def consumers(self) -> Mapping[str, tuple[int, ...]]:
        """Counter set -> indexes of the devices that consume it."""
        found: dict[str, list[int]] = {}
        for index, device in enumerate(self.devices):
            for name in dict.fromkeys(name for name, _ in device.consumes):
                found.setdefault(name, []).append(index)
        return {name: tuple(indexes) for name, indexes in found.items()}

    @functools.cached_property
    def memory_carriers(self) -> Mapping[str, int]:
        """Counter set -> the index of the device whose memory stands for the set's in the
        metrics: the largest of the devices, not shared, that name it first in their
        ``consumesCounters`` (a partitioned GPU: the whole GPU; its partitions are parts of it)."""
        found: dict[str, int] = {}
        for index, device in enumerate(self.devices):
            if device.shared or not device.consumes:
                continue
            first = device.consumes[0][0]
            best = found.get(first)
            if best is None or device.memory_bytes > self.devices[best].memory_bytes:
                found[first] = index
        return found

    @property
    def present(self) -> int:
        return len(self.counts)

    @property
    def expected(self) -> int:
        """The largest ``resourceSliceCount`` announced (``complete`` wants them all equal)."""
        return max(self.counts)

    @property
    def complete(self) -> bool:
        """The one rule of what counts, for the metrics and ``explain`` alike: every slice at
        the newest generation announces the same ``resourceSliceCount``, and that many are
        there. Fewer: the pool is still being written (or an older generation replaced); slices
        that disagree: it is being rewritten, or broken. The scheduler reads such a pool as
        incomplete too, as far as it can tell (it takes the count of whichever slice it saw
        first), so neither counts its devices as published nor names them as candidates."""
        return len(set(self.counts)) == 1 and self.present == self.counts[0]

    @property
    def why_incomplete(self) -> str:
        """What ``complete`` found missing, in the words both the log and the Events use."""
        counts = sorted(set(self.counts))
        if len(counts) == 1:
            return (
                f"pool {self.pool} of {self.driver} is incomplete: {self.present} of "
                f"{counts[0]} slices at generation {self.generation}"
            )
        return (
            f"pool {self.pool} of {self.driver} is incomplete: its {self.present} slices at "
            f"generation {self.generation} disagree on resourceSliceCount "
            f"({', '.join(map(str, counts))})"
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.pool)

    def problem(self) -> PoolProblem | None:
        return None if self.complete else PoolProblem(self.driver, self.pool, self.why_incomplete)


def pool_key(slice_body: Body) -> tuple[str, str] | None:
    """(driver, pool) of a ResourceSlice; None when it names neither."""
    spec = slice_body.get("spec") or {}
    driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
    return (str(driver), str(pool)) if driver and pool else None


def read_pools(slices: Iterable[Body]) -> list[Pool]:
    """Every (driver, pool) at its newest generation, in (driver, pool) order."""
    grouped: dict[tuple[str, str], list[Body]] = collections.defaultdict(list)
    for body in slices:
        key = pool_key(body)
        if key is not None:
            grouped[key].append(body)
    return [read_pool(driver, pool, bodies) for (driver, pool), bodies in sorted(grouped.items())]


def read_pool(driver: str, pool: str, slices: Sequence[Body]) -> Pool:
    """One pool at its newest generation, from its slices (in the order given, at least one)."""
    specs = [body.get("spec") or {} for body in slices]
    generation = max(_pool_field(s, "generation", 0) for s in specs)
    current = [s for s in specs if _pool_field(s, "generation", 0) == generation]
    devices = tuple(
        PublishedDevice(driver, pool, d.get("nodeName") or s.get("nodeName") or None, d)
        for s in current
        for d in s.get("devices") or []
    )
    counts = tuple(_pool_field(s, "resourceSliceCount", 1) for s in current)
    counter_sets: dict[str, PublishedCounterSet] = {}
    for s in current:
        for raw in s.get("sharedCounters") or ():
            if not isinstance(raw, Mapping) or not isinstance(raw.get("counters"), Mapping):
                continue
            name = str(raw.get("name", ""))
            counters = {
                str(counter): value
                for counter, body in raw["counters"].items()
                if isinstance(body, Mapping) and (value := amount(body.get("value"))) is not None
            }
            counter_sets.setdefault(
                name, PublishedCounterSet(name, s.get("nodeName") or None, counters)
            )
    return Pool(driver, pool, generation, counts, devices, counter_sets)


def _pool_field(spec: Body, field: str, default: int) -> int:
    value = (spec.get("pool") or {}).get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclasses.dataclass(frozen=True)
class PoolProblem:
    driver: str
    pool: str
    message: str


def current_pools(slices: Iterable[Body]) -> tuple[list[PublishedDevice], list[PoolProblem]]:
    """Devices of complete pools (``Pool.complete``), and the pools that are not."""
    devices: list[PublishedDevice] = []
    problems: list[PoolProblem] = []
    for pool in read_pools(slices):
        problem = pool.problem()
        if problem is None:
            devices.extend(pool.devices)
        else:
            problems.append(problem)
    return devices, problems


class Counts(NamedTuple):
    """Our driver's devices on one node, or one pool's share of them: a node's row of the
    metrics tally, which adds the pools' rows up field by field."""

    published: int = 0
    allocated: int = 0
    memory: int = 0
    """Bytes."""
    memory_allocated: int = 0
    tainted_no_schedule: int = 0
    """Devices whose worst taint is NoSchedule."""
    tainted_no_execute: int = 0
    free: int = 0
    """Devices a new claim could get now (``Availability.available``); without partitions and
    shares, those not allocated."""

    def row(self) -> Counts:
        """The counts as the tally's row (a ``Counts`` is one)."""
        return self


class Memory(NamedTuple):
    """The memory bytes a device adds to its node's gauges."""

    published: int
    allocated: int


class Availability(Protocol):
    """What allocations leave of each device (``partitions.Usage``): the counting rule of the
    metrics where devices consume counters or are shared."""

    def available(self, device: PublishedDevice) -> bool:
        """Whether a new claim could get ``device`` now."""

    def memory(self, device: PublishedDevice) -> Memory:
        """The memory bytes ``device`` adds to its node's gauges."""


def per_node(
    devices: Sequence[PublishedDevice],
    held: Container[DeviceKey],
    driver: str,
    usage: Availability | None = None,
) -> dict[str, Counts]:
    """Our driver's devices per node: published, allocated (``held``), memory, tainted, free.
    Without ``usage``, a device is free when not held and counts its memory whole."""
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0, 0])
    for device in devices:
        if device.driver != driver:
            continue
        row = totals[device.node or ""]
        taken = device.key in held
        row[0] += 1
        row[1] += taken
        if usage is None:
            row[2] += device.memory_bytes
            row[3] += device.memory_bytes if taken else 0
            row[6] += not taken
        else:
            memory, memory_allocated = usage.memory(device)
            row[2] += memory
            row[3] += memory_allocated
            row[6] += usage.available(device)
        effect = device.worst_effect
        if effect is not None:
            row[4 if effect == "NoSchedule" else 5] += 1
    return {node: Counts(*row) for node, row in totals.items()}

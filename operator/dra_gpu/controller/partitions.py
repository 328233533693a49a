"""Partitions and shares: what allocations use of counter sets and shared devices, and what a
device has left for a new claim (pure: no I/O, no metrics).

Owns the scheduler's arithmetic for partitionable devices and consumable capacity, as the
metrics and the explanations need it (k8s.io/dynamic-resource-allocation, ``structured``):

- **counters** (``checkAvailableCounters``): every allocated device — held alone or in shares,
  counted once — consumes its ``consumesCounters`` from its pool's counter sets. Another device
  fits while each counter it consumes has at least that much left. A shared device that already
  has shares consumed its counters with the first one and is not charged again. A MIG-mode GPU
  is published as its placements only (no whole-GPU device): each consumes the GPU's memory
  slices and compute slices, so a placement held makes the placements it overlaps, and those
  the compute slices left cannot hold (the full-size ``7g`` one first), unavailable.
- **shares** (``CmpRequestOverCapacity``): a device with ``allowMultipleAllocations`` is not
  taken by its shares; each share consumes capacity by the request policy
  (``calculateConsumedCapacity``: the request rounded up to the range's step or to the next
  valid value; the default when it asks nothing; without a policy what it asks, or all of it
  when it asks nothing), and a new share fits while every capacity has room for it.

``Usage`` reads a ``HolderIndex`` and the pools, and keeps per pool what its allocations use
(``PoolUsage``) until told that the pool or its holders changed (``forget``), so the cost of a
change is the pool it touched. It is the ``published.Availability`` of the metrics: a device is
free when a new claim could get it now (``available``); a partitioned GPU's memory counts once
(its largest partition's: the full-size one, ``Pool.memory_carriers``) and a shared device's
allocated memory is what its shares consumed.

Must not: read the API, set metrics or write messages other than the device texts below
(``explain`` places them in its own).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from dra_gpu.controller.claimed import Hold, HolderIndex, add_consumed
from dra_gpu.controller.published import (
    Amount,
    Capacity,
    DeviceKey,
    Memory,
    Pool,
    PublishedDevice,
    amount,
)
from dra_gpu.devices.model import format_bytes
from dra_gpu.resource import bodies

PoolKey = tuple[str, str]
HOLDER_LIMIT = 3
"""Claims named as holders in one device's text; the rest are counted."""
_ZERO: Amount = 0


# --- shares: the scheduler's rounding ----------------------------------------------------------


def consumed_share(capacity: Capacity, requested: Amount | None) -> Amount:
    """What one share takes of ``capacity`` for a request of ``requested`` (None: it asks
    nothing), as the scheduler rounds it."""
    if requested is None:
        return capacity.default if capacity.default is not None else capacity.value
    if capacity.minimum is not None:
        if requested < capacity.minimum:
            return capacity.minimum
        if capacity.step is None or capacity.step <= 0:
            return requested
        steps = -((capacity.minimum - requested) // capacity.step)  # exact ceiling
        return capacity.minimum + capacity.step * steps
    for value in capacity.valid_values:
        if requested <= value:
            return value
    return requested


def violates_policy(capacity: Capacity, consumed: Amount) -> bool:
    """Whether a share of ``consumed`` is outside the request policy (``violatesPolicy``)."""
    if capacity.default is not None and consumed == capacity.default:
        return False
    if capacity.minimum is not None or capacity.maximum is not None:
        if capacity.maximum is not None and consumed > capacity.maximum:
            return True
        step, minimum = capacity.step, capacity.minimum
        return bool(step and minimum is not None and (consumed - minimum) % step)
    return bool(capacity.valid_values) and consumed not in capacity.valid_values


def smallest_share(capacity: Capacity) -> Amount:
    """The least a share can take: the range's minimum, the smallest valid value, else any."""
    if capacity.minimum is not None:
        return capacity.minimum
    return min(capacity.valid_values) if capacity.valid_values else _ZERO


@dataclasses.dataclass(frozen=True)
class ShareMiss:
    """Why a request's share does not fit one device: the first capacity that says no."""

    capacity: str
    why: str
    """``missing`` (the device has no such capacity), ``policy`` (the request policy does not
    allow the share), ``over`` (more than the device has at all), ``full`` (more than the
    shares held leave)."""
    asks: Amount
    """What the share would take (after the policy's rounding)."""
    requested: Amount | None
    """What the request asked (None: nothing, so the default share)."""
    have: Capacity | None = None
    free: Amount = _ZERO

    @property
    def intrinsic(self) -> bool:
        """The device never fits this request, whoever holds what."""
        return self.why != "full"


def check_share(
    device: PublishedDevice, requests: Mapping[str, Amount] | None, used: Mapping[str, Amount]
) -> ShareMiss | None:
    """Whether a request asking ``requests`` (capacity name -> amount; None: nothing) fits
    ``device`` while ``used`` is taken by shares; None when it does."""
    capacities = device.capacities
    for name, amount_asked in sorted((requests or {}).items()):
        if name not in capacities:
            return ShareMiss(name, "missing", amount_asked, amount_asked)
    for name, capacity in sorted(capacities.items()):
        requested = (requests or {}).get(name)
        asks = consumed_share(capacity, requested)
        if violates_policy(capacity, asks):
            return ShareMiss(name, "policy", asks, requested, capacity)
        if asks > capacity.value:
            return ShareMiss(name, "over", asks, requested, capacity, capacity.value)
        free = capacity.value - used.get(name, _ZERO)
        if asks > free:
            return ShareMiss(name, "full", asks, requested, capacity, max(free, _ZERO))
    return None


def has_room(device: PublishedDevice, used: Mapping[str, Amount]) -> bool:
    """Whether the smallest share would still fit every capacity of a shared device."""
    for name, capacity in device.capacities.items():
        free = capacity.value - used.get(name, _ZERO)
        if free <= 0 or free < smallest_share(capacity):
            return False
    return True


# --- counters ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Short:
    """A counter a device consumes, and what is left of it (short when less than it needs)."""

    counter_set: str
    counter: str
    needs: Amount
    free: Amount
    """What is left (never below zero)."""


def family(counter: str) -> str:
    """Counters alike, read as one: ``memory-slice-3`` -> ``memory-slice`` (MIG's positional
    memory slices); other names are their own family."""
    return re.sub(r"-\d+$", "", counter)


def families(
    counters: Mapping[str, Amount], taken: Mapping[str, Amount]
) -> dict[str, tuple[Amount, Amount]]:
    """A counter set's counters (``counters``: how much of each; ``taken``: what allocations
    consume), summed per ``family``: (used, free); what the metrics and ``status`` show."""
    found: dict[str, tuple[Amount, Amount]] = {}
    for counter, value in counters.items():
        used = taken.get(counter, 0)
        before_used, before_free = found.get(family(counter), (0, 0))
        found[family(counter)] = (before_used + used, before_free + max(value - used, 0))
    return found


@dataclasses.dataclass(frozen=True)
class PoolUsage:
    """What the allocations of one pool use of its counter sets, and its memory in the metrics."""

    used: Mapping[str, Mapping[str, Amount]]
    """Counter set -> counter -> consumed by the devices claims hold."""
    allocated: Mapping[str, int]
    """Counter set -> devices consuming it that claims hold (a MIG-mode GPU's partitions)."""
    memory_allocated: Mapping[str, int]
    """Counter set -> memory bytes of the held devices (not shared) that name it first."""


_EMPTY = PoolUsage({}, {}, {})


class Excluded(NamedTuple):
    """The claim a ``Usage`` reads the holders without: by name, or by UID where it has one."""

    owner: str
    """``ns/name``."""
    uid: bodies.ClaimUID


class Usage:
    """Counters and shares as the allocations in ``holders`` use them, over ``pools`` (a live
    mapping: the view's, or a Layout's), kept per pool until ``forget``.

    ``exclude`` reads the holders without one claim, for a claim looking at its own chances
    (as ``HolderIndex.owners_excluding``); such a Usage is not kept.
    """

    def __init__(
        self,
        holders: HolderIndex,
        pools: Mapping[PoolKey, Pool],
        exclude: Excluded | None = None,
    ) -> None:
        self.holders = holders
        self.pools = pools
        self._exclude = exclude
        self._kept: dict[PoolKey, PoolUsage] = {}
        self._fits: dict[PoolKey, dict[PublishedDevice, bool]] = {}

    def forget(self, pools: Iterable[PoolKey]) -> None:
        """The pools' slices or the holders of their devices changed."""
        for key in pools:
            self._kept.pop(key, None)
            self._fits.pop(key, None)

    def excluding(self, name: str, uid: bodies.ClaimUID) -> Usage:
        return Usage(self.holders, self.pools, Excluded(name, uid))

    # ---- holders, with or without the excluded claim ------------------------------------

    def _keep(self, hold: Hold) -> bool:
        assert self._exclude is not None
        name, uid = self._exclude
        return hold.owner != name and not (uid and hold.uid == uid)

    def _holds(self, key: DeviceKey) -> list[Hold]:
        found = self.holders.holds_of(key)
        return [h for h in found if self._keep(h)] if self._exclude else list(found)

    def held(self, key: DeviceKey) -> bool:
        """Whether a claim holds ``key`` at all (alone or in shares)."""
        if self._exclude is None:
            return key in self.holders
        return bool(self._holds(key))

    def taken(self) -> Callable[[DeviceKey], bool]:
        """Whether a claim holds the device alone, as a function quick to call in a loop."""
        if self._exclude is None:
            return self.holders.taken()
        return lambda key: any(h.exclusive for h in self._holds(key))

    def owners(self, key: DeviceKey) -> tuple[str, ...]:
        if self._exclude is None:
            return self.holders.owners(key)
        return tuple(sorted({h.owner for h in self._holds(key)}))

    def consumed(self, key: DeviceKey) -> Mapping[str, Amount]:
        """Capacity the shares of ``key`` consumed, per capacity name."""
        if self._exclude is None:
            return self.holders.consumed(key)
        return add_consumed(self._holds(key))

    def shares(self, key: DeviceKey) -> int:
        return sum(h.shares for h in self._holds(key))

    # ---- per pool ---------------------------------------------------------------------------

    def pool(self, key: PoolKey) -> PoolUsage:
        found = self._kept.get(key)
        if found is None:
            found = self._count(key)
            if self._exclude is None:
                self._kept[key] = found
        return found

    def _count(self, key: PoolKey) -> PoolUsage:
        pool = self.pools.get(key)
        if pool is None or not pool.counter_sets:
            return _EMPTY
        used: dict[str, dict[str, Amount]] = {}
        allocated: dict[str, int] = {}
        memory: dict[str, int] = {}
        for index in sorted({i for indexes in pool.consumers.values() for i in indexes}):
            device = pool.devices[index]
            if not self.held(device.key):
                continue
            for counter_set, counters in device.consumes:
                per_set = used.setdefault(counter_set, {})
                for counter, value in counters:
                    per_set[counter] = per_set.get(counter, _ZERO) + value
            for counter_set in dict.fromkeys(s for s, _ in device.consumes):
                allocated[counter_set] = allocated.get(counter_set, 0) + 1
            if not device.shared:
                first = device.consumes[0][0]
                memory[first] = memory.get(first, 0) + device.memory_bytes
        return PoolUsage(used, allocated, memory)

    # ---- one device ---------------------------------------------------------------------------

    def counters(self, device: PublishedDevice) -> list[Short]:
        """Each counter ``device`` consumes, with what is left of it (empty: it consumes none,
        or it is a shared device whose shares already consumed them)."""
        if not device.consumes:
            return []
        if device.shared and self.held(device.key):
            return []
        pool = self.pools.get((device.driver, device.pool))
        if pool is None:
            return []
        used = self.pool(pool.key).used
        found = []
        for counter_set, counters in device.consumes:
            defined = pool.counter_sets.get(counter_set)
            if defined is None:
                continue  # the API server refuses such a slice; the scheduler skips it too
            for counter, needs in counters:
                value = defined.counters.get(counter)
                if value is None:
                    continue
                free = value - used.get(counter_set, {}).get(counter, _ZERO)
                found.append(Short(counter_set, counter, needs, max(free, _ZERO)))
        return found

    def short(self, device: PublishedDevice) -> list[Short]:
        """The counters ``device`` consumes of which too little is left for it (empty: it fits)."""
        return [s for s in self.counters(device) if s.free < s.needs]

    def counters_fit(self, device: PublishedDevice) -> bool:
        """``not short(device)``, kept per pool until ``forget`` (every check of a request
        asks it of every partition of every GPU)."""
        per_pool = self._fits.setdefault((device.driver, device.pool), {})
        found = per_pool.get(device)
        if found is None:
            found = per_pool[device] = not self.short(device)
        return found

    def available(self, device: PublishedDevice) -> bool:
        """Whether a new claim (asking no capacity) could get ``device`` now: no claim holds it
        alone, its counters fit, and a shared device has room for a share."""
        key = device.key
        if not device.consumes and not device.shared:  # a plain GPU: free when not held
            return not self.held(key)
        if device.shared:
            if any(h.exclusive for h in self._holds(key)):
                return False
        elif self.held(key):
            return False
        if device.consumes and not self.counters_fit(device):
            return False
        return not device.shared or has_room(device, self.consumed(key))

    def memory(self, device: PublishedDevice) -> Memory:
        """The memory bytes ``device`` adds to its node's gauges (published, allocated): a
        shared device its capacity and what its shares consumed; a device that consumes
        counters only through the set's carrier (``Pool.memory_carriers``), with the memory of
        the held devices of that set, at most all of it; any other its memory, allocated when
        held."""
        total = device.memory_bytes
        key = device.key
        if not device.consumes and not device.shared:
            return Memory(total, total if self.held(key) else 0)
        if device.shared:
            if any(h.exclusive for h in self._holds(key)):
                return Memory(total, total)
            consumed = int(self.consumed(key).get("memory", _ZERO))
            return Memory(total, min(total, consumed))
        pool = self.pools.get((device.driver, device.pool))
        first = device.consumes[0][0]
        carrier = pool.memory_carriers.get(first) if pool is not None else None
        if pool is None or carrier is None or pool.devices[carrier].name != device.name:
            return Memory(0, 0)
        return Memory(total, min(total, self.pool(pool.key).memory_allocated.get(first, 0)))

    def counter_holders(self, device: PublishedDevice, short: Iterable[Short]) -> tuple[str, ...]:
        """The claims holding devices that consume the ``short`` counters of ``device``."""
        wanted = {(s.counter_set, s.counter) for s in short}
        pool = self.pools.get((device.driver, device.pool))
        if pool is None:
            return ()
        owners: set[str] = set()
        for index in sorted({i for s in wanted for i in pool.consumers.get(s[0], ())}):
            other = pool.devices[index]
            if not self.held(other.key):
                continue
            if any((s, c) in wanted for s, counters in other.consumes for c, _ in counters):
                owners.update(self.owners(other.key))
        return tuple(sorted(owners))


# --- in words ----------------------------------------------------------------------------------


def show(value: Amount) -> str:
    """An amount as Kubernetes would print it: ``30Gi``, ``4``, ``0.5``."""
    if value.denominator == 1 and value >= 0:
        return format_bytes(int(value))
    return f"{float(value):g}"


def held_by(owners: tuple[str, ...]) -> str:
    if not owners:
        return ""
    shown = ", ".join(owners[:HOLDER_LIMIT])
    more = f" and {len(owners) - HOLDER_LIMIT} more" if len(owners) > HOLDER_LIMIT else ""
    return f" (held by {shown}{more})"


def counters_text(label: str, counters: list[Short], owners: tuple[str, ...]) -> str:
    """``node-01/gpu-0 needs compute-slices 7 of gpu-0-counters, 3 free; memory-slice 8, 3 free
    (held by ns/a, ns/b)``: of the ``counters`` a device consumes (``Usage.counters``), the
    families (``family``) with one short, each added up: what it needs, how much of that is free."""
    per_set: dict[str, dict[str, list[Amount]]] = {}
    short: set[tuple[str, str]] = set()
    for s in counters:
        name = family(s.counter)
        row = per_set.setdefault(s.counter_set, {}).setdefault(name, [_ZERO, _ZERO])
        row[0] += s.needs
        row[1] += min(s.free, s.needs)
        if s.free < s.needs:
            short.add((s.counter_set, name))
    parts = []
    for counter_set, families in per_set.items():
        shown = [(n, row) for n, row in families.items() if (counter_set, n) in short]
        for i, (name, (needs, free)) in enumerate(shown):
            where = f" of {counter_set}" if i == 0 else ""
            parts.append(f"{name} {show(needs)}{where}, {show(free)} free")
    return f"{label} needs {'; '.join(parts)}{held_by(owners)}"


def share_text(label: str, miss: ShareMiss, owners: tuple[str, ...]) -> str:
    """Why the request's share does not fit, e.g. ``node-01/gpu-1 shared: 30Gi of 80Gi memory
    free, the request asks 40Gi (held by ns/a, ns/b)``."""
    name = miss.capacity
    if miss.requested is None:
        asks = f"the default share is {show(miss.asks)}"
    elif miss.asks != miss.requested:
        asks = f"the request asks {show(miss.requested)} (a share of {show(miss.asks)})"
    else:
        asks = f"the request asks {show(miss.asks)}"
    have = miss.have
    if miss.why == "missing" or have is None:
        return f"{label} has no {name} capacity, {asks}"
    if miss.why == "over":
        return f"{label} has {name} {show(have.value)}, {asks}"
    if miss.why == "policy":
        if have.maximum is not None and miss.asks > have.maximum:
            return f"{label} allows at most {show(have.maximum)} {name} per share, {asks}"
        if have.valid_values:
            values = ", ".join(show(v) for v in have.valid_values)
            return f"{label} allows {name} shares of {values} only, {asks}"
        return f"{label} does not allow a {name} share of {show(miss.asks)}, {asks}"
    return (
        f"{label} shared: {show(miss.free)} of {show(have.value)} {name} free, {asks}"
        f"{held_by(owners)}"
    )


@functools.lru_cache(maxsize=4096)
def _requests_key(items: tuple[tuple[str, str], ...]) -> Mapping[str, Amount] | None:
    found = {name: value for name, text in items if (value := amount(text)) is not None}
    return found or None


def capacity_requests(spec: Mapping[str, object]) -> Mapping[str, Amount] | None:
    """A request's ``capacity.requests`` (exactly or a subrequest), read; None when it asks
    for no capacity."""
    capacity = spec.get("capacity")
    requests = capacity.get("requests") if isinstance(capacity, Mapping) else None
    if not isinstance(requests, Mapping) or not requests:
        return None
    return _requests_key(tuple(sorted((str(k), str(v)) for k, v in requests.items())))

"""What the cluster holds, read from API bodies (pure: no I/O, no metrics).

One reading of ResourceSlices and claims serves both the controller's metrics and ``explain``:
a pool counts only at its newest generation, and a device is held by the claims whose
allocation names it (admin-access results take it from nobody), as the scheduler reads them.

The same readings come in two forms: functions over whole lists (``read_pools``, ``holders``),
and pieces the controller's view keeps up to date one object at a time (``read_pool`` per pool,
``HolderIndex``). A ``PublishedDevice`` lives as long as its slice is unchanged, and carries
what is worth computing once per slice version: its CEL values, its memory, its sort key.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Callable, Container, Hashable, Iterable, Mapping, Sequence
from typing import Any

from dra_gpu import cel
from dra_gpu.quantities import exact_value

Body = Mapping[str, Any]
DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how allocation results name a device."""


def result_key(result: Body) -> DeviceKey:
    return (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))


@functools.lru_cache(maxsize=65536)
def natural(text: str) -> tuple[str | int, ...]:
    """A sort key that puts "gpu-2" before "gpu-10". re.split alternates text and digits, so
    positions never mix types."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", text)))


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
    def values(self) -> cel.DeviceValues:
        """The device as CEL selectors see it, checked once."""
        return cel.DeviceValues(self.driver, self.body)

    @functools.cached_property
    def order(self) -> tuple[tuple[str | int, ...], ...]:
        """Natural order: by node (or pool), driver, pool, name."""
        return (
            natural(self.node or self.pool),
            natural(self.driver),
            natural(self.pool),
            natural(self.name),
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
    return Pool(driver, pool, generation, counts, devices)


def _pool_field(spec: Body, field: str, default: int) -> int:
    value = (spec.get("pool") or {}).get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def holders(
    claims: Iterable[Body], exclude: Body | None = None
) -> dict[DeviceKey, tuple[str, ...]]:
    """Allocated device -> ``ns/name`` of the claims holding it, ``exclude`` (a claim looking
    at its own chances) left out."""
    this = (exclude or {}).get("metadata") or {}
    found: dict[DeviceKey, set[str]] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        if exclude is not None and (
            (meta.get("namespace"), meta.get("name")) == (this.get("namespace"), this.get("name"))
            or (this.get("uid") and meta.get("uid") == this.get("uid"))
        ):
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            # Admin access (DRAAdminAccess) does not take the device from anyone.
            if not result.get("adminAccess"):
                owner = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
                found.setdefault(result_key(result), set()).add(owner)
    return {key: tuple(sorted(owners)) for key, owners in found.items()}


def held_devices(claim: Body) -> tuple[DeviceKey, ...]:
    """The devices ``claim``'s allocation takes from others (admin access takes none)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return tuple(
        result_key(r)
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess")
    )


class HolderIndex:
    """``holders`` kept up to date one claim at a time: device -> the claims that hold it.

    Each claim is filed under a token of the caller's (the view's key, a list position), so
    two bodies with one name, as a caller's list may hold, stay two holders, as in ``holders``.
    """

    def __init__(self) -> None:
        self._entries: dict[DeviceKey, dict[Hashable, tuple[str, str]]] = {}
        self._devices: dict[Hashable, tuple[DeviceKey, ...]] = {}
        self._names: collections.Counter[str] = collections.Counter()
        self._uids: collections.Counter[str] = collections.Counter()
        self._owners: dict[DeviceKey, tuple[str, ...]] = {}

    @classmethod
    def of(cls, claims: Iterable[Body]) -> HolderIndex:
        index = cls()
        for position, claim in enumerate(claims):
            index.put(position, claim)
        return index

    def put(self, token: Hashable, claim: Body | None) -> set[DeviceKey]:
        """File ``claim`` under ``token`` (None: remove it); returns the devices whose holders
        may have changed."""
        changed: set[DeviceKey] = set()
        for key in self._devices.pop(token, ()):
            owner, uid = self._entries[key].pop(token)
            if not self._entries[key]:
                del self._entries[key]
            self._owners.pop(key, None)
            self._names[owner] -= 1
            self._uids[uid] -= 1
            changed.add(key)
        if claim is None:
            return changed
        keys = tuple(dict.fromkeys(held_devices(claim)))
        if not keys:
            return changed
        meta = claim.get("metadata") or {}
        owner = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        uid = str(meta.get("uid") or "")
        self._devices[token] = keys
        for key in keys:
            self._entries.setdefault(key, {})[token] = (owner, uid)
            self._owners.pop(key, None)
            self._names[owner] += 1
            self._uids[uid] += 1
            changed.add(key)
        return changed

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def membership(self) -> Callable[[object], bool]:
        """``key in index``, as a function that is quick to call in a loop."""
        return self._entries.__contains__

    def __len__(self) -> int:
        return len(self._entries)

    def owners(self, key: DeviceKey) -> tuple[str, ...]:
        """``ns/name`` of the claims holding ``key``, sorted; empty when free."""
        found = self._owners.get(key)
        if found is None:
            entries = self._entries.get(key)
            if not entries:
                return ()
            found = self._owners[key] = tuple(sorted({owner for owner, _ in entries.values()}))
        return found

    def involves(self, name: str, uid: str) -> bool:
        """Whether the claim ``name`` (``ns/name``) or one with ``uid`` holds anything."""
        return self._names[name] > 0 or bool(uid and self._uids[uid] > 0)

    def owners_excluding(self, key: DeviceKey, name: str, uid: str) -> tuple[str, ...]:
        """``owners`` without the claim looking at its own chances, as ``holders(exclude=)``."""
        entries = self._entries.get(key) or {}
        return tuple(
            sorted({o for o, u in entries.values() if o != name and not (uid and u == uid)})
        )


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


def allocated(claims: Iterable[Body]) -> dict[DeviceKey, str]:
    """Allocated devices and a claim (``ns/name``) holding each."""
    return {key: owners[0] for key, owners in holders(claims).items()}


def claim_state(claim: Body) -> str:
    status = claim.get("status", {})
    if not status.get("allocation"):
        return "pending"
    return "reserved" if status.get("reservedFor") else "allocated"


@dataclasses.dataclass(frozen=True)
class Counts:
    published: int = 0
    allocated: int = 0
    memory: int = 0
    memory_allocated: int = 0
    tainted_no_schedule: int = 0
    """Devices whose worst taint is NoSchedule."""
    tainted_no_execute: int = 0

    @property
    def free(self) -> int:
        return self.published - self.allocated


def per_node(
    devices: Sequence[PublishedDevice], held: Container[DeviceKey], driver: str
) -> dict[str, Counts]:
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for device in devices:
        if device.driver != driver:
            continue
        row = totals[device.node or ""]
        taken = device.key in held
        row[0] += 1
        row[1] += taken
        row[2] += device.memory_bytes
        row[3] += device.memory_bytes if taken else 0
        effect = device.worst_effect
        if effect is not None:
            row[4 if effect == "NoSchedule" else 5] += 1
    return {node: Counts(*row) for node, row in totals.items()}

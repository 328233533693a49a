"""What the cluster holds, read from API bodies (pure: no I/O, no metrics).

One reading of ResourceSlices and claims serves both the controller's metrics and ``explain``:
a pool counts only at its newest generation, and a device is held by the claims whose
allocation names it (admin-access results take it from nobody), as the scheduler reads them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.devices.model import parse_quantity

Body = Mapping[str, Any]
DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how allocation results name a device."""


def result_key(result: Body) -> DeviceKey:
    return (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))


@dataclasses.dataclass(frozen=True)
class PublishedDevice:
    driver: str
    pool: str
    node: str | None
    """The device's own ``nodeName``, else its slice's; None for node-independent pools."""
    body: Body

    @property
    def name(self) -> str:
        return str(self.body.get("name", ""))

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    @property
    def label(self) -> str:
        return f"{self.node or self.pool}/{self.name}"

    @property
    def memory_bytes(self) -> int:
        value = (self.body.get("capacity") or {}).get("memory", {}).get("value")
        try:
            return int(parse_quantity(value)) if value else 0
        except ValueError:
            return 0


@dataclasses.dataclass(frozen=True)
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
        return max(self.counts)

    @property
    def complete(self) -> bool:
        """As many slices as they announce: an older generation is being replaced, and a pool
        with fewer slices than ``resourceSliceCount`` is still being written."""
        return self.present == self.expected


def read_pools(slices: Iterable[Body]) -> list[Pool]:
    """Every (driver, pool) at its newest generation, in (driver, pool) order."""
    grouped: dict[tuple[str, str], list[Body]] = collections.defaultdict(list)
    for body in slices:
        spec = body.get("spec") or {}
        driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
        if driver and pool:
            grouped[(str(driver), str(pool))].append(spec)
    pools = []
    for (driver, pool), specs in sorted(grouped.items()):
        generation = max(_pool_field(s, "generation", 0) for s in specs)
        current = [s for s in specs if _pool_field(s, "generation", 0) == generation]
        devices = tuple(
            PublishedDevice(driver, pool, d.get("nodeName") or s.get("nodeName") or None, d)
            for s in current
            for d in s.get("devices") or []
        )
        counts = tuple(_pool_field(s, "resourceSliceCount", 1) for s in current)
        pools.append(Pool(driver, pool, generation, counts, devices))
    return pools


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


@dataclasses.dataclass(frozen=True)
class PoolProblem:
    driver: str
    pool: str
    message: str


def current_pools(slices: Iterable[Body]) -> tuple[list[PublishedDevice], list[PoolProblem]]:
    """Devices of consistent pools, and the pools that are not: a pool whose slices disagree
    on ``resourceSliceCount`` is reported even when the largest count is met."""
    devices: list[PublishedDevice] = []
    problems: list[PoolProblem] = []
    for pool in read_pools(slices):
        if len(set(pool.counts)) == 1 and pool.complete:
            devices.extend(pool.devices)
            continue
        problems.append(
            PoolProblem(
                pool.driver,
                pool.pool,
                (
                    f"pool {pool.pool} of {pool.driver} is inconsistent: {pool.present} "
                    f"slice(s) at generation {pool.generation}, "
                    f"resourceSliceCount {sorted(set(pool.counts))}"
                ),
            )
        )
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

    @property
    def free(self) -> int:
        return self.published - self.allocated


def per_node(
    devices: Sequence[PublishedDevice], held: Mapping[DeviceKey, str], driver: str
) -> dict[str, Counts]:
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for device in devices:
        if device.driver != driver:
            continue
        row = totals[device.node or ""]
        taken = device.key in held
        row[0] += 1
        row[1] += taken
        row[2] += device.memory_bytes
        row[3] += device.memory_bytes if taken else 0
    return {node: Counts(*row) for node, row in totals.items()}

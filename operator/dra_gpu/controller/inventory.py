"""What the cluster holds of our driver, computed from the view (pure: no I/O, no metrics).

Pools count only at their newest generation and only when complete (as many slices as
``resourceSliceCount`` says), exactly as the scheduler reads them. A device is allocated when a
claim's allocation names it (admin-access results do not count, as for the scheduler).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.devices.model import parse_quantity

Body = dict[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclasses.dataclass(frozen=True)
class PublishedDevice:
    driver: str
    pool: str
    node: str
    body: Body

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.body["name"])

    @property
    def memory_bytes(self) -> int:
        value = (self.body.get("capacity") or {}).get("memory", {}).get("value")
        try:
            return int(parse_quantity(value)) if value else 0
        except ValueError:
            return 0


@dataclasses.dataclass(frozen=True)
class PoolProblem:
    driver: str
    pool: str
    message: str


def current_pools(
    slices: Iterable[Body],
) -> tuple[list[PublishedDevice], list[PoolProblem]]:
    """Devices of complete pools at their newest generation, and the pools that are not."""
    pools: dict[tuple[str, str], list[Body]] = collections.defaultdict(list)
    for body in slices:
        spec = body.get("spec", {})
        pools[(spec.get("driver", ""), spec.get("pool", {}).get("name", ""))].append(body)
    devices: list[PublishedDevice] = []
    problems: list[PoolProblem] = []
    for (driver, pool), members in sorted(pools.items()):
        newest = max(int(s["spec"]["pool"].get("generation", 0)) for s in members)
        current = [s for s in members if int(s["spec"]["pool"].get("generation", 0)) == newest]
        counts = {int(s["spec"]["pool"].get("resourceSliceCount", 1)) for s in current}
        if len(counts) != 1 or len(current) != counts.pop():
            problems.append(
                PoolProblem(
                    driver,
                    pool,
                    (
                        f"pool {pool} of {driver} is inconsistent: {len(current)} slice(s) at "
                        f"generation {newest}, resourceSliceCount "
                        f"{sorted({s['spec']['pool'].get('resourceSliceCount') for s in current})}"
                    ),
                )
            )
            continue
        for body in current:
            node = body["spec"].get("nodeName", "")
            devices.extend(
                PublishedDevice(driver, pool, node, d) for d in body["spec"].get("devices") or []
            )
    return devices, problems


def allocated(claims: Iterable[Body]) -> dict[DeviceKey, str]:
    """Allocated devices and the claim (``ns/name``) holding each."""
    holders: dict[DeviceKey, str] = {}
    for claim in claims:
        allocation = claim.get("status", {}).get("allocation") or {}
        meta = claim["metadata"]
        for result in allocation.get("devices", {}).get("results") or []:
            if not result.get("adminAccess"):
                key = (result["driver"], result["pool"], result["device"])
                holders[key] = f"{meta['namespace']}/{meta['name']}"
    return holders


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
    devices: Sequence[PublishedDevice], holders: Mapping[DeviceKey, str], driver: str
) -> dict[str, Counts]:
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for device in devices:
        if device.driver != driver:
            continue
        row = totals[device.node]
        taken = device.key in holders
        row[0] += 1
        row[1] += taken
        row[2] += device.memory_bytes
        row[3] += device.memory_bytes if taken else 0
    return {node: Counts(*row) for node, row in totals.items()}

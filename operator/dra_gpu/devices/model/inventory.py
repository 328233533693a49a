"""Devices and inventories: what a backend found, checked against the API's rules when built.

Owns ``Device`` (DNS-label names, qualified attribute and capacity names, quantities, the
32-entry limit, taints, counter consumption, a partition's parent, a sharing policy that fits
its memory), ``CounterSet`` and ``Inventory`` (unique names, every consumed counter defined),
and the views an older API server can take (``without_partitions``, ``without_sharing``), so an
inventory that exists is one the API server will accept. Must not: do I/O, or know a backend.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType

from dra_gpu.devices import health
from dra_gpu.devices.model import errors, policy, values
from dra_gpu.resource import names

MAX_ATTRIBUTES_AND_CAPACITY = 32
MAX_TAINTS = 16
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2


@dataclasses.dataclass(frozen=True)
class Device:
    """One allocatable device, checked against the API's rules when built.

    ``attributes`` and ``capacity`` use bare names for the driver's own domain
    (``memory`` is published as ``device.capacity["<driver>"].memory``).
    """

    name: str  # DNS label, stable across restarts: "gpu-0"
    uuid: str
    attributes: Mapping[str, values.AttributeValue]
    capacity: Mapping[str, str]  # quantity strings: {"memory": "24Gi"}
    healthy: bool = True
    taints: tuple[health.Taint, ...] = ()
    """Published on the device (``spec.devices[].taints``): set by the agent from the faults
    its backend observed (``devices.health``), never by a backend's inventory."""
    consumes: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    """Counter set -> counter -> amount this device takes while allocated
    (``consumesCounters``): how a GPU's partitions exclude each other and the whole GPU."""
    partition_of: str | None = None
    """The name of the whole-GPU device this one is a partition of (a MIG placement)."""
    sharing: policy.Sharing | None = None
    """Set for a GPU offered to several claims at once, each with a share of its memory."""

    def __post_init__(self) -> None:
        where = f"device {self.name!r}"
        if self.sharing is not None:
            memory = self.capacity.get("memory")
            if memory is None:
                raise errors.InventoryError(f"{where}: a shared device needs a memory capacity")
            try:
                self.sharing.memory.check(int(values.parse_quantity(memory)))
            except errors.InventoryError as err:
                raise errors.InventoryError(f"{where}: sharing.memory.{err}") from None
        if len(self.consumes) > MAX_CONSUMPTIONS_PER_DEVICE:
            raise errors.InventoryError(
                f"{where}: consumes from {len(self.consumes)} counter sets; "
                f"the API allows {MAX_CONSUMPTIONS_PER_DEVICE}"
            )
        for set_name, counters in self.consumes.items():
            _check_counters(f"{where}: counter set {set_name!r}", set_name, counters)
        if not isinstance(self.name, str) or not names.is_dns_label(self.name):
            raise errors.InventoryError(f"{where}: the name must be a DNS label (e.g. gpu-0)")
        if not self.uuid:
            raise errors.InventoryError(f"{where}: the uuid is empty")
        for key, value in self.attributes.items():
            if not names.is_qualified_name(key):
                raise errors.InventoryError(f"{where}: attribute {key!r}: {_BAD_NAME}")
            if not isinstance(
                value, values.IntValue | values.BoolValue | values.StringValue | values.VersionValue
            ):
                raise errors.InventoryError(
                    f"{where}: attribute {key!r}: {value!r} is not a value type"
                )
        for key, quantity in self.capacity.items():
            if not names.is_qualified_name(key):
                raise errors.InventoryError(f"{where}: capacity {key!r}: {_BAD_NAME}")
            try:
                if not isinstance(quantity, str):
                    raise errors.InventoryError(
                        f"{quantity!r} is not a quantity string (e.g. 24Gi)"
                    )
                values.parse_quantity(quantity)
            except errors.InventoryError as err:
                raise errors.InventoryError(f"{where}: capacity {key!r}: {err}") from None
        total = len(self.attributes) + len(self.capacity)
        if total > MAX_ATTRIBUTES_AND_CAPACITY:
            raise errors.InventoryError(
                f"{where}: {total} attributes and capacities; "
                f"the API allows at most {MAX_ATTRIBUTES_AND_CAPACITY} together"
            )
        if len(self.taints) > MAX_TAINTS:
            raise errors.InventoryError(
                f"{where}: {len(self.taints)} taints; the API allows {MAX_TAINTS}"
            )
        object.__setattr__(self, "taints", tuple(self.taints))
        # Freeze the maps too: a device shared between inventories must not change under them.
        object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))
        object.__setattr__(self, "capacity", MappingProxyType(dict(self.capacity)))
        object.__setattr__(
            self,
            "consumes",
            MappingProxyType({k: MappingProxyType(dict(v)) for k, v in self.consumes.items()}),
        )

    @property
    def index(self) -> int | None:
        value = self.attributes.get("index")
        return value.value if isinstance(value, values.IntValue) else None

    @property
    def memory(self) -> str | None:
        return self.capacity.get("memory")

    @property
    def memory_bytes(self) -> int | None:
        quantity = self.capacity.get("memory")
        return None if quantity is None else int(values.parse_quantity(quantity))

    @property
    def product_name(self) -> str | None:
        value = self.attributes.get("productName")
        return value.value if isinstance(value, values.StringValue) else None


_BAD_NAME = "not a C identifier of at most 32 characters, optionally prefixed by '<domain>/'"


def _check_counters(where: str, set_name: str, counters: Mapping[str, int]) -> None:
    if not names.is_dns_label(set_name):
        raise errors.InventoryError(f"{where}: the name must be a DNS label")
    if not counters or len(counters) > MAX_COUNTERS_PER_SET:
        raise errors.InventoryError(
            f"{where}: 1 to {MAX_COUNTERS_PER_SET} counters, not {len(counters)}"
        )
    for counter, value in counters.items():
        if not names.is_dns_label(counter):
            raise errors.InventoryError(f"{where}: counter {counter!r} is not a DNS label")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise errors.InventoryError(f"{where}: counter {counter!r}: {value!r} is not a count")


@dataclasses.dataclass(frozen=True)
class CounterSet:
    """Counters that devices of the pool consume (``sharedCounters``): one set per partitioned
    GPU, e.g. its memory slices and compute slices. The API never lets the devices allocated
    at one time consume more of a counter than the set holds."""

    name: str
    counters: Mapping[str, int]

    def __post_init__(self) -> None:
        _check_counters(f"counter set {self.name!r}", self.name, self.counters)
        object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))

    def to_api(self) -> dict[str, object]:
        return {
            "name": self.name,
            "counters": {k: {"value": str(self.counters[k])} for k in sorted(self.counters)},
        }


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The devices a backend found on one node. Device names are unique, and every counter a
    device consumes is one of the inventory's counter sets."""

    node: str
    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "counter_sets", tuple(self.counter_sets))
        seen: set[str] = set()
        for device in self.devices:
            if device.name in seen:
                raise errors.InventoryError(
                    f"node {self.node!r}: device name {device.name!r} is used more than once"
                )
            seen.add(device.name)
        sets: dict[str, CounterSet] = {}
        for counter_set in self.counter_sets:
            if counter_set.name in sets:
                raise errors.InventoryError(
                    f"node {self.node!r}: counter set {counter_set.name!r} is defined twice"
                )
            sets[counter_set.name] = counter_set
        for device in self.devices:
            for set_name, counters in device.consumes.items():
                known = sets.get(set_name)
                unknown = [c for c in counters if known is None or c not in known.counters]
                if unknown:
                    raise errors.InventoryError(
                        f"node {self.node!r}: device {device.name!r} consumes "
                        f"{', '.join(unknown)} of counter set {set_name!r}, which "
                        + ("does not exist" if known is None else "has no such counter")
                    )

    def without_partitions(self) -> Inventory:
        """What an API server without partitionable devices (DRAPartitionableDevices off:
        Kubernetes 1.35) can allocate safely, consuming nothing: the whole devices, and of each
        counter set that no whole device consumes (a GPU in MIG mode, published as partitions
        only) the one partition that excludes all the others (the largest: its full-size
        ``7g`` placement), so at most one claim holds that GPU at a time."""
        kept = {d.name for d in self.devices if d.partition_of is None}
        by_set: dict[str, list[Device]] = {}
        for device in self.devices:
            for set_name in device.consumes:
                by_set.setdefault(set_name, []).append(device)
        sets = {s.name: s for s in self.counter_sets}
        for set_name, consumers in by_set.items():
            if any(d.name in kept for d in consumers) or set_name not in sets:
                continue
            alone = [d for d in consumers if _excludes_all(d, consumers, sets)]
            if alone:
                kept.add(max(alone, key=lambda d: (d.memory_bytes or 0, d.name)).name)
        whole = tuple(dataclasses.replace(d, consumes={}) for d in self.devices if d.name in kept)
        return Inventory(self.node, whole)

    def without_sharing(self) -> Inventory:
        """Every device exclusive: what an API server without consumable capacity
        (DRAConsumableCapacity off: Kubernetes 1.35) can allocate safely."""
        return dataclasses.replace(
            self, devices=tuple(dataclasses.replace(d, sharing=None) for d in self.devices)
        )

    @functools.cached_property
    def by_name(self) -> Mapping[str, Device]:
        """The devices by name, built once per inventory (every prepare looks devices up)."""
        return MappingProxyType({d.name: d for d in self.devices})


def _excludes_all(device: Device, others: list[Device], sets: Mapping[str, CounterSet]) -> bool:
    """Whether no device of ``others`` can be allocated beside ``device`` (their consumption
    together exceeds a counter of a set they share)."""
    for other in others:
        if other is device:
            continue
        clash = False
        for set_name, counters in device.consumes.items():
            theirs = other.consumes.get(set_name, {})
            defined = sets[set_name].counters if set_name in sets else {}
            if any(
                counters.get(c, 0) + theirs.get(c, 0) > defined.get(c, 0)
                for c in {*counters, *theirs}
            ):
                clash = True
                break
        if not clash:
            return False
    return True

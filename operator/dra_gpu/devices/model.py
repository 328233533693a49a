"""The node agent's device inventory: what a backend found, in the shape the API can publish.

Both backends (NVML and the simulated profile) produce these types, so everything above them
(slices, prepare, health) is exercised in CI without a GPU. This module owns the API's naming
and value rules for devices (DNS-label device names, qualified attribute and capacity names,
quantities, semver versions, the 32-entry limit) and checks them when an object is built, so
an inventory that exists is one the API server will accept. It does no I/O.

Errors::

    ValueError
    └── InventoryError   an inventory, device or value that cannot be published as it is
        └── ProfileError a simulated-inventory profile that cannot be used (names file and field)
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dra_gpu.devices.health import Fault, Reset, Taint
from dra_gpu.resource import names, quantities, semvers

if TYPE_CHECKING:
    from dra_gpu.devices import edits

PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
"""The standard attribute for a device's PCI address (a third-party name: it carries a domain)."""

MAX_ATTRIBUTES_AND_CAPACITY = 32
MAX_VALUE_LENGTH = 64
MAX_TAINTS = 16
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
_INT64 = (-(2**63), 2**63 - 1)


class InventoryError(ValueError):
    """An inventory, device or value that cannot be published as it is."""


class ProfileError(InventoryError):
    """A simulated-inventory profile that cannot be used; the message names file and field."""


# --- quantities and versions ---------------------------------------------------------------------


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity ("24Gi", "1.5G", "100m"), parsed as the API
    server parses it (``dra_gpu.resource.quantities``); InventoryError if it is none."""
    try:
        return quantities.exact_value(text)
    except quantities.QuantityError:
        raise InventoryError(f"{text!r} is not a Kubernetes quantity (e.g. 24Gi)") from None


def is_semver(text: str) -> bool:
    """A semantic version as the API server's ``version`` attribute check reads it."""
    try:
        semvers.parse_semver(text)
    except semvers.SemverError:
        return False
    return True


def format_bytes(count: int) -> str:
    """An exact quantity for a byte count, in the largest binary unit that divides it.

    Exact so that ``compareTo(quantity("24Gi"))`` never rounds a device into or out of a
    selector; in the unit Kubernetes itself would print, so a round trip changes nothing.
    """
    if count < 0:
        raise InventoryError(f"a byte count cannot be negative: {count}")
    for power, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        unit = 1024**power
        if count and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def normalize_version(raw: str) -> str:
    """A semver 2.0.0 string for a dotted version as drivers report it.

    "535.104" -> "535.104.0", "550.54.05" -> "550.54.5" (semver forbids leading zeros),
    "9.0" -> "9.0.0"; components beyond the third become build metadata, which semver
    ignores when comparing ("31.0.15.3623" -> "31.0.15+3623").
    """
    text = raw.strip().removeprefix("v")
    if is_semver(text):
        return text
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        raise InventoryError(
            f"{raw!r} cannot be read as a version (expected numbers separated by dots, e.g. 12.4)"
        )
    parts = text.split(".")
    core = [str(int(p)) for p in parts[:3]] + ["0"] * (3 - len(parts[:3]))
    extra = parts[3:]
    return ".".join(core) + ("+" + ".".join(extra) if extra else "")


# --- attribute values ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IntValue:
    value: int

    def __post_init__(self) -> None:
        # bool is an int subclass in Python but a different attribute type in the API.
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise InventoryError(f"{self.value!r} is not an integer")
        if not _INT64[0] <= self.value <= _INT64[1]:
            raise InventoryError(f"{self.value} does not fit in a 64-bit integer")

    def to_api(self) -> dict[str, int]:
        return {"int": self.value}


@dataclasses.dataclass(frozen=True)
class BoolValue:
    value: bool

    def __post_init__(self) -> None:
        if not isinstance(self.value, bool):
            raise InventoryError(f"{self.value!r} is not true or false")

    def to_api(self) -> dict[str, bool]:
        return {"bool": self.value}


@dataclasses.dataclass(frozen=True)
class StringValue:
    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise InventoryError(f"{self.value!r} is not a string")
        if len(self.value) > MAX_VALUE_LENGTH:
            raise InventoryError(f"{self.value!r} is longer than {MAX_VALUE_LENGTH} characters")

    def to_api(self) -> dict[str, str]:
        return {"string": self.value}


@dataclasses.dataclass(frozen=True)
class VersionValue:
    """A semver 2.0.0 version; build it from a driver's dotted string with ``normalize_version``."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not is_semver(self.value):
            raise InventoryError(f"{self.value!r} is not a semantic version (e.g. 12.4.0)")
        if len(self.value) > MAX_VALUE_LENGTH:
            raise InventoryError(f"{self.value!r} is longer than {MAX_VALUE_LENGTH} characters")

    def to_api(self) -> dict[str, str]:
        return {"version": self.value}


AttributeValue = IntValue | BoolValue | StringValue | VersionValue
"""Exactly one of the API's DeviceAttribute value fields, chosen by the type."""


# --- sharing -------------------------------------------------------------------------------------

SHARING_MODES = ("TimeSlicing", "MPS")
"""How the containers sharing a GPU run on it: taking turns, or side by side under MPS (with a
pinned-memory limit each)."""


@dataclasses.dataclass(frozen=True)
class MemoryPolicy:
    """How much of a shared device's ``memory`` one allocation takes (the capacity's
    ``requestPolicy``): ``default`` when the request names none; a request is rounded up to
    ``min`` + n * ``step`` and refused above ``max``. Quantity strings; checked against the
    device's memory as the API server checks them (``Device``)."""

    default: str
    min: str
    max: str | None = None
    step: str | None = None

    def to_api(self) -> dict[str, Any]:
        valid: dict[str, str] = {"min": self.min}
        if self.max is not None:
            valid["max"] = self.max
        if self.step is not None:
            valid["step"] = self.step
        return {"default": self.default, "validRange": valid}

    def share(self, requested: int | None) -> int | None:
        """The bytes one allocation requesting ``requested`` (None: nothing named) takes, as
        the scheduler rounds it; None if the policy refuses it."""
        low = int(parse_quantity(self.min))
        amount = int(parse_quantity(self.default)) if requested is None else max(requested, low)
        if self.step is not None:
            step = int(parse_quantity(self.step))
            amount = low + -(-(amount - low) // step) * step
        if self.max is not None and amount > int(parse_quantity(self.max)):
            return None
        return amount

    def check(self, capacity: int) -> None:
        """The API server's rules for a ``validRange`` policy on a capacity of ``capacity``
        bytes; InventoryError naming the field."""
        values = {}
        for name in ("default", "min", "max", "step"):
            text = getattr(self, name)
            if text is None:
                continue
            try:
                values[name] = parse_quantity(text)
            except InventoryError as err:
                raise InventoryError(f"{name}: {err}") from None
            if values[name] < 0 or values[name].denominator != 1:
                raise InventoryError(f"{name}: {text} is not a whole number of bytes")
        default, low = values["default"], values["min"]
        total = format_bytes(capacity)
        high, step = values.get("max"), values.get("step")
        if low > capacity:
            raise InventoryError(f"min: {self.min} is more than the memory ({total})")
        if default < low:
            raise InventoryError(f"default: {self.default} is less than min {self.min}")
        if high is not None:
            if high > capacity:
                raise InventoryError(f"max: {self.max} is more than the memory ({total})")
            if high < low:
                raise InventoryError(f"max: {self.max} is less than min {self.min}")
            if default > high:
                raise InventoryError(f"default: {self.default} is more than max {self.max}")
        if step is not None:
            if step <= 0:
                raise InventoryError(f"step: {self.step} must be more than zero")
            if low + step > capacity:
                raise InventoryError(
                    f"step: min + step ({self.min} + {self.step}) is more than the memory ({total})"
                )
            for name, value in (("default", default), ("max", high)):
                if value is not None and (value - low) % step:
                    raise InventoryError(
                        f"{name}: {getattr(self, name)} is not min {self.min} plus a whole "
                        f"number of steps of {self.step}"
                    )


@dataclasses.dataclass(frozen=True)
class Sharing:
    """A GPU that several claims may hold at once (``allowMultipleAllocations``), each with a
    share of its memory (consumable capacity, ``DRAConsumableCapacity``)."""

    mode: str
    """One of ``SHARING_MODES``."""
    memory: MemoryPolicy
    active_thread_percentage: int | None = None
    """MPS: the share of the GPU's threads each client may use (1-100; None: all)."""
    time_slice: str | None = None
    """TimeSlicing: one of ``TIME_SLICES``, set on the GPU while it is shared (None: left as
    the GPU has it)."""

    def __post_init__(self) -> None:
        if self.mode not in SHARING_MODES:
            raise InventoryError(f"mode: {self.mode!r} is not one of {', '.join(SHARING_MODES)}")
        pct = self.active_thread_percentage
        if pct is not None and (self.mode != "MPS" or not 1 <= pct <= 100):
            raise InventoryError(
                f"activeThreadPercentage: {pct!r} needs mode MPS and a value from 1 to 100"
            )
        if self.time_slice is not None and (
            self.mode != "TimeSlicing" or self.time_slice not in TIME_SLICES
        ):
            raise InventoryError(
                f"timeSlice: {self.time_slice!r} needs mode TimeSlicing and one of "
                f"{', '.join(TIME_SLICES)}"
            )


TIME_SLICES = ("Default", "Short", "Medium", "Long")
"""``nvidia-smi compute-policy --set-timeslice`` values 0-3, as NVIDIA's DRA driver names them."""


# --- devices and inventories ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Device:
    """One allocatable device, checked against the API's rules when built.

    ``attributes`` and ``capacity`` use bare names for the driver's own domain
    (``memory`` is published as ``device.capacity["<driver>"].memory``).
    """

    name: str  # DNS label, stable across restarts: "gpu-0"
    uuid: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, str]  # quantity strings: {"memory": "24Gi"}
    healthy: bool = True
    taints: tuple[Taint, ...] = ()
    """Published on the device (``spec.devices[].taints``): set by the agent from the faults
    its backend observed (``devices.health``), never by a backend's inventory."""
    consumes: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    """Counter set -> counter -> amount this device takes while allocated
    (``consumesCounters``): how a GPU's partitions exclude each other and the whole GPU."""
    partition_of: str | None = None
    """The name of the whole-GPU device this one is a partition of (a MIG placement)."""
    sharing: Sharing | None = None
    """Set for a GPU offered to several claims at once, each with a share of its memory."""

    def __post_init__(self) -> None:
        where = f"device {self.name!r}"
        if self.sharing is not None:
            memory = self.capacity.get("memory")
            if memory is None:
                raise InventoryError(f"{where}: a shared device needs a memory capacity")
            try:
                self.sharing.memory.check(int(parse_quantity(memory)))
            except InventoryError as err:
                raise InventoryError(f"{where}: sharing.memory.{err}") from None
        if len(self.consumes) > MAX_CONSUMPTIONS_PER_DEVICE:
            raise InventoryError(
                f"{where}: consumes from {len(self.consumes)} counter sets; "
                f"the API allows {MAX_CONSUMPTIONS_PER_DEVICE}"
            )
        for set_name, counters in self.consumes.items():
            _check_counters(f"{where}: counter set {set_name!r}", set_name, counters)
        if not isinstance(self.name, str) or not names.is_dns_label(self.name):
            raise InventoryError(f"{where}: the name must be a DNS label (e.g. gpu-0)")
        if not self.uuid:
            raise InventoryError(f"{where}: the uuid is empty")
        for key, value in self.attributes.items():
            if not names.is_qualified_name(key):
                raise InventoryError(f"{where}: attribute {key!r}: {_BAD_NAME}")
            if not isinstance(value, IntValue | BoolValue | StringValue | VersionValue):
                raise InventoryError(f"{where}: attribute {key!r}: {value!r} is not a value type")
        for key, quantity in self.capacity.items():
            if not names.is_qualified_name(key):
                raise InventoryError(f"{where}: capacity {key!r}: {_BAD_NAME}")
            try:
                if not isinstance(quantity, str):
                    raise InventoryError(f"{quantity!r} is not a quantity string (e.g. 24Gi)")
                parse_quantity(quantity)
            except InventoryError as err:
                raise InventoryError(f"{where}: capacity {key!r}: {err}") from None
        total = len(self.attributes) + len(self.capacity)
        if total > MAX_ATTRIBUTES_AND_CAPACITY:
            raise InventoryError(
                f"{where}: {total} attributes and capacities; "
                f"the API allows at most {MAX_ATTRIBUTES_AND_CAPACITY} together"
            )
        if len(self.taints) > MAX_TAINTS:
            raise InventoryError(f"{where}: {len(self.taints)} taints; the API allows {MAX_TAINTS}")
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
        return value.value if isinstance(value, IntValue) else None

    @property
    def memory(self) -> str | None:
        return self.capacity.get("memory")

    @property
    def memory_bytes(self) -> int | None:
        quantity = self.capacity.get("memory")
        return None if quantity is None else int(parse_quantity(quantity))

    @property
    def product_name(self) -> str | None:
        value = self.attributes.get("productName")
        return value.value if isinstance(value, StringValue) else None


_BAD_NAME = "not a C identifier of at most 32 characters, optionally prefixed by '<domain>/'"


def _check_counters(where: str, set_name: str, counters: Mapping[str, int]) -> None:
    if not names.is_dns_label(set_name):
        raise InventoryError(f"{where}: the name must be a DNS label")
    if not counters or len(counters) > MAX_COUNTERS_PER_SET:
        raise InventoryError(f"{where}: 1 to {MAX_COUNTERS_PER_SET} counters, not {len(counters)}")
    for counter, value in counters.items():
        if not names.is_dns_label(counter):
            raise InventoryError(f"{where}: counter {counter!r} is not a DNS label")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InventoryError(f"{where}: counter {counter!r}: {value!r} is not a count")


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
                raise InventoryError(
                    f"node {self.node!r}: device name {device.name!r} is used more than once"
                )
            seen.add(device.name)
        sets: dict[str, CounterSet] = {}
        for counter_set in self.counter_sets:
            if counter_set.name in sets:
                raise InventoryError(
                    f"node {self.node!r}: counter set {counter_set.name!r} is defined twice"
                )
            sets[counter_set.name] = counter_set
        for device in self.devices:
            for set_name, counters in device.consumes.items():
                known = sets.get(set_name)
                unknown = [c for c in counters if known is None or c not in known.counters]
                if unknown:
                    raise InventoryError(
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


class Backend(Protocol):
    """Where an agent's devices come from. ``inventory`` never blocks the event loop.

    A backend also says what a container given a claim's devices gets (``container_edits``):
    the agent puts that into the claim's CDI spec and knows no backend by name, so a new
    backend is one new module here.
    """

    async def inventory(self) -> Inventory: ...

    async def container_edits(self, devices: Sequence[edits.GivenDevice]) -> edits.ClaimEdits:
        """What a container given ``devices`` (one claim's, in allocation order) gets: the
        claim-wide part once, and one ``Edits`` per device (``devices.edits``). Raises
        ``InventoryError`` naming the device when it cannot be said (a node file missing)."""
        ...

    async def faults(self) -> tuple[Fault | Reset, ...]:
        """Faults seen since the last call (NVML events) and those still going on (a lost GPU,
        an entry of the simulated faults file), and the GPUs seen reset since (``Reset``: their
        reset-needing taints go). Called every few seconds; never blocks."""
        ...

    async def aclose(self) -> None: ...


@dataclasses.dataclass(frozen=True, order=True)
class MigPlacement:
    """Where a MIG GPU instance goes: a GPU (its whole-GPU device name), a MIG profile as
    NVIDIA spells it, and the first memory slice it occupies. What a partition device stands
    for (``mig.placement_of``), and what is created when one is prepared."""

    parent: str
    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.parent} {self.profile} at memory slice {self.start}"


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """A MIG GPU instance and the compute instance in it, as they exist on a GPU."""

    placement: MigPlacement
    gpu_instance: int
    """The GPU instance's id on its GPU (NVML's GI id)."""
    compute_instance: int | None
    """The compute instance's id in it; None for a GPU instance without one (left half made)."""
    uuid: str
    """``MIG-<uuid>`` of the MIG device (what ``NVIDIA_VISIBLE_DEVICES`` names); empty without
    a compute instance."""

    def __str__(self) -> str:
        return f"{self.placement} (GPU instance {self.gpu_instance}, {self.uuid or 'no CI'})"


@dataclasses.dataclass(frozen=True)
class MigRefusal:
    """A GPU in MIG mode whose MIG instances this agent may not manage: NVML answered
    ``NVML_ERROR_NO_PERMISSION`` (an agent without ``CAP_SYS_ADMIN`` and
    ``NVIDIA_MIG_CONFIG_DEVICES``). Its partitions are not published: none could be prepared."""

    gpu: str
    """The GPU's device name (``gpu-0``)."""
    uuid: str
    call: str
    """The NVML function that refused (``nvmlDeviceGetGpuInstancePossiblePlacements``)."""
    error: str
    """NVML's message (``Insufficient Permissions``)."""

    def __str__(self) -> str:
        return (
            f"{self.gpu} ({self.uuid}) is in MIG mode, but NVML refused "
            f"{self.call} ({self.error}): creating and destroying MIG instances needs a "
            f"privileged agent (CAP_SYS_ADMIN and NVIDIA_MIG_CONFIG_DEVICES=all; chart value "
            f"agent.mig.manage=true), so none of its partitions is published"
        )


@runtime_checkable
class MigInstances(Protocol):
    """An optional backend capability: MIG instances made and unmade on the node's GPUs.

    A backend that publishes MIG partitions has it; the agent asks ``isinstance(backend,
    MigInstances)`` and knows no backend by name. The agent owns the MIG instances it made: one
    per prepared partition; others' instances (a layout of the GPU Operator's mig-manager) are
    left alone unless the agent is told it owns the layout (``--mig-own-layout``). The async
    methods block nothing on the event loop and raise ``InventoryError`` naming the GPU and
    what failed; the others only read or set what the backend keeps in memory.
    """

    async def mig_instances(self) -> tuple[MigInstance, ...]:
        """Every MIG instance on the node's partitioned GPUs now (none of a GPU that refuses to
        list them: ``mig_refusals``)."""
        ...

    async def create_mig_instance(self, placement: MigPlacement) -> MigInstance:
        """Create the GPU instance of ``placement`` and a compute instance spanning it. If one
        exists at exactly that placement already, it is returned as it is (a retried call)."""
        ...

    async def destroy_mig_instance(self, instance: MigInstance) -> None:
        """Destroy the compute instance, then the GPU instance; one that is gone already (a
        reboot, a retried call) is not an error."""
        ...

    def adopt_mig_instances(self, placements: Collection[MigPlacement]) -> None:
        """The instances at ``placements`` are the agent's (its checkpoint records them), as
        are those it creates from now on: any other instance on a GPU is someone else's, left
        alone, and no partition that cannot be created beside it is published."""
        ...

    def mig_refusals(self) -> tuple[MigRefusal, ...]:
        """The GPUs in MIG mode whose instances NVML refused to list or manage when last
        asked (no privileges); their partitions are not published."""
        ...


def gpu_device(
    *,
    index: int,
    uuid: str,
    memory: str,
    product_name: str,
    brand: str,
    architecture: str,
    cuda_compute_capability: str,
    driver_version: str,
    mig_capable: bool,
    cuda_driver_version: str | None = None,
    pci_bus_id: str | None = None,
    name: str | None = None,
    healthy: bool = True,
) -> Device:
    """A GPU with the attributes every backend publishes, so selectors work on either backend.

    Versions are given as drivers report them and normalised to semver here.
    """
    attributes: dict[str, AttributeValue] = {
        "index": IntValue(index),
        "uuid": StringValue(uuid),
        "productName": StringValue(product_name),
        "brand": StringValue(brand),
        "architecture": StringValue(architecture),
        "cudaComputeCapability": VersionValue(normalize_version(cuda_compute_capability)),
        "driverVersion": VersionValue(normalize_version(driver_version)),
        "migCapable": BoolValue(mig_capable),
    }
    if cuda_driver_version is not None:
        attributes["cudaDriverVersion"] = VersionValue(normalize_version(cuda_driver_version))
    if pci_bus_id is not None:
        attributes[PCI_BUS_ID_ATTRIBUTE] = StringValue(pci_bus_id)
    return Device(
        name=name if name is not None else f"gpu-{index}",
        uuid=uuid,
        attributes=attributes,
        capacity={"memory": memory},
        healthy=healthy,
    )

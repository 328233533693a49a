"""MIG (Multi-Instance GPU) as partitionable devices: profile tables and counter layouts.

A GPU in MIG mode is published as one device per MIG placement the hardware allows, and not as
the whole GPU: the agent never changes a GPU's MIG mode, and a container given the whole GPU of
a MIG-mode GPU gets no MIG device to run on (NVIDIA's DRA driver announces only the partitions
of a MIG-mode GPU whose mode it does not toggle, ``nvlib.go``). Every placement consumes the
GPU's counter set, so the scheduler itself keeps allocations within what the GPU has
(Kubernetes' partitionable devices, ``sharedCounters`` / ``consumesCounters``; beta and on by
default from 1.36):

    memory-slice-<i>   1 each, i = 0..7: a placement takes the slices it occupies, so two
                       allocated placements never overlap (the GPU instance's position)
    compute-slices     7: a profile takes its compute slices (the ``<n>g`` of its name)
    media-extensions   1: only one ``+me`` instance may hold the media engines

GPU instances the agent did not make (``MigTable.foreign``: a layout of the GPU Operator's
mig-manager, or made by hand) are left alone: the placements that cannot be created beside
them are not offered, and the counter set holds only what they leave (their memory slices are
not in it, their compute slices and media engines are taken off). A GPU whose placements could
not be read (``MigTable.profiles`` empty: NVML refused an unprivileged agent) publishes nothing.

Tables are NVIDIA's (MIG User Guide, "Supported MIG Profiles" for A100-SXM4-40GB and
H100-SXM5-80GB): profile, memory and compute slices, and the placements (first memory slice)
each profile may start at. Memory per profile is the nominal size of its name (``1g.5gb`` ->
5Gi), which is what the simulated backend publishes; NVML reports slightly less.

Pure: no NVML, no I/O. Backends build each GPU's device; this module turns a MIG-mode GPU into
its partitions.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence

from dra_gpu.devices import gpu_models, model, pci

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
COMPUTE_COUNTER = "compute-slices"
MEDIA_COUNTER = "media-extensions"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


@dataclasses.dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a GPU model, with the placements NVIDIA lists for it."""

    name: str
    """As NVIDIA spells it: ``3g.20gb``, ``1g.5gb+me``."""
    memory_gib: int
    memory_slices: int
    compute_slices: int
    starts: tuple[int, ...]
    """First memory slice of each placement (``nvidia-smi mig -lgipp``)."""
    media_extensions: bool = False
    memory_mib: int | None = None
    """The memory NVML reports for the profile, when read from NVML (a little less than the
    name says); None: the nominal ``memory_gib``."""

    @property
    def device_suffix(self) -> str:
        """The profile in a DNS label, distinct for every profile NVIDIA names: ``3g.20gb`` ->
        ``3g-20gb``; a ``+<option>`` adds ``-<option>`` (``1g.5gb+me`` -> ``1g-5gb-me``,
        ``1g.24gb+me.all`` -> ``1g-24gb-me-all``, ``+gfx`` -> ``-gfx``); a ``-<option>``
        (without it) adds ``-no-<option>`` (``1g.24gb-me`` -> ``1g-24gb-no-me``). Names of
        profiles without options, and of ``+me`` ones, are what earlier versions published
        (a recorded claim names its device)."""
        return profile_label(self.name)

    @property
    def memory(self) -> str:
        """The published ``memory`` capacity of a partition of this profile."""
        if self.memory_mib is not None:
            return model.format_bytes(self.memory_mib * 2**20)
        return f"{self.memory_gib}Gi"


@dataclasses.dataclass(frozen=True)
class MigTable:
    """The MIG profiles of one GPU model."""

    model: str
    memory_gib: int
    profiles: tuple[MigProfile, ...]
    foreign: tuple[Placement, ...] = ()
    """Read from one GPU: the placements of GPU instances on it that the agent did not make.
    They are left alone, and nothing that cannot be created beside them is offered."""


def table_of(gpu: gpu_models.GpuModel) -> MigTable:
    """The partition table of a GPU model (``devices.gpu_models``: NVML's profiles, checked
    against NVIDIA's go-nvml mocks), memory the nominal size of each profile's name."""
    profiles = tuple(
        MigProfile(
            p.name,
            p.nominal_gib,
            p.memory_slices,
            p.compute_slices,
            p.starts,
            media_extensions=p.media_extensions,
        )
        for p in gpu.profiles
    )
    return MigTable(gpu.mig_model, gpu.nominal_gib, profiles)


A100_40GB = table_of(gpu_models.A100_40GB)
H100_80GB = table_of(gpu_models.H100_80GB)
TABLES: Mapping[str, MigTable] = {key: table_of(m) for key, m in gpu_models.MODELS.items()}
"""By the name a simulated profile uses (``mig: A100-40GB``; every ``gpu_models.MODELS`` key)."""

_MIG_UUIDS = uuid.uuid5(uuid.NAMESPACE_DNS, "mig.simulated.dra-gpu.io")
_PROFILE_NAME = re.compile(r"(\d+g\.\d+gb)((?:[+-][a-z0-9]+(?:\.[a-z0-9]+)*)*)")
_OPTION = re.compile(r"([+-])([a-z0-9]+(?:\.[a-z0-9]+)*)")


def profile_label(name: str) -> str:
    """``MigProfile.device_suffix`` of a profile named ``name``."""
    match = _PROFILE_NAME.fullmatch(name.strip().lower())
    if match is None:  # not NVIDIA's <c>g.<m>gb form: every run of other characters is a dash
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    base, options = match.groups()
    parts = [base.replace(".", "-")]
    for sign, option in _OPTION.findall(options):
        parts.append(("" if sign == "+" else "no-") + option.replace(".", "-"))
    return "-".join(parts)


@dataclasses.dataclass(frozen=True)
class Placement:
    """One place a profile's GPU instance can be created on a GPU."""

    profile: MigProfile
    start: int

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)

    def counters(self) -> dict[str, int]:
        used = {memory_slice_counter(i): 1 for i in self.memory_slices}
        used[COMPUTE_COUNTER] = self.profile.compute_slices
        if self.profile.media_extensions:
            used[MEDIA_COUNTER] = 1
        return used


def placements(table: MigTable) -> list[Placement]:
    return [Placement(p, start) for p in table.profiles for start in p.starts]


def counter_set_name(gpu: model.Device) -> str:
    return f"{gpu.name}-counters"


def gpu_counters() -> dict[str, int]:
    """Everything a MIG-capable GPU has: each memory slice, its compute slices, the media
    engines (once)."""
    counters = {memory_slice_counter(i): 1 for i in range(MEMORY_SLICES)}
    counters[COMPUTE_COUNTER] = COMPUTE_SLICES
    counters[MEDIA_COUNTER] = 1
    return counters


def partition_name(gpu: model.Device, placement: Placement) -> str:
    """``gpu-0-mig-3g-20gb-4``: the GPU, the profile, the first memory slice."""
    return partition_name_of(gpu.name, placement)


def partition_name_of(gpu_name: str, placement: Placement) -> str:
    return f"{gpu_name}-mig-{placement.profile.device_suffix}-{placement.start}"


def partition_uuid(gpu: model.Device, placement: Placement) -> str:
    """A stable ``MIG-<uuid>`` for the simulated instance of ``placement`` on ``gpu``."""
    return f"MIG-{uuid.uuid5(_MIG_UUIDS, f'{gpu.uuid}/{partition_name(gpu, placement)}')}"


def counter_set(gpu: model.Device, table: MigTable) -> model.CounterSet | None:
    """The counter set of ``gpu``: everything the GPU has (each memory slice, its compute
    slices, the media engines once) less what ``table.foreign`` instances hold; None if they
    hold all of it."""
    counters = gpu_counters()
    for held in table.foreign:
        for name, used in held.counters().items():
            counters[name] = counters.get(name, 0) - used
    left = {name: value for name, value in counters.items() if value > 0}
    return model.CounterSet(counter_set_name(gpu), left) if left else None


def offered(table: MigTable) -> list[Placement]:
    """The placements of ``table`` that can be created beside its ``foreign`` instances."""
    return [p for p in placements(table) if conflict(p, table.foreign) is None]


def partitioned(
    gpu: model.Device, table: MigTable
) -> tuple[model.CounterSet | None, tuple[model.Device, ...]]:
    """The counter set of ``gpu`` in MIG mode and its devices: one per placement of ``table``
    that is offered (``offered``). Not the whole GPU. No counter set and no device when nothing
    can be offered (no placement could be read, or others' instances take the GPU)."""
    parts = offered(table)
    counters = counter_set(gpu, table) if parts else None
    if counters is None:
        return None, ()
    return counters, tuple(_partition(gpu, table, p, counters.name) for p in parts)


_INHERITED_ATTRIBUTES = (
    "productName",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    pci.PCIE_ROOT_ATTRIBUTE,
    pci.NUMA_NODE_ATTRIBUTE,
)


def _partition(
    gpu: model.Device, table: MigTable, placement: Placement, counter_set: str
) -> model.Device:
    profile = placement.profile
    attributes: dict[str, model.AttributeValue] = {
        "type": model.StringValue("mig"),
        "profile": model.StringValue(profile.name),
        "parentIndex": model.IntValue(gpu.index if gpu.index is not None else 0),
        "parentUUID": model.StringValue(gpu.uuid),
        "placementStart": model.IntValue(placement.start),
        "memorySlices": model.IntValue(profile.memory_slices),
        "computeSlices": model.IntValue(profile.compute_slices),
        "mediaExtensions": model.BoolValue(profile.media_extensions),
        "migModel": model.StringValue(table.model),
    }
    # What a partition shares with its GPU, topology included: a MIG device lines up with a NIC
    # on its GPU's PCIe root and NUMA node (as NVIDIA's driver publishes its MIG devices).
    for key in _INHERITED_ATTRIBUTES:
        if key in gpu.attributes:
            attributes[key] = gpu.attributes[key]
    return model.Device(
        name=partition_name(gpu, placement),
        uuid=partition_uuid(gpu, placement),
        attributes=attributes,
        capacity={"memory": profile.memory},
        consumes={counter_set: placement.counters()},
        partition_of=gpu.name,
        healthy=gpu.healthy,
    )


def partition_inventory(
    node: str, devices: Sequence[model.Device], tables: Mapping[str, MigTable]
) -> model.Inventory:
    """``devices`` with each GPU named in ``tables`` (device name -> table: a GPU in MIG mode)
    replaced by its partitions."""
    out: list[model.Device] = []
    sets: list[model.CounterSet] = []
    for device in devices:
        table = tables.get(device.name)
        if table is None:
            out.append(device)
            continue
        counters, parts = partitioned(device, table)
        if counters is not None:
            sets.append(counters)
        out.extend(parts)
    return model.Inventory(node, tuple(out), tuple(sets))


def placement_of(device: model.Device) -> model.MigPlacement | None:
    """The MIG placement a partition device stands for (from its attributes); None for a
    device that is no MIG partition."""
    profile = device.attributes.get("profile")
    start = device.attributes.get("placementStart")
    if device.partition_of is None or not isinstance(profile, model.StringValue):
        return None
    if not isinstance(start, model.IntValue):
        return None
    return model.MigPlacement(device.partition_of, profile.value, start.value)


def placement_in(table: MigTable, placement: model.MigPlacement) -> Placement:
    """``placement`` as ``table`` has it; InventoryError if the GPU model has no such one."""
    for profile in table.profiles:
        if profile.name == placement.profile:
            if placement.start not in profile.starts:
                starts = ", ".join(map(str, profile.starts))
                raise model.InventoryError(
                    f"{placement.parent}: profile {profile.name} of {table.model} starts at "
                    f"memory slice {starts}, not {placement.start}"
                )
            return Placement(profile, placement.start)
    known = ", ".join(p.name for p in table.profiles)
    raise model.InventoryError(
        f"{placement.parent}: {table.model} has no MIG profile {placement.profile} ({known})"
    )


def conflict(new: Placement, existing: Iterable[Placement]) -> str | None:
    """Why ``new`` cannot be created beside ``existing`` on one GPU (as the hardware refuses:
    a memory slice taken twice, more compute slices or media engines than the GPU has), or
    None if it fits. The scheduler's counters keep allocations within this; the backends
    check again, so a bug anywhere shows as a refusal and never as an over-committed GPU."""
    held = list(existing)
    taken = {i for p in held for i in p.memory_slices}
    overlap = sorted(taken.intersection(new.memory_slices))
    if overlap:
        return f"memory slice(s) {', '.join(map(str, overlap))} are taken"
    compute = sum(p.profile.compute_slices for p in held) + new.profile.compute_slices
    if compute > COMPUTE_SLICES:
        return f"{compute} compute slices would be in use, the GPU has {COMPUTE_SLICES}"
    if new.profile.media_extensions and any(p.profile.media_extensions for p in held):
        return "the media extensions are taken"
    return None

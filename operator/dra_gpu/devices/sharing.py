"""Shared GPUs as people configure them: the ``sharing`` block, and which NVML GPUs the agent's
``--shared-gpus`` setting shares.

This module owns the one reading of the block ``{mode: TimeSlicing | MPS, memory: {default, min,
max, step}}``, spelled the same per device in the simulated profile and per entry in
``--shared-gpus``, and ``share``: a GPU shared by a policy checked against its memory as the API
server checks it (``model.MemoryPolicy.check``), with the field named. Both backends share a GPU
through it, so publishing, prepare and CDI see the same ``model.Sharing`` whichever found it.
Pure: it reads no GPU and no file, and logs nothing; errors are ``strict.FieldError``s with the
field's path, or ``model.InventoryError``s that name the setting.

The setting (YAML or JSON; one entry may stand without the list)::

    - gpus: all                                  # or NVML indexes and UUIDs: [0, "GPU-5f2a..."]
      mode: MPS                                  # TimeSlicing (default) | MPS
      memory: {default: 8Gi, min: 4Gi, step: 4Gi}   # also max; default and min required
      activeThreadPercentage: 50                 # MPS only: each client's share of threads
    - gpus: [2, 3]
      memory: {default: 20Gi, min: 10Gi, step: 10Gi}
      timeSlice: Short                           # TimeSlicing only: Default|Short|Medium|Long

A GPU named twice (by index or UUID in two places, or by its index in one entry and its UUID in
another, found when the GPUs are read) is an error, and so is ``all`` beside another entry. A
name no GPU of the node has is passed over: one setting serves every node of a DaemonSet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dra_gpu.devices import model, strict

MEMORY_FIELDS = ("default", "min", "max", "step")
SETTINGS = ("activeThreadPercentage", "timeSlice")
"""The block's optional GPU settings: MPS's ``activeThreadPercentage`` (1-100, each client's
share of the GPU's threads) and TimeSlicing's ``timeSlice`` (Default | Short | Medium | Long,
set on the GPU with ``nvidia-smi compute-policy --set-timeslice`` while it is shared)."""
_ANY_MEMORY = 2**63 - 1
"""The most memory a capacity can state: a policy that fails on it fails on every GPU."""


def memory_quantity(value: object) -> str:
    """A positive quantity as written (``24Gi``; YAML reads a bare number of bytes as an int)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise model.InventoryError(f"expected a quantity such as 24Gi, got {strict.kind(value)}")
    if model.parse_quantity(value) <= 0:
        raise model.InventoryError(f"{value!r} must be more than zero")
    return value


def parse_sharing(value: object, path: str, extra: tuple[str, ...] = ()) -> model.Sharing:
    """The ``sharing`` block at ``path`` (``extra``: more keys the caller reads itself)."""
    block = strict.mapping(value, path, {"mode", "memory", *SETTINGS, *extra})
    mode = block.get("mode", "TimeSlicing")
    if mode not in model.SHARING_MODES:
        raise strict.FieldError(
            strict.child(path, "mode"), f"{mode!r} is not one of {', '.join(model.SHARING_MODES)}"
        )
    memory_path = strict.child(path, "memory")
    if "memory" not in block:
        raise strict.FieldError(memory_path, "required (default and min at least)")
    memory = strict.mapping(block["memory"], memory_path, MEMORY_FIELDS)
    values: dict[str, str] = {}
    for key in ("default", "min"):
        if key not in memory:
            raise strict.FieldError(strict.child(memory_path, key), "required")
    for key, raw in memory.items():
        try:
            quantity = memory_quantity(raw)
            values[key] = model.format_bytes(int(model.parse_quantity(quantity)))
        except (model.InventoryError, ValueError) as err:
            raise strict.FieldError(strict.child(memory_path, key), str(err)) from None
    pct = block.get("activeThreadPercentage")
    if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int)):
        raise strict.FieldError(
            strict.child(path, "activeThreadPercentage"), f"expected 1-100, got {strict.kind(pct)}"
        )
    try:
        return model.Sharing(
            mode,
            model.MemoryPolicy(**values),
            active_thread_percentage=pct,
            time_slice=block.get("timeSlice"),
        )
    except model.InventoryError as err:
        field, _, message = str(err).partition(": ")
        raise strict.FieldError(strict.child(path, field), message) from None


def share(device: model.Device, sharing: model.Sharing, path: str) -> model.Device:
    """``device`` offered shared, once its memory policy passes the API server's rules for the
    device's memory; a FieldError names the field below ``path`` (the block's place)."""
    memory = device.memory_bytes
    if memory is None:
        raise strict.FieldError(path, f"device {device.name} has no memory capacity to share")
    check(sharing, memory, path)
    return dataclasses.replace(device, sharing=sharing)


def check(sharing: model.Sharing, memory: int, path: str) -> None:
    """The API server's rules for the policy on ``memory`` bytes (``model.MemoryPolicy.check``);
    a FieldError names the field below ``path``."""
    try:
        sharing.memory.check(memory)
    except model.InventoryError as err:
        field, _, message = str(err).partition(": ")
        raise strict.FieldError(strict.child(path, f"memory.{field}"), message) from None


# --- the agent's --shared-gpus setting ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of the setting: which GPUs, shared how."""

    path: str
    """Where it stands in the setting, for messages: ``[1]``, or ``""`` for a lone entry."""
    sharing: model.Sharing
    every: bool = False
    """``gpus: all``."""
    indexes: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()

    def names(self, index: int, uuid: str) -> bool:
        return self.every or index in self.indexes or uuid in self.uuids

    @property
    def gpus_path(self) -> str:
        """Where its ``gpus`` stands: ``[1].gpus``."""
        return strict.child(self.path, "gpus")


@dataclasses.dataclass(frozen=True)
class SharedGpus:
    """The setting, parsed (``parse_shared_gpus``): which NVML GPUs several claims may hold at
    once, each with a memory share. No entries: every GPU exclusive."""

    entries: tuple[Entry, ...] = ()
    source: str = "--shared-gpus"
    """What the setting is called in messages (the flag and its environment variable)."""

    def entry_for(self, index: int, uuid: str) -> Entry | None:
        """The entry naming the GPU with this NVML index and UUID; InventoryError when two do."""
        named = [e for e in self.entries if e.names(index, uuid)]
        if len(named) > 1:
            first, second = named[:2]
            raise model.InventoryError(
                f"{self.source}: {second.gpus_path}: GPU {index} ({uuid}) is "
                f"already shared by {first.path}; name each GPU once"
            )
        return named[0] if named else None

    def share(self, device: model.Device, entry: Entry) -> model.Device:
        """``device`` shared as ``entry`` says; InventoryError naming the setting and the field
        when the policy does not fit the device's memory."""
        try:
            return share(device, entry.sharing, entry.path)
        except strict.FieldError as err:
            raise model.InventoryError(f"{self.source}: {err}") from None

    def absent(self, gpus: Mapping[int, str]) -> tuple[str, ...]:
        """The names the setting gives that no GPU of ``gpus`` (index -> UUID) has, each with
        its place: ``[1].gpus: GPU 5``."""
        uuids = set(gpus.values())
        return tuple(
            f"{e.gpus_path}: {name}"
            for e in self.entries
            for name in [f"GPU {i}" for i in sorted(e.indexes - gpus.keys())]
            + sorted(e.uuids - uuids)
        )


def parse_shared_gpus(text: str, source: str = "--shared-gpus") -> SharedGpus:
    """The setting's text (module docstring); empty or ``null``: nothing shared. InventoryError
    naming ``source`` and the field."""
    try:
        return SharedGpus(_entries(strict.load_yaml(text) if text.strip() else None), source)
    except strict.FieldError as err:
        raise model.InventoryError(f"{source}: {err}") from None


def _entries(data: object) -> tuple[Entry, ...]:
    if data is None:
        return ()
    if isinstance(data, dict):  # a lone entry
        items: list[tuple[str, object]] = [("", data)]
    elif isinstance(data, list):
        items = [(f"[{i}]", item) for i, item in enumerate(data)]
    else:
        raise strict.FieldError("", f"expected a list of entries, got {strict.kind(data)}")
    entries: list[Entry] = []
    named: dict[int | str, str] = {}  # index or UUID -> where it was named first
    for path, item in items:
        sharing = parse_sharing(item, path, extra=("gpus",))
        # What holds for any GPU (default within [min, max], whole steps) fails here, at start;
        # what depends on a GPU's memory, when the GPUs are read.
        check(sharing, _ANY_MEMORY, path)
        gpus_path = strict.child(path, "gpus")
        gpus = strict.mapping(item, path, None).get("gpus")
        if gpus is None:
            raise strict.FieldError(
                gpus_path, 'required: all, or a list of indexes and "GPU-" UUIDs'
            )
        if gpus == "all":
            if len(items) > 1:
                raise strict.FieldError(
                    gpus_path, "all leaves no GPU for the other entries; list the GPUs of each"
                )
            entries.append(Entry(path, sharing, every=True))
            continue
        if not isinstance(gpus, list) or not gpus:
            raise strict.FieldError(
                gpus_path, f"expected all or a non-empty list of GPUs, got {strict.kind(gpus)}"
            )
        for k, gpu in enumerate(gpus):
            at = f"{gpus_path}[{k}]"
            if not _is_index(gpu) and not _is_uuid(gpu):
                raise strict.FieldError(
                    at, f'{gpu!r} is neither an NVML index (0, 1, ...) nor a UUID ("GPU-...")'
                )
            if gpu in named:
                raise strict.FieldError(at, f"GPU {gpu} is already named at {named[gpu]}")
            named[gpu] = at
        entries.append(
            Entry(
                path,
                sharing,
                indexes=frozenset(g for g in gpus if isinstance(g, int)),
                uuids=frozenset(g for g in gpus if isinstance(g, str)),
            )
        )
    return tuple(entries)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_uuid(value: object) -> bool:
    return isinstance(value, str) and value.startswith("GPU-") and len(value) > len("GPU-")

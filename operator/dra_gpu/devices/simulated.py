"""The simulated backend: GPUs described per node in a YAML profile, for clusters without GPUs.

This module owns the profile format and its strict parsing: unknown keys, wrong types, bad
quantities, duplicate keys or device names, and broken YAML all become a ``ProfileError`` that
names the file and the field (``profile p.yaml: nodes.node-01.devices[1].memory: ...``). It never
talks to Kubernetes. The format::

    defaults:                 # optional; any device field except name, count, uuid, pciBusID
      driverVersion: "550.54.15"
    nodes:
      node-01:
        devices:
        - name: gpu-0         # optional; default gpu-<index>, index = position on the node
          memory: 24Gi        # required (here or in defaults): a Kubernetes quantity
          productName: NVIDIA L4
        - count: 4            # optional; that many identical devices, named gpu-<index>
          memory: 80Gi
      node-02: {}             # listed, no GPUs

Device fields: name, count, uuid, pciBusID, memory, productName, brand, architecture,
cudaComputeCapability, driverVersion, cudaDriverVersion (versions as quoted strings, e.g. "9.0";
``cudaDriverVersion: null`` leaves it out), migCapable, healthy, mig, sharing. UUIDs default to a
value derived from node and device name, so a restarted agent publishes the same ones.

``mig: A100-40GB`` or ``mig: H100-80GB`` publishes the GPU MIG-partitioned (``devices.mig``):
the whole GPU and every MIG placement of that model, consuming the GPU's counters. Such a GPU
is ``migCapable``, and its ``memory`` must be the model's (40Gi, 80Gi).

``sharing`` offers the GPU to several claims at once, each with a share of its memory
(``allowMultipleAllocations`` and a ``requestPolicy`` on ``memory``; Kubernetes 1.36+)::

    sharing:
      mode: TimeSlicing       # or MPS (each container gets a pinned-memory limit); default
                              # TimeSlicing
      memory: {default: 8Gi, min: 4Gi, step: 2Gi, max: 40Gi}   # default and min required

The values must be what the API server accepts for that GPU's memory (min and max within it,
default within [min, max], default and max min plus whole steps); a GPU with ``mig`` cannot
also be shared.

Simulated MIG instances (``model.MigInstances``): the GPU instances that exist now are the
"hardware" state of the simulated GPUs, kept in ``<hardware dir>/<node>-mig-instances.json``.
The agent gives a directory on the node's tmpfs (beside its CDI specs), so the table survives
an agent crash but not a reboot, as MIG instances do not survive a GPU reset. Creating one
checks what the hardware would (a placement of the GPU's model, no memory slice taken twice,
at most 7 compute slices, one media extension); its ``MIG-<uuid>`` is the partition device's.
Without a directory the table is kept in memory (tests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dra_gpu.devices import health, mig, model, sharing, strict

_R = TypeVar("_R")
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.dra-gpu.io")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
MAX_COUNT = 1024  # a typo like "count: 100000" should fail, not allocate a million objects

_BUILTIN_DEFAULTS: dict[str, Any] = {
    "productName": "Simulated GPU",
    "brand": "Simulated",
    "architecture": "Simulated",
    "cudaComputeCapability": "9.0.0",
    "driverVersion": "550.54.15",
    "cudaDriverVersion": "12.4.0",
    "migCapable": False,
    "healthy": True,
}
_PER_DEVICE_ONLY = frozenset({"name", "count", "uuid", "pciBusID"})


@dataclasses.dataclass(frozen=True)
class Profile:
    """A parsed profile: the devices of every node it lists."""

    source: str
    nodes: Mapping[str, tuple[model.Device, ...]]
    mig: Mapping[str, Mapping[str, mig.MigTable]] = dataclasses.field(default_factory=dict)
    """Node -> device name -> the MIG table of a GPU published partitioned."""

    def inventory(self, node: str) -> model.Inventory:
        """The node's devices; a node the profile does not list has none."""
        return mig.partition_inventory(node, self.nodes.get(node, ()), self.mig.get(node, {}))


class SimulatedBackend:
    """Serves one node's devices from a profile.

    Given a path, the file is parsed here (so a bad profile stops the agent at start) and read
    again, off the event loop, on every ``inventory()``: editing the file is how tests and
    demos add or remove GPUs. A file that turns bad later raises ``ProfileError`` from there.
    """

    def __init__(
        self,
        profile: Path | Profile,
        node: str,
        *,
        faults_file: Path | None = None,
        xids: health.XidPolicy | None = None,
        hardware_dir: Path | None = None,
    ) -> None:
        self.node = node
        self._path = profile if isinstance(profile, Path) else None
        self._profile = load_profile(profile) if isinstance(profile, Path) else profile
        self.faults_file = faults_file
        self.xids = xids or health.XidPolicy()
        self.hardware_dir = hardware_dir
        """Where the simulated GPUs' MIG instances are kept (a tmpfs: gone after a reboot)."""
        self._instances: list[model.MigInstance] = []  # without a hardware_dir
        self._hardware_lock = threading.Lock()

    @property
    def node_in_profile(self) -> bool:
        """Whether the profile lists this node at all (an unlisted node has zero devices)."""
        return self.node in self._profile.nodes

    async def inventory(self) -> model.Inventory:
        if self._path is not None:
            self._profile = await asyncio.to_thread(load_profile, self._path)
        return self._profile.inventory(self.node)

    def container_env(self, position: int, device: model.Device) -> dict[str, str]:
        """``GPU_DEVICE_<position>=<device>``: one variable per device, so a container given
        several devices sees all of them; the tutorial's workloads print these to show which
        GPU they got. A MIG partition also names its MIG device, as ``NVIDIA_VISIBLE_DEVICES``
        would: ``GPU_DEVICE_<position>_MIG=MIG-<uuid>``."""
        env = {f"GPU_DEVICE_{position}": device.name}
        if device.partition_of is not None:
            env[f"GPU_DEVICE_{position}_MIG"] = device.uuid
        return env

    # ---- MIG instances (model.MigInstances) ------------------------------------------------

    @property
    def instances_file(self) -> Path | None:
        if self.hardware_dir is None:
            return None
        return self.hardware_dir / f"{self.node}-mig-instances.json"

    async def mig_instances(self) -> tuple[model.MigInstance, ...]:
        return await asyncio.to_thread(self._locked, lambda table: tuple(table))

    async def create_mig_instance(self, placement: model.MigPlacement) -> model.MigInstance:
        return await asyncio.to_thread(self._locked, lambda t: self._create(t, placement))

    async def destroy_mig_instance(self, instance: model.MigInstance) -> None:
        def destroy(table: list[model.MigInstance]) -> None:
            table[:] = [
                i
                for i in table
                if (i.placement, i.gpu_instance) != (instance.placement, instance.gpu_instance)
            ]

        await asyncio.to_thread(self._locked, destroy)

    def _create(
        self, table: list[model.MigInstance], placement: model.MigPlacement
    ) -> model.MigInstance:
        for existing in table:
            if existing.placement == placement:
                return existing
        gpus = {d.name: d for d in self._profile.nodes.get(self.node, ())}
        mig_table = self._profile.mig.get(self.node, {}).get(placement.parent)
        gpu = gpus.get(placement.parent)
        if gpu is None or mig_table is None:
            raise model.InventoryError(
                f"node {self.node}: {placement.parent} is not a MIG-partitioned GPU here"
            )
        wanted = mig.placement_in(mig_table, placement)
        on_gpu = [i for i in table if i.placement.parent == placement.parent]
        held = [mig.placement_in(mig_table, i.placement) for i in on_gpu]
        why = mig.conflict(wanted, held)
        if why is not None:
            raise model.InventoryError(
                f"node {self.node}: cannot create a MIG instance for {placement}: {why}"
            )
        ids = {i.gpu_instance for i in on_gpu}
        created = model.MigInstance(
            placement,
            gpu_instance=min(set(range(1, len(ids) + 2)) - ids),
            compute_instance=0,
            uuid=mig.partition_uuid(gpu, wanted),
        )
        table.append(created)
        return created

    def _locked(self, change: Callable[[list[model.MigInstance]], _R]) -> _R:
        """(In a thread.) ``change`` applied to the instance table, which is saved if it
        changed."""
        with self._hardware_lock:
            path = self.instances_file
            table = self._instances if path is None else _read_instances(path)
            before = list(table)
            result = change(table)
            if path is not None and table != before:
                _write_instances(path, table)
            return result

    async def faults(self) -> tuple[health.Fault, ...]:
        """What the faults file lists now (nothing without one); a bad file raises
        ``ProfileError`` naming file and field."""
        if self.faults_file is None:
            return ()
        return await asyncio.to_thread(load_faults, self.faults_file, self.xids)

    async def aclose(self) -> None:
        return None


def _read_instances(path: Path) -> list[model.MigInstance]:
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        raise model.InventoryError(f"simulated MIG instances {path}: unreadable: {err}") from None
    try:
        return [
            model.MigInstance(
                model.MigPlacement(i["parent"], i["profile"], i["start"]),
                i["gpuInstance"],
                i["computeInstance"],
                i["uuid"],
            )
            for i in items
        ]
    except (KeyError, TypeError) as err:
        raise model.InventoryError(f"simulated MIG instances {path}: bad entry: {err}") from None


def _write_instances(path: Path, table: list[model.MigInstance]) -> None:
    # Atomic (a crash leaves the old table or the new one); not fsync'd: the file lives on a
    # tmpfs, as the hardware state it stands for does not outlive a power cycle either.
    body = [
        {
            "parent": i.placement.parent,
            "profile": i.placement.profile,
            "start": i.placement.start,
            "gpuInstance": i.gpu_instance,
            "computeInstance": i.compute_instance,
            "uuid": i.uuid,
        }
        for i in table
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def load_faults(path: Path, xids: health.XidPolicy) -> tuple[health.Fault, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as err:
        raise model.ProfileError(f"faults file {path}: cannot be read: {err}") from None
    return parse_faults(text, xids, source=str(path))


def parse_faults(
    text: str, xids: health.XidPolicy, source: str = "<string>"
) -> tuple[health.Fault, ...]:
    """The faults a faults file lists (see the module docstring); ignored XIDs give none."""
    try:
        data = yaml.load(text, Loader=strict.StrictLoader)
    except yaml.YAMLError as err:
        raise model.ProfileError(f"faults file {source}: not valid YAML: {err}") from None
    parser = _Parser(source, what="faults file")
    faults: list[health.Fault] = []
    for device, spec in parser.mapping(data, "", None).items():
        if not isinstance(device, str) or not model.is_dns_label(device):
            raise parser.error(str(device), "a device name must be a DNS label (e.g. gpu-0)")
        entries = parser.mapping(spec, device, {"xid", "ecc", "lost"})
        if not entries:
            raise parser.error(device, "expected one of xid, ecc, lost")
        for cause, value in entries.items():
            path = f"{device}.{cause}"
            if cause == "xid":
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise parser.error(path, f"expected an XID (a positive number), got {value!r}")
                fault = xids.fault(device, value, f"XID {value} (simulated)")
                if fault is not None:
                    faults.append(fault)
            elif cause == "ecc":
                if value != "double-bit":
                    raise parser.error(path, f"expected double-bit, got {value!r}")
                faults.append(health.ecc_fault(device, "double-bit ECC error (simulated)"))
            elif value is not True:
                raise parser.error(path, f"expected true, got {value!r}")
            else:
                faults.append(health.lost_fault(device, "the GPU is lost (simulated)"))
    return tuple(faults)


def load_profile(path: Path) -> Profile:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise model.ProfileError(f"profile {path}: cannot be read: {err}") from None
    return parse_profile(text, source=str(path))


def parse_profile(text: str, source: str = "<string>") -> Profile:
    try:
        data = strict.load_yaml(text)
    except strict.FieldError as err:
        raise model.ProfileError(f"profile {source}: {err}") from None
    return _Parser(source).profile(data)


class _Parser:
    def __init__(self, source: str, what: str = "profile") -> None:
        self.source = source
        self.what = what

    def error(self, path: str, message: str) -> model.ProfileError:
        return model.ProfileError(f"{self.what} {self.source}: {path}: {message}")

    def mapping(self, value: object, path: str, known: Collection[str] | None) -> dict[Any, Any]:
        """The mapping at ``path``; ``known`` lists its allowed keys, None allows any key."""
        try:
            return strict.mapping(value, path, known)
        except strict.FieldError as err:
            raise self.error(err.path, err.message) from None

    def profile(self, data: object) -> Profile:
        if data is None:
            raise self.error("nodes", "the profile is empty; it needs a 'nodes' mapping")
        top = self.mapping(data, "", {"nodes", "defaults"})
        if "nodes" not in top:
            raise self.error("nodes", "required")
        defaults = self.mapping(top.get("defaults"), "defaults", _FIELDS.keys() - _PER_DEVICE_ONLY)
        parsed_defaults = {k: self.field(k, v, f"defaults.{k}") for k, v in defaults.items()}
        nodes: dict[str, tuple[model.Device, ...]] = {}
        tables: dict[str, dict[str, mig.MigTable]] = {}
        for node, spec in self.mapping(top["nodes"], "nodes", None).items():
            path = f"nodes.{node}"
            if not isinstance(node, str) or not model.is_dns_subdomain(node):
                raise self.error(path, "a node name must be a DNS subdomain (e.g. node-01)")
            tables[node] = {}
            nodes[node] = self.node(node, spec, path, parsed_defaults, tables[node])
        return Profile(source=self.source, nodes=nodes, mig=tables)

    def node(
        self,
        node: str,
        spec: object,
        path: str,
        defaults: dict[str, Any],
        tables: dict[str, mig.MigTable],
    ) -> tuple[model.Device, ...]:
        entries = self.mapping(spec, path, {"devices"}).get("devices")
        if entries is None:  # "devices:" with nothing after it, or no key: a node without GPUs
            entries = []
        if not isinstance(entries, list):
            raise self.error(f"{path}.devices", f"expected a list, got {strict.kind(entries)}")
        devices: list[model.Device] = []
        first_use: dict[str, str] = {}
        for i, entry in enumerate(entries):
            entry_path = f"{path}.devices[{i}]"
            fields = {
                k: self.field(k, v, f"{entry_path}.{k}")
                for k, v in self.mapping(entry, entry_path, _FIELDS.keys()).items()
            }
            count = fields.pop("count", 1)
            clash = sorted(_PER_DEVICE_ONLY & fields.keys())
            if count > 1 and clash:
                raise self.error(
                    f"{entry_path}.{clash[0]}",
                    "cannot be combined with count > 1 (those devices are named gpu-<index>)",
                )
            if "memory" not in fields and "memory" not in defaults:
                raise self.error(f"{entry_path}.memory", "required (here or in defaults)")
            for _ in range(count):
                device = self.device(node, len(devices), {**defaults, **fields}, entry_path)
                if device.name in first_use:
                    raise self.error(
                        f"{entry_path}.name",
                        f"{device.name!r} is already used by {first_use[device.name]}",
                    )
                first_use[device.name] = entry_path
                table = {**defaults, **fields}.get("mig")
                policy = {**defaults, **fields}.get("sharing")
                if table is not None and policy is not None:
                    raise self.error(
                        f"{entry_path}.sharing", "a GPU with mig cannot also be shared"
                    )
                if policy is not None:
                    device = self.shared(device, policy, entry_path)
                devices.append(device)
                if table is not None:
                    tables[device.name] = self.mig_table(device, table, entry_path)
        return tuple(devices)

    def device(self, node: str, index: int, fields: dict[str, Any], path: str) -> model.Device:
        values = {**_BUILTIN_DEFAULTS, **fields}
        name = values.get("name", f"gpu-{index}")
        try:
            return model.gpu_device(
                index=index,
                name=name,
                uuid=values.get("uuid") or f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{name}')}",
                memory=values["memory"],
                product_name=values["productName"],
                brand=values["brand"],
                architecture=values["architecture"],
                cuda_compute_capability=values["cudaComputeCapability"],
                driver_version=values["driverVersion"],
                cuda_driver_version=values["cudaDriverVersion"],
                mig_capable=values["migCapable"],
                pci_bus_id=values.get("pciBusID"),
                healthy=values["healthy"],
            )
        except model.InventoryError as err:
            raise self.error(path, str(err)) from None

    def mig_table(self, device: model.Device, table: mig.MigTable, path: str) -> mig.MigTable:
        if device.attributes.get("migCapable") != model.BoolValue(True):
            raise self.error(f"{path}.migCapable", "must be true for a GPU with mig")
        if device.memory_bytes != table.memory_gib * 2**30:
            raise self.error(
                f"{path}.memory",
                f"{device.memory} is not the {table.memory_gib}Gi of a {table.model} (mig)",
            )
        return table

    def shared(self, device: model.Device, policy: model.Sharing, path: str) -> model.Device:
        try:
            return sharing.share(device, policy, f"{path}.sharing")
        except strict.FieldError as err:
            raise self.error(err.path, err.message) from None

    def sharing(self, value: object, path: str) -> model.Sharing:
        try:
            return sharing.parse_sharing(value, path)
        except strict.FieldError as err:
            raise self.error(err.path, err.message) from None

    def field(self, key: str, value: object, path: str) -> Any:
        if key == "sharing":
            return self.sharing(value, path)
        try:
            return _FIELDS[key](value)
        except model.InventoryError as err:
            raise self.error(path, str(err)) from None


# --- field converters: each returns the parsed value or raises InventoryError ---------------------


def _string(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise model.InventoryError(f"expected a non-empty string, got {strict.kind(value)}")
    model.StringValue(value)  # checks the API's length limit
    return value


def _name(value: object) -> str:
    if not isinstance(value, str) or not model.is_dns_label(value):
        raise model.InventoryError(f"{value!r} is not a DNS label (e.g. gpu-0)")
    return value


def _version(value: object) -> str:
    if not isinstance(value, str):
        # YAML reads 12.10 as the float 12.1: only a quoted string keeps every digit.
        raise model.InventoryError(
            f'expected a quoted version string such as "9.0", got {strict.kind(value)}'
        )
    return model.normalize_version(value)


def _optional_version(value: object) -> str | None:
    return None if value is None else _version(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise model.InventoryError(f"expected true or false, got {strict.kind(value)}")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise model.InventoryError(f"expected a whole number from 1 to {MAX_COUNT}, got {value!r}")
    return value


def _mig(value: object) -> mig.MigTable:
    table = mig.TABLES.get(value) if isinstance(value, str) else None
    if table is None:
        raise model.InventoryError(
            f"{value!r} is not a MIG table; known: {', '.join(sorted(mig.TABLES))}"
        )
    return table


def _pci_address(value: object) -> str:
    if not isinstance(value, str) or not _PCI_ADDRESS.fullmatch(value):
        raise model.InventoryError(f"{value!r} is not a PCI address like 0000:3b:00.0")
    return value


_FIELDS: dict[str, Callable[[object], Any]] = {
    "name": _name,
    "count": _count,
    "uuid": _string,
    "pciBusID": _pci_address,
    "memory": sharing.memory_quantity,
    "productName": _string,
    "brand": _string,
    "architecture": _string,
    "cudaComputeCapability": _version,
    "driverVersion": _version,
    "cudaDriverVersion": _optional_version,
    "migCapable": _bool,
    "healthy": _bool,
    "mig": _mig,
    "sharing": lambda value: value,  # parsed by _Parser.sharing, which names the nested field
}

"""The simulated profile: GPUs described per node in YAML, and its strict parsing.

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
``cudaDriverVersion: null`` leaves it out), migCapable, healthy, mig, migManagement, sharing,
pcieRoot, numaNode. UUIDs default to a value derived from node and device name, so a restarted
agent publishes the same ones.

``pcieRoot`` (``pci<domain>:<bus>``, e.g. ``pci0000:17``) and ``numaNode`` (a whole number from 0)
are optional and published as the nvml backend reads them from sysfs (``devices.pci``):
``resource.kubernetes.io/pcieRoot`` and ``resource.kubernetes.io/numaNode``, so a claim can ask
for a GPU beside a NIC (``matchAttribute``); left out, the attribute is not published.

``mig: <model>`` publishes the GPU MIG-partitioned (``devices.mig``): every MIG placement of
that model, consuming the GPU's counters, and not the whole GPU (a GPU in MIG mode). The models are
``devices.gpu_models``' (NVML's profiles, checked against NVIDIA's go-nvml mocks): A100-40GB,
A100-80GB, A30-24GB, H100-80GB, H200-141GB, B200-180GB. Such a GPU is ``migCapable``, and its
``memory`` must be the model's (40Gi, 80Gi, 24Gi, 80Gi, 141Gi, 180Gi); a partition publishes the
nominal memory of its profile's name (``1g.18gb`` -> 18Gi).

``sharing`` offers the GPU to several claims at once, each with a share of its memory
(``allowMultipleAllocations`` and a ``requestPolicy`` on ``memory``; Kubernetes 1.36+)::

    sharing:
      mode: TimeSlicing       # or MPS (each container gets a pinned-memory limit); default
                              # TimeSlicing
      memory: {default: 8Gi, min: 4Gi, step: 2Gi, max: 40Gi}   # default and min required

The values must be what the API server accepts for that GPU's memory (min and max within it,
default within [min, max], default and max min plus whole steps); a GPU with ``mig`` cannot
also be shared.

``migManagement: denied`` (with ``mig``) simulates an agent without MIG's privileges: NVML
answers ``NO_PERMISSION`` for that GPU's placements and instances, so the GPU publishes nothing,
is reported (``mig_refusals``), and creating or destroying an instance on it fails; the default
is ``allowed``.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from dra_gpu.devices import mig, model, pci, sharing, strict
from dra_gpu.resource import names

_Placement = mig.Placement  # Profile.mig (a field) hides the module inside the class
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.dra-gpu.io")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")  # as devices.pci reads it from sysfs
MAX_NUMA_NODE = 1023  # Linux's MAX_NUMNODES at its largest (NODES_SHIFT 10)
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
    mig_denied: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    """Node -> the GPUs of ``mig`` whose MIG management NVML refuses (``migManagement: denied``)."""

    def inventory(
        self, node: str, foreign: Mapping[str, tuple[_Placement, ...]] | None = None
    ) -> model.Inventory:
        """The node's devices; a node the profile does not list has none. ``foreign``: per
        GPU, the placements of instances the agent did not make."""
        denied = self.mig_denied.get(node, frozenset())
        tables = {
            name: dataclasses.replace(
                table,
                profiles=() if name in denied else table.profiles,
                foreign=(foreign or {}).get(name, ()),
            )
            for name, table in self.mig.get(node, {}).items()
        }
        return mig.partition_inventory(node, self.nodes.get(node, ()), tables)

    def mig_refusal(self, node: str, gpu: str, call: str) -> model.MigRefusal | None:
        """What NVML answers the agent for ``call`` on ``gpu`` (None: it may)."""
        if gpu not in self.mig_denied.get(node, frozenset()):
            return None
        device = next((d for d in self.nodes.get(node, ()) if d.name == gpu), None)
        uuid = device.uuid if device is not None else ""
        return model.MigRefusal(gpu, uuid, call, "Insufficient Permissions (simulated)")


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
    return Parser(source).profile(data)


class Parser:
    """Reads one file strictly; every error names the file and the field (``error``)."""

    def __init__(self, source: str, what: str = "profile") -> None:
        self.source = source
        self.what = what
        self.denied: dict[str, set[str]] = {}  # node -> GPUs with migManagement: denied

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
            if not isinstance(node, str) or not names.is_dns_subdomain(node):
                raise self.error(path, "a node name must be a DNS subdomain (e.g. node-01)")
            tables[node] = {}
            nodes[node] = self.node(node, spec, path, parsed_defaults, tables[node])
        denied = {node: frozenset(gpus) for node, gpus in self.denied.items()}
        return Profile(source=self.source, nodes=nodes, mig=tables, mig_denied=denied)

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
                if {**defaults, **fields}.get("migManagement") == "denied":
                    if table is None:
                        raise self.error(
                            f"{entry_path}.migManagement", "only a GPU with mig has MIG management"
                        )
                    self.denied.setdefault(node, set()).add(device.name)
        return tuple(devices)

    def device(self, node: str, index: int, fields: dict[str, Any], path: str) -> model.Device:
        values = {**_BUILTIN_DEFAULTS, **fields}
        name = values.get("name", f"gpu-{index}")
        try:
            device = model.gpu_device(
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
        topology: dict[str, model.AttributeValue] = {}
        if "pcieRoot" in values:
            topology[pci.PCIE_ROOT_ATTRIBUTE] = model.StringValue(values["pcieRoot"])
        if "numaNode" in values:
            topology[pci.NUMA_NODE_ATTRIBUTE] = model.IntValue(values["numaNode"])
        if not topology:
            return device
        return dataclasses.replace(device, attributes={**device.attributes, **topology})

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
    if not isinstance(value, str) or not names.is_dns_label(value):
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


def _mig_management(value: object) -> str:
    if value not in ("allowed", "denied"):
        raise model.InventoryError(f"expected allowed or denied, got {value!r}")
    return str(value)


def _pcie_root(value: object) -> str:
    if not isinstance(value, str) or not _PCIE_ROOT.fullmatch(value):
        raise model.InventoryError(f"{value!r} is not a PCIe root like pci0000:17")
    return value


def _numa_node(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NUMA_NODE:
        raise model.InventoryError(
            f"expected a whole number from 0 to {MAX_NUMA_NODE} (leave it out for a GPU "
            f"without NUMA affinity), got {value!r}"
        )
    return value


def _pci_address(value: object) -> str:
    if not isinstance(value, str) or not _PCI_ADDRESS.fullmatch(value):
        raise model.InventoryError(f"{value!r} is not a PCI address like 0000:3b:00.0")
    return value


_FIELDS: dict[str, Callable[[object], Any]] = {
    "name": _name,
    "count": _count,
    "uuid": _string,
    "pciBusID": _pci_address,
    "pcieRoot": _pcie_root,
    "numaNode": _numa_node,
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
    "migManagement": _mig_management,
    "sharing": lambda value: value,  # parsed by Parser.sharing, which names the nested field
}

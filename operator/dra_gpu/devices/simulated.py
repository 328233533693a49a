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

Simulated MIG instances (``model.MigInstances``): the GPU instances that exist now are the
"hardware" state of the simulated GPUs, kept in ``<hardware dir>/<node>-mig-instances.json``.
The agent gives a directory on the node's tmpfs (beside its CDI specs), so the table survives
an agent crash but not a reboot, as MIG instances do not survive a GPU reset. Creating one
checks what the hardware would (a placement of the GPU's model, no memory slice taken twice,
at most 7 compute slices, one media extension); its ``MIG-<uuid>`` is the partition device's.
Without a directory the table is kept in memory (tests). Instances in the table that the agent
did not make (written there by a test, as the GPU Operator's mig-manager would make them) are
someone else's: the placements that cannot be created beside them are not published.

``migManagement: denied`` (with ``mig``) simulates an agent without MIG's privileges: NVML
answers ``NO_PERMISSION`` for that GPU's placements and instances, so the GPU publishes nothing,
is reported (``mig_refusals``), and creating or destroying an instance on it fails; the default
is ``allowed``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dra_gpu.devices import edits, health, mig, model, pci, sharing, strict
from dra_gpu.resource import names

_R = TypeVar("_R")
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
        self._settings: dict[str, dict[str, str]] = {}  # sharing's GPU settings (settings_file)
        self._held: set[model.MigPlacement] = set()  # instances that are the agent's
        self._pending: set[str] = set()  # GPUs the faults file said lost or needing recovery

    @property
    def node_in_profile(self) -> bool:
        """Whether the profile lists this node at all (an unlisted node has zero devices)."""
        return self.node in self._profile.nodes

    async def inventory(self) -> model.Inventory:
        if self._path is not None:
            self._profile = await asyncio.to_thread(load_profile, self._path)
        if not self._profile.mig.get(self.node):
            return self._profile.inventory(self.node)
        present = await asyncio.to_thread(self._locked, lambda table: tuple(table))
        foreign: dict[str, list[mig.Placement]] = {}
        tables = self._profile.mig.get(self.node, {})
        for instance in present:
            table = tables.get(instance.placement.parent)
            if table is None or instance.placement in self._held:
                continue
            try:
                placement = mig.placement_in(table, instance.placement)
            except model.InventoryError:
                continue  # not one of the model's placements: nothing it could block
            foreign.setdefault(instance.placement.parent, []).append(placement)
        return self._profile.inventory(self.node, {k: tuple(v) for k, v in foreign.items()})

    async def container_edits(self, devices: Sequence[edits.GivenDevice]) -> edits.ClaimEdits:
        """Per device ``GPU_DEVICE_<position>=<device>``, so a container given several devices
        sees all of them (the tutorial's workloads print these to show which GPU they got); a
        MIG partition also names its MIG device: ``GPU_DEVICE_<position>_MIG=MIG-<uuid>``. For
        the claim, ``NVIDIA_VISIBLE_DEVICES=<uuid>,...`` as the nvml backend writes it. No
        device nodes: a simulated GPU has none, and CDI fails a container whose node is missing.
        """
        per_device = []
        for position, given in enumerate(devices):
            device = given.device
            env = {f"GPU_DEVICE_{position}": device.name}
            if device.partition_of is not None:
                env[f"GPU_DEVICE_{position}_MIG"] = device.uuid
            per_device.append(edits.Edits(env))
        return edits.ClaimEdits(edits.Edits(edits.visible_devices_env(devices)), tuple(per_device))

    # ---- GPU settings for sharing (agent.mps.GpuControls) ------------------------------------

    @property
    def settings_file(self) -> Path | None:
        """The simulated GPUs' compute mode and time-slice, as sharing set them (JSON: device ->
        ``{"computeMode": ..., "timeSlice": ...}``); in the hardware dir, so gone in a reboot."""
        if self.hardware_dir is None:
            return None
        return self.hardware_dir / f"{self.node}-gpu-settings.json"

    async def set_compute_mode(self, device: str, uuid: str, exclusive: bool) -> None:
        mode = "EXCLUSIVE_PROCESS" if exclusive else "DEFAULT"
        await asyncio.to_thread(self._set_setting, device, "computeMode", mode)

    async def set_time_slice(self, device: str, uuid: str, time_slice: str) -> None:
        await asyncio.to_thread(self._set_setting, device, "timeSlice", time_slice)

    def _set_setting(self, device: str, key: str, value: str) -> None:
        with self._hardware_lock:
            self._settings.setdefault(device, {})[key] = value
            path = self.settings_file
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                temp = path.with_name(f".{path.name}.tmp")
                temp.write_text(json.dumps(self._settings, sort_keys=True))
                temp.replace(path)

    # ---- MIG instances (model.MigInstances) ------------------------------------------------

    @property
    def instances_file(self) -> Path | None:
        if self.hardware_dir is None:
            return None
        return self.hardware_dir / f"{self.node}-mig-instances.json"

    async def mig_instances(self) -> tuple[model.MigInstance, ...]:
        table = await asyncio.to_thread(self._locked, lambda table: tuple(table))
        listed = "nvmlDeviceGetGpuInstances"
        refused = self._profile.mig_refusal
        return tuple(i for i in table if refused(self.node, i.placement.parent, listed) is None)

    def adopt_mig_instances(self, placements: Collection[model.MigPlacement]) -> None:
        self._held = set(placements)

    def mig_refusals(self) -> tuple[model.MigRefusal, ...]:
        call = "nvmlDeviceGetGpuInstancePossiblePlacements"
        found = (
            self._profile.mig_refusal(self.node, gpu, call)
            for gpu in sorted(self._profile.mig.get(self.node, {}))
        )
        return tuple(r for r in found if r is not None)

    async def create_mig_instance(self, placement: model.MigPlacement) -> model.MigInstance:
        self._refuse(placement.parent, "nvmlDeviceCreateGpuInstanceWithPlacement")
        created = await asyncio.to_thread(self._locked, lambda t: self._create(t, placement))
        self._held.add(placement)
        return created

    async def destroy_mig_instance(self, instance: model.MigInstance) -> None:
        self._refuse(instance.placement.parent, "nvmlGpuInstanceDestroy")

        def destroy(table: list[model.MigInstance]) -> None:
            table[:] = [
                i
                for i in table
                if (i.placement, i.gpu_instance) != (instance.placement, instance.gpu_instance)
            ]

        await asyncio.to_thread(self._locked, destroy)
        self._held.discard(instance.placement)

    def _refuse(self, gpu: str, call: str) -> None:
        refusal = self._profile.mig_refusal(self.node, gpu, call)
        if refusal is not None:
            raise model.InventoryError(f"node {self.node}: {refusal}")

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

    async def faults(self) -> tuple[health.Fault | health.Reset, ...]:
        """What the faults file lists now (nothing without one), and a ``Reset`` for each GPU
        whose ``lost`` or ``recovery`` entry went away since the last call (as NVML's answers
        come back); a bad file raises ``ProfileError`` naming file and field."""
        if self.faults_file is None:
            return ()
        faults = await asyncio.to_thread(
            load_faults, self.faults_file, self.xids, self._partition_at
        )
        pending = {f.device for f in faults if f.cause in ("lost", "recovery")}
        resets = [
            health.Reset(device, f"the {device} entry of the faults file is gone (simulated reset)")
            for device in sorted(self._pending - pending)
        ]
        self._pending = pending
        return (*faults, *resets)

    def _partition_at(self, gpu: str, gpu_instance: int) -> str | None:
        """(In a thread.) The partition device of ``gpu`` whose simulated MIG instance is GPU
        instance ``gpu_instance``; None if there is none."""
        placements = {
            i.placement
            for i in self._locked(lambda table: tuple(table))
            if i.placement.parent == gpu and i.gpu_instance == gpu_instance
        }
        for device in self._profile.inventory(self.node).devices:
            if mig.placement_of(device) in placements:
                return device.name
        return None

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


def load_faults(
    path: Path,
    xids: health.XidPolicy,
    partition_at: Callable[[str, int], str | None] | None = None,
) -> tuple[health.Fault, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as err:
        raise model.ProfileError(f"faults file {path}: cannot be read: {err}") from None
    return parse_faults(text, xids, source=str(path), partition_at=partition_at)


_FAULT_FIELDS = {"xid", "gpuInstance", "ecc", "lost", "recovery"}


def parse_faults(
    text: str,
    xids: health.XidPolicy,
    source: str = "<string>",
    partition_at: Callable[[str, int], str | None] | None = None,
) -> tuple[health.Fault, ...]:
    """The faults a faults file lists, as NVML would report them::

        gpu-0: {xid: 48}                  # an XID, GPU-wide (a MIG-mode GPU: every partition)
        gpu-1: {xid: 94, gpuInstance: 2}  # an XID of MIG GPU instance 2 (its partition only)
        gpu-2: {ecc: double-bit}
        gpu-3: {lost: true}               # the GPU answers GPU_IS_LOST
        gpu-4: {recovery: gpu-reset}      # NVML's recovery action (one of RECOVERY_ACTIONS)

    XIDs are classified by ``xids`` (those that taint nothing give no fault). ``partition_at``
    maps (GPU, GPU instance id) to the partition device of that instance; without one, or an
    instance without a partition, the XID is the whole GPU's, as the nvml backend does."""
    try:
        data = yaml.load(text, Loader=strict.StrictLoader)
    except yaml.YAMLError as err:
        raise model.ProfileError(f"faults file {source}: not valid YAML: {err}") from None
    parser = _Parser(source, what="faults file")
    faults: list[health.Fault] = []
    for device, spec in parser.mapping(data, "", None).items():
        if not isinstance(device, str) or not names.is_dns_label(device):
            raise parser.error(str(device), "a device name must be a DNS label (e.g. gpu-0)")
        entries = parser.mapping(spec, device, _FAULT_FIELDS)
        if not entries.keys() - {"gpuInstance"}:
            raise parser.error(device, "expected one of xid, ecc, lost, recovery")
        instance = entries.get("gpuInstance")
        if instance is not None and (
            isinstance(instance, bool) or not isinstance(instance, int) or instance < 0
        ):
            raise parser.error(
                f"{device}.gpuInstance", f"expected a GPU instance id, got {instance!r}"
            )
        if instance is not None and "xid" not in entries:
            raise parser.error(f"{device}.gpuInstance", "only an xid is scoped to a GPU instance")
        for cause, value in entries.items():
            path = f"{device}.{cause}"
            if cause == "gpuInstance":
                continue
            if cause == "xid":
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise parser.error(path, f"expected an XID (a positive number), got {value!r}")
                target, message = device, f"XID {value} (simulated)"
                if instance is not None:
                    message = f"XID {value} (simulated, GPU instance {instance})"
                    partition = partition_at(device, instance) if partition_at else None
                    if partition is None:
                        message += ", which no partition is published for: the whole GPU is tainted"
                    else:
                        target = partition
                fault = xids.fault(target, value, message)
                if fault is not None:
                    faults.append(fault)
            elif cause == "ecc":
                if value != "double-bit":
                    raise parser.error(path, f"expected double-bit, got {value!r}")
                faults.append(xids.ecc_fault(device, "double-bit ECC error (simulated)"))
            elif cause == "recovery":
                actions = tuple(health.RECOVERY_ACTIONS.values())
                if value not in actions:
                    raise parser.error(path, f"expected one of {', '.join(actions)}, got {value!r}")
                faults.append(
                    xids.recovery_fault(device, value, f"recovery action {value} (simulated)")
                )
            elif value is not True:
                raise parser.error(path, f"expected true, got {value!r}")
            else:
                faults.append(xids.lost_fault(device, "the GPU is lost (simulated)"))
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
    "sharing": lambda value: value,  # parsed by _Parser.sharing, which names the nested field
}

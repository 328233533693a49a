"""The simulated backend: one node's GPUs served from a profile, for clusters without GPUs.

Owns what a simulated GPU's "hardware" holds and the backend protocol over a profile
(``simulated.profile``): the node's inventory (from a parsed profile, as the agent gives it:
read once at start, so a running agent keeps its configuration until its pod is replaced; or
from a file re-read on every call, for tests and demos that edit it); the container edits of
a claim; the faults the faults file lists (``simulated.faults``); the GPU settings sharing
sets; and the MIG instances. It never talks to Kubernetes.

Simulated MIG instances (``model.MigInstances``): the GPU instances that exist now are the
"hardware" state of the simulated GPUs, kept in ``<hardware dir>/<node>-mig-instances.json``.
The agent gives a directory on the node's tmpfs (beside its CDI specs), so the table survives
an agent crash but not a reboot, as MIG instances do not survive a GPU reset. Creating one
checks what the hardware would (a placement of the GPU's model, no memory slice taken twice,
at most 7 compute slices, one media extension); its ``MIG-<uuid>`` is the partition device's.
Without a directory the table is kept in memory (tests). Instances in the table that the agent
did not make (written there by a test, as the GPU Operator's mig-manager would make them) are
someone else's: the placements that cannot be created beside them are not published.

A GPU with ``migManagement: denied`` answers as NVML does an agent without MIG's privileges: it
publishes nothing, is reported (``mig_refusals``), and creating or destroying an instance on it
fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar

from dra_gpu.devices import edits, health, mig, model
from dra_gpu.devices.simulated.faults import load_faults
from dra_gpu.devices.simulated.profile import Profile, load_profile

_R = TypeVar("_R")


class SimulatedBackend:
    """Serves one node's devices from a profile.

    Given a parsed ``Profile`` (what the agent passes, ``runner.make_backend``), that one is
    served for the backend's life. Given a path, the file is parsed here and read again, off
    the event loop, on every ``inventory()`` (tests that edit it add or remove GPUs); a file
    that turns bad later raises ``ProfileError`` from there.
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

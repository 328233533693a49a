"""MIG instances on the node's GPUs, made and unmade through NVML (``model.MigInstances``).

A GPU whose current MIG mode is on is published partitioned (``devices.mig``): its GPU instance
profiles and their possible placements are read from NVML
(``nvmlDeviceGetGpuInstanceProfileInfo``, ``nvmlDeviceGetGpuInstancePossiblePlacements``), each
partition's memory as NVML reports it. The backend has the ``model.MigInstances`` capability:
it creates a GPU instance at a placement with one compute instance spanning it, names it by its
MIG device's UUID, lists the GPU instances of every profile, and destroys them. Instances the
agent did not make (``adopt_mig_instances`` names the ones its checkpoint records) are someone
else's: the placements that cannot be created beside them are not published. Listing placements
and instances, creating and destroying them need a privileged caller (``nvml.h``: "Requires
privileged user"); a GPU whose calls answer ``NO_PERMISSION`` publishes no partition and is
reported (``mig_refusals``) naming the call and the chart value that grants the privileges, and
every other GPU is published as usual.

Owns the MIG calls, the GPU's MIG table as NVML tells it, and which instances are the agent's.
Must not: change a GPU's MIG mode, or read the rest of a GPU (``nvml.backend``).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Collection
from typing import Any

from dra_gpu.devices import mig, model
from dra_gpu.devices.nvml import session

# nvmlComputeInstanceProfile (NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE) by compute slices: the
# compute instance that spans a GPU instance of that many slices. ABI values from nvml.h.
_COMPUTE_PROFILE_OF_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_MAX_LISTED = 32
"""Room for the placements of one profile, or its GPU instances (a GPU has 8 memory slices)."""
_GONE = ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
"""Answers meaning "no such instance" to a lookup by id."""


class MigManagement(session.Session):
    """The MIG instances of the node's GPUs in MIG mode, and the GPUs that refuse to have theirs
    managed (no privileges)."""

    def __init__(self, node: str, nvml: session.NvmlApi | None = None) -> None:
        super().__init__(node, nvml)
        self._mig_refused: dict[int, model.MigRefusal] = {}  # MIG-mode GPUs refusing us
        self._mig_held: set[model.MigPlacement] = set()  # instances that are the agent's

    async def mig_instances(self) -> tuple[model.MigInstance, ...]:
        return await asyncio.to_thread(self._mig_instances_blocking)

    async def create_mig_instance(self, placement: model.MigPlacement) -> model.MigInstance:
        return await asyncio.to_thread(self._create_blocking, placement)

    async def destroy_mig_instance(self, instance: model.MigInstance) -> None:
        await asyncio.to_thread(self._destroy_blocking, instance)

    def adopt_mig_instances(self, placements: Collection[model.MigPlacement]) -> None:
        # Replaced whole (no lock on the event loop): called at start, before any prepare.
        self._mig_held = set(placements)

    def mig_refusals(self) -> tuple[model.MigRefusal, ...]:
        return tuple(self._mig_refused[i] for i in sorted(self._mig_refused))

    def _mig_table(
        self, index: int, handle: Any, uuid: str, product_name: str, memory_bytes: int
    ) -> mig.MigTable:
        """The MIG table of GPU ``index`` in MIG mode: its profiles and placements, and the
        placements of instances that are not the agent's. Without the privileges to read them,
        a table without profiles (nothing published), and the refusal kept and logged once."""
        try:
            profiles = self._mig_profiles(index, handle)
            present = self._instances_of(index, handle, profiles)
        except model.InventoryError as err:
            refusal = self._refusal(index, uuid, err)
            if refusal is None:
                raise
            self._log_once(logging.WARNING, str(refusal))
            return mig.MigTable(product_name, memory_bytes // 2**30, ())
        self._mig_refused.pop(index, None)
        foreign = tuple(
            mig.Placement(profiles[i.placement.profile][1], i.placement.start)
            for i in present
            if i.placement not in self._mig_held
        )
        return mig.MigTable(
            product_name,
            memory_bytes // 2**30,
            tuple(profile for _, profile in profiles.values()),
            foreign=foreign,
        )

    def _refusal(self, index: int, uuid: str, err: model.InventoryError) -> model.MigRefusal | None:
        """The refusal ``err`` is (an NVML call answered ``NO_PERMISSION``), now kept for
        ``mig_refusals``; None for any other error."""
        if (
            not isinstance(err, session.NvmlCallFailed)
            or err.code != self._nvml.NVML_ERROR_NO_PERMISSION
        ):
            return None
        refusal = model.MigRefusal(f"gpu-{index}", uuid, err.call, str(err.__cause__))
        self._mig_refused[index] = refusal
        return refusal

    def _uuid_of(self, index: int, handle: Any) -> str:
        try:
            return session.as_text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return ""

    def _mig_profiles(self, index: int, handle: Any) -> dict[str, tuple[int, mig.MigProfile]]:
        """The GPU instance profiles of a GPU in MIG mode, by name: NVML's profile id and the
        profile with its possible placements."""
        nvml = self._nvml
        found: dict[str, tuple[int, mig.MigProfile]] = {}
        for profile_id in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
            except nvml.NVMLError as err:
                if session.error_code(err) in (
                    nvml.NVML_ERROR_NOT_SUPPORTED,
                    nvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    continue  # a profile this GPU does not have
                raise self._error("nvmlDeviceGetGpuInstanceProfileInfo", index, err) from err
            if info.instanceCount == 0:
                continue
            placements = (nvml.c_nvmlGpuInstancePlacement_t * _MAX_LISTED)()
            count = ctypes.c_uint(0)
            self._nv(
                "nvmlDeviceGetGpuInstancePossiblePlacements",
                index,
                handle,
                info.id,
                placements,
                ctypes.byref(count),
            )
            if count.value == 0:
                continue
            name = session.as_text(info.name).removeprefix("MIG ").strip()
            found[name] = (
                info.id,
                mig.MigProfile(
                    name,
                    memory_gib=-(-info.memorySizeMB // 1024),
                    memory_slices=placements[0].size,
                    compute_slices=info.sliceCount,
                    starts=tuple(placements[i].start for i in range(count.value)),
                    media_extensions="+me" in name,
                    memory_mib=info.memorySizeMB,
                ),
            )
        return found

    def _mig_gpu(self, parent: str) -> tuple[int, Any]:
        index_text = parent.removeprefix("gpu-")
        if not index_text.isdigit():
            raise model.InventoryError(f"node {self.node}: {parent} is not an NVML GPU name")
        index = int(index_text)
        return index, self._nv("nvmlDeviceGetHandleByIndex", index, index)

    def _mig_devices(self, index: int, handle: Any) -> dict[tuple[int, int], str]:
        """(GPU instance id, compute instance id) -> MIG device UUID, for every MIG device."""
        nvml = self._nvml
        found: dict[tuple[int, int], str] = {}
        most = self._nv("nvmlDeviceGetMaxMigDeviceCount", index, handle)
        for slot in range(most):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError as err:
                if session.error_code(err) in (
                    nvml.NVML_ERROR_NOT_FOUND,
                    nvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    continue
                raise self._error("nvmlDeviceGetMigDeviceHandleByIndex", index, err) from err
            ids = (
                self._nv("nvmlDeviceGetGpuInstanceId", index, device),
                self._nv("nvmlDeviceGetComputeInstanceId", index, device),
            )
            found[ids] = session.as_text(self._nv("nvmlDeviceGetUUID", index, device))
        return found

    def _instances_of(
        self,
        index: int,
        handle: Any,
        profiles: dict[str, tuple[int, mig.MigProfile]] | None = None,
    ) -> list[model.MigInstance]:
        nvml = self._nvml
        mig_devices = self._mig_devices(index, handle)
        instances: list[model.MigInstance] = []
        if profiles is None:
            profiles = self._mig_profiles(index, handle)
        for name, (profile_id, _) in profiles.items():
            handles = (nvml.c_nvmlGpuInstance_t * _MAX_LISTED)()
            count = ctypes.c_uint(0)
            self._nv(
                "nvmlDeviceGetGpuInstances",
                index,
                handle,
                profile_id,
                handles,
                ctypes.byref(count),
            )
            for k in range(count.value):
                info = self._nv("nvmlGpuInstanceGetInfo", index, handles[k])
                computes = sorted((c, u) for (g, c), u in mig_devices.items() if g == info.id)
                compute, uuid = computes[0] if computes else (None, "")
                placement = model.MigPlacement(f"gpu-{index}", name, info.placement.start)
                instances.append(model.MigInstance(placement, info.id, compute, uuid))
        return instances

    def _mig_instances_blocking(self) -> tuple[model.MigInstance, ...]:
        nvml = self._nvml
        found: list[model.MigInstance] = []
        with self._lock:
            self._init_locked()
            for index in range(self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount)):
                handle = self._nv("nvmlDeviceGetHandleByIndex", index, index)
                mode = self._optional(
                    "nvmlDeviceGetMigMode", index, nvml.nvmlDeviceGetMigMode, handle
                )
                if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
                    continue
                try:
                    found.extend(self._instances_of(index, handle))
                except model.InventoryError as err:
                    # Not ours to list, so not ours to touch: the rest of the node goes on.
                    refusal = self._refusal(index, self._uuid_of(index, handle), err)
                    if refusal is None:
                        raise
                    self._log_once(logging.WARNING, str(refusal))
        return tuple(found)

    def _create_blocking(self, placement: model.MigPlacement) -> model.MigInstance:
        with self._lock:
            self._init_locked()
            index, handle = self._mig_gpu(placement.parent)
            try:
                created = self._create_locked(index, handle, placement)
            except model.InventoryError as err:
                refusal = self._refusal(index, self._uuid_of(index, handle), err)
                if refusal is None:
                    raise
                raise model.InventoryError(f"{self._where(index)}: {refusal}") from None
            self._mig_held.add(placement)
            return created

    def _create_locked(
        self, index: int, handle: Any, placement: model.MigPlacement
    ) -> model.MigInstance:
        nvml = self._nvml
        for existing in self._instances_of(index, handle):
            if existing.placement == placement and existing.compute_instance is not None:
                return existing  # a retried call
            if existing.placement == placement:  # half made: start again
                self._destroy_locked(existing)
        profiles = self._mig_profiles(index, handle)
        if placement.profile not in profiles:
            raise model.InventoryError(
                f"{self._where(index)}: no MIG profile {placement.profile} "
                f"(it has {', '.join(sorted(profiles)) or 'none: is MIG mode on?'})"
            )
        profile_id, profile = profiles[placement.profile]
        where = nvml.c_nvmlGpuInstancePlacement_t()
        where.start = placement.start
        where.size = profile.memory_slices
        gpu_instance = self._nv(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            index,
            handle,
            profile_id,
            ctypes.byref(where),
        )
        try:
            compute_profile = self._nv(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                index,
                gpu_instance,
                _COMPUTE_PROFILE_OF_SLICES[profile.compute_slices],
                nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            compute = self._nv(
                "nvmlGpuInstanceCreateComputeInstance",
                index,
                gpu_instance,
                compute_profile.id,
            )
        except Exception:
            self._nv("nvmlGpuInstanceDestroy", index, gpu_instance)
            raise
        gi = self._nv("nvmlGpuInstanceGetInfo", index, gpu_instance)
        ci = self._nv("nvmlComputeInstanceGetInfo", index, compute)
        uuid = self._mig_devices(index, handle).get((gi.id, ci.id))
        if uuid is None:
            raise model.InventoryError(
                f"{self._where(index)}: the MIG device of GPU instance {gi.id}, compute "
                f"instance {ci.id} did not appear"
            )
        return model.MigInstance(placement, gi.id, ci.id, uuid)

    def _destroy_blocking(self, instance: model.MigInstance) -> None:
        with self._lock:
            self._init_locked()
            try:
                self._destroy_locked(instance)
            except model.InventoryError as err:
                index, handle = self._mig_gpu(instance.placement.parent)
                refusal = self._refusal(index, self._uuid_of(index, handle), err)
                if refusal is None:
                    raise
                raise model.InventoryError(f"{self._where(index)}: {refusal}") from None
            self._mig_held.discard(instance.placement)

    def _destroy_locked(self, instance: model.MigInstance) -> None:
        nvml = self._nvml
        index, handle = self._mig_gpu(instance.placement.parent)
        gone = tuple(getattr(nvml, name) for name in _GONE)
        try:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, instance.gpu_instance)
        except nvml.NVMLError as err:
            if session.error_code(err) in gone:
                return
            raise self._error("nvmlDeviceGetGpuInstanceById", index, err) from err
        info = self._nv("nvmlGpuInstanceGetInfo", index, gpu_instance)
        if info.placement.start != instance.placement.start:
            return  # the id was given to another instance since: ours is gone
        if instance.compute_instance is not None:
            try:
                compute = nvml.nvmlGpuInstanceGetComputeInstanceById(
                    gpu_instance, instance.compute_instance
                )
            except nvml.NVMLError as err:
                if session.error_code(err) not in gone:
                    raise self._error("nvmlGpuInstanceGetComputeInstanceById", index, err) from err
            else:
                self._nv("nvmlComputeInstanceDestroy", index, compute)
        self._nv("nvmlGpuInstanceDestroy", index, gpu_instance)

"""The NVML backend: the node's real GPUs, read through pynvml.

This module owns the translation from NVML's answers (enums, byte counts, driver version
strings, PCI addresses) into the inventory model. Every NVML call is blocking, so all of them
run in a worker thread and never on the event loop that answers the kubelet. An NVML failure
is never turned into "no GPUs": it raises ``InventoryError`` naming the call and the GPU, because
an empty inventory would publish an empty pool and the user would only see "cannot allocate".
"Not supported" is an answer, not a failure, for the few properties that are optional.

Health: once ``faults()`` is first called, a daemon thread (``nvml-events``) waits on an NVML
event set for critical XIDs and double-bit ECC errors on every GPU (what each GPU supports) and
queues them as ``health.Fault``s, classified by the XID policy; ``faults()`` drains that queue and
polls what has no event: a GPU that answers ``GPU_IS_LOST`` is a ``lost`` fault for as long as it
does. The thread wakes at least once a second, so ``aclose()`` ends it before shutting NVML down.

MIG: a GPU whose current MIG mode is on is published partitioned (``devices.mig``): its GPU
instance profiles and their possible placements are read from NVML
(``nvmlDeviceGetGpuInstanceProfileInfo``, ``nvmlDeviceGetGpuInstancePossiblePlacements``), each
partition's memory as NVML reports it. The backend has the ``model.MigInstances`` capability:
it creates a GPU instance at a placement with one compute instance spanning it, names it by its
MIG device's UUID, lists the GPU instances of every profile, and destroys them. The agent owns
the MIG configuration of GPUs in MIG mode: instances it did not create are destroyed at start.

Sharing: the GPUs the agent's ``--shared-gpus`` setting names (``devices.sharing``) are offered
to several claims at once, each with a memory share, exactly as a simulated GPU with ``sharing``
is: the policy is checked against the memory NVML reports, and a policy that does not fit is an
``InventoryError`` naming the GPU, the setting and the field. A named GPU in MIG mode is published
MIG-partitioned and not shared, logged once: MIG mode is the hardware's state (it changes with
``nvidia-smi -mig`` and a GPU reset), and failing the whole inventory for it would stop every
other GPU of the node from being published. Names no GPU here has are logged once and passed
over (one setting serves all nodes).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import importlib
import logging
import re
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from dra_gpu.devices import health, mig, model, sharing

_T = TypeVar("_T")
log = logging.getLogger(__name__)
EVENT_WAIT_MS = 1000
"""How long one nvmlEventSetWait_v2 blocks: the longest ``aclose()`` waits for the thread."""
MAX_QUEUED_FAULTS = 1024
"""Faults kept between two ``faults()`` calls; older ones are dropped (a storm of one XID)."""

# Values of nvmlBrandType_t and nvmlDeviceArchitecture_t from nvml.h; they are ABI and stable.
_BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA vApps",
    8: "NVIDIA VPC",
    9: "NVIDIA VCS",
    10: "NVIDIA VWS",
    11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
    17: "NVIDIA DLA",
    18: "NVIDIA vGameDev",
    19: "NVIDIA NPU",
}
_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
# nvmlComputeInstanceProfile (NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE) by compute slices: the
# compute instance that spans a GPU instance of that many slices. ABI values from nvml.h.
_COMPUTE_PROFILE_OF_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_MAX_LISTED = 32
"""Room for the placements of one profile, or its GPU instances (a GPU has 8 memory slices)."""
_GONE = ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
"""Answers meaning "no such instance" to a lookup by id."""
_BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


class NvmlApi(Protocol):
    """The parts of the pynvml module this backend uses (tests pass a fake with the same names)."""

    @property
    def NVMLError(self) -> type[Exception]: ...  # read-only: a module's subclass fits
    @property
    def NVML_ERROR_NOT_SUPPORTED(self) -> int: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetBrand(self, handle: Any) -> int: ...
    def nvmlDeviceGetArchitecture(self, device: Any) -> int: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any: ...
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...

    # Health events (nvml.h: nvmlEventSet*, nvmlDeviceRegisterEvents).
    @property
    def NVML_ERROR_TIMEOUT(self) -> int: ...
    @property
    def NVML_ERROR_GPU_IS_LOST(self) -> int: ...
    @property
    def nvmlEventTypeXidCriticalError(self) -> int: ...
    @property
    def nvmlEventTypeDoubleBitEccError(self) -> int: ...

    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...

    # MIG (nvml.h: GPU instances, compute instances, MIG device handles).
    @property
    def NVML_ERROR_NOT_FOUND(self) -> int: ...
    @property
    def NVML_ERROR_INVALID_ARGUMENT(self) -> int: ...
    @property
    def NVML_DEVICE_MIG_ENABLE(self) -> int: ...
    @property
    def NVML_GPU_INSTANCE_PROFILE_COUNT(self) -> int: ...
    @property
    def NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED(self) -> int: ...
    @property
    def c_nvmlGpuInstancePlacement_t(self) -> type[Any]: ...
    @property
    def c_nvmlGpuInstance_t(self) -> type[Any]: ...

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any: ...
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int: ...
    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any: ...
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any: ...
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any: ...
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any: ...
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> None: ...
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> None: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int: ...


class NvmlBackend:
    """Reads the node's GPUs; use ``async with`` or call ``aclose()`` to shut NVML down.

    NVML is initialised once, on the first ``inventory()``; a failed initialisation is retried
    on the next call. GPUs are named ``gpu-<NVML index>``.
    """

    def __init__(
        self,
        node: str,
        nvml: NvmlApi | None = None,
        *,
        xids: health.XidPolicy | None = None,
        shared_gpus: sharing.SharedGpus | None = None,
    ) -> None:
        self.node = node
        self.xids = xids or health.XidPolicy()
        self.shared_gpus = shared_gpus or sharing.SharedGpus()
        self._logged: set[str] = set()  # notes on the setting, each logged once
        # Imported here, not at module load: a node without the NVIDIA driver can still import
        # the package and run the simulated backend.
        self._nvml = nvml if nvml is not None else cast(NvmlApi, importlib.import_module("pynvml"))
        self._lock = threading.Lock()  # overlapping inventory() calls run in different threads
        self._initialised = False
        self._events: collections.deque[health.Fault] = collections.deque(maxlen=MAX_QUEUED_FAULTS)
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        self._watching = threading.Event()  # set once the event set is registered (tests wait)

    async def inventory(self) -> model.Inventory:
        return await asyncio.to_thread(self._read_blocking)

    def container_env(self, position: int, device: model.Device) -> dict[str, str]:
        """``NVIDIA_VISIBLE_DEVICES=<uuid>``, which the NVIDIA container runtime reads.

        Every device sets the same variable, so a container given two GPUs of one claim keeps
        only one value; several GPUs per container need device nodes in the spec, not this
        variable."""
        return {"NVIDIA_VISIBLE_DEVICES": device.uuid}

    async def aclose(self) -> None:
        await asyncio.to_thread(self._shutdown_blocking)

    async def __aenter__(self) -> NvmlBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def faults(self) -> tuple[health.Fault, ...]:
        return await asyncio.to_thread(self._faults_blocking)

    def _faults_blocking(self) -> tuple[health.Fault, ...]:
        nvml = self._nvml
        lost: list[health.Fault] = []
        with self._lock:
            self._init_locked()
            if self._watcher is None or not self._watcher.is_alive():
                self._stop_watching.clear()
                self._watcher = threading.Thread(
                    target=self._watch_blocking, name="nvml-events", daemon=True
                )
                self._watcher.start()
            count = self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount)
            for index in range(count):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    nvml.nvmlDeviceGetUUID(handle)
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                        lost.append(health.lost_fault(f"gpu-{index}", f"NVML: {err}"))
                    else:
                        log.warning("%s: polling its health failed: %s", self._where(index), err)
        queued: list[health.Fault] = []
        while self._events:
            queued.append(self._events.popleft())
        return (*queued, *lost)

    def _watch_blocking(self) -> None:
        """The event thread: register every GPU, then wait for events until told to stop."""
        nvml = self._nvml
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.error("node %s: NVML events unavailable (no XID or ECC taints): %s", self.node, err)
            return
        try:
            names: dict[str, str] = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                names[_text(nvml.nvmlDeviceGetUUID(handle))] = f"gpu-{index}"
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted
                if supported:
                    nvml.nvmlDeviceRegisterEvents(handle, supported, event_set)
                else:
                    log.warning("%s: reports no XID or ECC events", self._where(index))
            self._watching.set()
            while not self._stop_watching.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                        log.warning("node %s: waiting for NVML events failed: %s", self.node, err)
                        self._stop_watching.wait(EVENT_WAIT_MS / 1000)
                    continue
                fault = self._fault_of(data, names)
                if fault is not None:
                    log.warning("node %s: %s: %s", self.node, fault.device, fault.message)
                    self._events.append(fault)
        except nvml.NVMLError as err:
            log.error("node %s: watching NVML events failed: %s", self.node, err)
        finally:
            self._watching.clear()
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as err:
                log.warning("node %s: freeing the NVML event set failed: %s", self.node, err)

    def _fault_of(self, data: Any, names: dict[str, str]) -> health.Fault | None:
        nvml = self._nvml
        try:
            name = names.get(_text(nvml.nvmlDeviceGetUUID(data.device)))
        except nvml.NVMLError:
            name = None  # a lost GPU no longer says who it is; the lost poll names it
        if name is None:
            log.warning("node %s: an NVML event for an unknown GPU: %r", self.node, data)
            return None
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return self.xids.fault(name, int(data.eventData), f"XID {data.eventData} (NVML)")
        if data.eventType & nvml.nvmlEventTypeDoubleBitEccError:
            return health.ecc_fault(name, "double-bit ECC error (NVML)")
        return None

    def _shutdown_blocking(self) -> None:
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2 * EVENT_WAIT_MS / 1000)
            self._watcher = None
        with self._lock:
            if self._initialised:
                self._initialised = False
                self._call("nvmlShutdown", None, self._nvml.nvmlShutdown)

    def _init_locked(self) -> None:
        if not self._initialised:
            self._call("nvmlInit", None, self._nvml.nvmlInit)
            self._initialised = True

    def _read_blocking(self) -> model.Inventory:
        nvml = self._nvml
        tables: dict[str, mig.MigTable] = {}
        with self._lock:
            self._init_locked()
            driver = _text(
                self._call("nvmlSystemGetDriverVersion", None, nvml.nvmlSystemGetDriverVersion)
            )
            cuda = self._optional(
                "nvmlSystemGetCudaDriverVersion_v2", None, nvml.nvmlSystemGetCudaDriverVersion_v2
            )
            count = self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount)
            devices = tuple(self._read_gpu(index, driver, cuda, tables) for index in range(count))
        for name in self.shared_gpus.absent(dict(enumerate(d.uuid for d in devices))):
            self._log_once(
                logging.INFO, f"{self.shared_gpus.source}: {name} is not on this node: passed over"
            )
        try:
            return mig.partition_inventory(self.node, devices, tables)
        except model.InventoryError as err:
            raise model.InventoryError(f"node {self.node}: MIG partitions: {err}") from None

    def _read_gpu(
        self, index: int, driver: str, cuda: int | None, tables: dict[str, mig.MigTable]
    ) -> model.Device:
        nvml = self._nvml
        handle = self._call(
            "nvmlDeviceGetHandleByIndex", index, nvml.nvmlDeviceGetHandleByIndex, index
        )

        def call(name: str, fn: Callable[[Any], _T]) -> _T:
            return self._call(name, index, fn, handle)

        uuid = _text(call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID))
        product_name = _text(call("nvmlDeviceGetName", nvml.nvmlDeviceGetName))
        brand = call("nvmlDeviceGetBrand", nvml.nvmlDeviceGetBrand)
        architecture = self._optional(
            "nvmlDeviceGetArchitecture", index, nvml.nvmlDeviceGetArchitecture, handle
        )
        major, minor = call(
            "nvmlDeviceGetCudaComputeCapability", nvml.nvmlDeviceGetCudaComputeCapability
        )
        bus_id = _text(call("nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo).busId)
        memory_bytes = call("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo).total
        # MIG mode is "not supported" on GPUs without MIG: that is the answer "not capable".
        mig_mode = self._optional("nvmlDeviceGetMigMode", index, nvml.nvmlDeviceGetMigMode, handle)
        mig_on = mig_mode is not None and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if mig_on:
            profiles = self._mig_profiles(index, handle)
            tables[f"gpu-{index}"] = mig.MigTable(
                product_name,
                memory_bytes // 2**30,
                tuple(profile for _, profile in profiles.values()),
            )
        try:
            device = model.gpu_device(
                index=index,
                uuid=uuid,
                memory=model.format_bytes(memory_bytes),
                product_name=product_name,
                brand=_BRANDS.get(brand, "Unknown"),
                architecture=_ARCHITECTURES.get(architecture or 0, "Unknown"),
                cuda_compute_capability=f"{major}.{minor}",
                driver_version=driver,
                cuda_driver_version=None if cuda is None else cuda_version(cuda),
                mig_capable=mig_mode is not None,
                pci_bus_id=pci_bus_id(bus_id),
            )
            entry = self.shared_gpus.entry_for(index, uuid)
            if entry is None:
                return device
            if mig_on:
                self._log_once(
                    logging.WARNING,
                    f"GPU {index} is in MIG mode, so it is published MIG-partitioned and not "
                    f"shared, although {self.shared_gpus.source} names it ({entry.gpus_path})",
                )
                return device
            return self.shared_gpus.share(device, entry)
        except model.InventoryError as err:
            # NVML answered, but with something the API cannot take (a version we cannot read),
            # or a GPU that --shared-gpus names twice or whose memory its policy does not fit.
            raise model.InventoryError(f"node {self.node}: GPU {index}: {err}") from None

    # ---- MIG (model.MigInstances) ------------------------------------------------------

    async def mig_instances(self) -> tuple[model.MigInstance, ...]:
        return await asyncio.to_thread(self._mig_instances_blocking)

    async def create_mig_instance(self, placement: model.MigPlacement) -> model.MigInstance:
        return await asyncio.to_thread(self._create_blocking, placement)

    async def destroy_mig_instance(self, instance: model.MigInstance) -> None:
        await asyncio.to_thread(self._destroy_blocking, instance)

    def _mig_profiles(self, index: int, handle: Any) -> dict[str, tuple[int, mig.MigProfile]]:
        """The GPU instance profiles of a GPU in MIG mode, by name: NVML's profile id and the
        profile with its possible placements."""
        nvml = self._nvml
        found: dict[str, tuple[int, mig.MigProfile]] = {}
        for profile_id in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
            except nvml.NVMLError as err:
                if _code(err) in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
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
            name = _text(info.name).removeprefix("MIG ").strip()
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
                if _code(err) in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise self._error("nvmlDeviceGetMigDeviceHandleByIndex", index, err) from err
            ids = (
                self._nv("nvmlDeviceGetGpuInstanceId", index, device),
                self._nv("nvmlDeviceGetComputeInstanceId", index, device),
            )
            found[ids] = _text(self._nv("nvmlDeviceGetUUID", index, device))
        return found

    def _instances_of(self, index: int, handle: Any) -> list[model.MigInstance]:
        nvml = self._nvml
        mig_devices = self._mig_devices(index, handle)
        instances: list[model.MigInstance] = []
        for name, (profile_id, _) in self._mig_profiles(index, handle).items():
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
                if mode is not None and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE:
                    found.extend(self._instances_of(index, handle))
        return tuple(found)

    def _create_blocking(self, placement: model.MigPlacement) -> model.MigInstance:
        nvml = self._nvml
        with self._lock:
            self._init_locked()
            index, handle = self._mig_gpu(placement.parent)
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
            self._destroy_locked(instance)

    def _destroy_locked(self, instance: model.MigInstance) -> None:
        nvml = self._nvml
        index, handle = self._mig_gpu(instance.placement.parent)
        gone = tuple(getattr(nvml, name) for name in _GONE)
        try:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, instance.gpu_instance)
        except nvml.NVMLError as err:
            if _code(err) in gone:
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
                if _code(err) not in gone:
                    raise self._error("nvmlGpuInstanceGetComputeInstanceById", index, err) from err
            else:
                self._nv("nvmlComputeInstanceDestroy", index, compute)
        self._nv("nvmlGpuInstanceDestroy", index, gpu_instance)

    def _nv(self, name: str, index: int | None, *args: Any) -> Any:
        """NVML's function ``name`` called with ``args``; an error names the call and GPU."""
        return self._call(name, index, getattr(self._nvml, name), *args)

    def _error(self, name: str, index: int | None, err: Exception) -> model.InventoryError:
        return model.InventoryError(f"{self._where(index)}: NVML {name} failed: {err}")

    def _call(self, name: str, index: int | None, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise model.InventoryError(f"{self._where(index)}: NVML {name} failed: {err}") from err

    def _optional(
        self, name: str, index: int | None, fn: Callable[..., _T], *args: Any
    ) -> _T | None:
        """Like ``_call``, but "not supported" answers None instead of failing."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise model.InventoryError(f"{self._where(index)}: NVML {name} failed: {err}") from err

    def _log_once(self, level: int, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.log(level, "node %s: %s", self.node, message)

    def _where(self, index: int | None) -> str:
        return f"node {self.node}" if index is None else f"node {self.node}: GPU {index}"


def _code(err: Exception) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def cuda_version(encoded: int) -> str:
    """CUDA's integer version as semver: 12040 -> "12.4.0" (1000 * major + 10 * minor)."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}.0"


def pci_bus_id(raw: str) -> str:
    """NVML's "00000000:3B:00.0" in the kernel's form, "0000:3b:00.0", as sysfs prints it."""
    match = _BUS_ID.fullmatch(raw.strip())
    if match is None:
        raise model.InventoryError(f"PCI bus id {raw!r} is not of the form 0000:3b:00.0")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes; newer ones decode. Fixed-size C buffers may carry NULs.
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.rstrip("\x00").strip()

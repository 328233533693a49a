"""A stand-in for the parts of the pynvml module that NvmlBackend calls.

Mirrors the real module (nvidia-ml-py): the same function names and parameters, the same
error classes (``NVMLError(value)`` returns the subclass for that code, e.g.
``NVMLError_NotSupported``, as pynvml's ``_extractNVMLErrorsAsClasses`` arranges), bytes for
``busId`` as the ctypes struct gives it. ``tests/unit/devices/test_nvml.py`` checks the names and
parameters against the installed pynvml. A ``FakeNvml`` instance is passed where the module
would be: by the NVML backend's tests, the agent's (``tests/unit/agent``) and ``hack/gpu-check``'s.

Events: ``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` / ``nvmlEventSetWait_v2`` /
``nvmlEventSetFree`` behave as NVML's do (a wait that times out raises ``NVML_ERROR_TIMEOUT``; the
event data has the ctypes struct's field names); a test raises an event with ``emit``.

MIG: a MIG-capable GPU has the GPU instance profiles of its model (``devices.gpu_models``:
NVML's answers, checked against NVIDIA's go-nvml mocks by ``test_nvml_oracle.py``), asked for by
profile enum and answered with NVML's own profile ids (19 for an A100's 1g.5gb, not the enum's
0), and their possible placements, whether or not MIG mode is on (nvml.h); listing, creating
and destroying instances needs MIG mode. Answers come in pynvml's own ctypes structs; GPU and
compute instance handles are ctypes pointers as pynvml returns them, and arrays passed by the
caller (possible placements, GPU instances) are filled in as the C library fills them. Creating
an instance checks what the hardware checks (a possible placement, memory slices free, compute
slices left) and refuses with NVML's codes; every compute instance gets a new ``MIG-`` UUID, as
real MIG devices do when created again. ``reset(index)`` is a GPU reset: every instance goes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import queue
import threading
from typing import Any, ClassVar

import pynvml

from dra_gpu.devices import gpu_models, mig

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 18
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

# pynvml's own ctypes types: what the backend allocates and reads is what the C library fills.
c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t

NVML_BRAND_TESLA = 2
NVML_BRAND_NVIDIA = 14
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
NVML_NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t's GPU/compute instance id of a GPU-wide event
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_VALUE_TYPE_UNSIGNED_INT = 1

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_UNKNOWN: "Unknown Error",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
}

PRIVILEGED_CALLS = frozenset(
    {
        # nvml.h marks these "Requires privileged user": an unprivileged caller (an agent
        # container without CAP_SYS_ADMIN and NVIDIA_MIG_CONFIG_DEVICES) gets NO_PERMISSION.
        "nvmlDeviceGetGpuInstancePossiblePlacements",
        "nvmlDeviceGetGpuInstanceRemainingCapacity",
        "nvmlDeviceCreateGpuInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceDestroy",
        "nvmlDeviceGetGpuInstances",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
        "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
        "nvmlComputeInstanceDestroy",
        "nvmlGpuInstanceGetComputeInstances",
        "nvmlGpuInstanceGetComputeInstanceById",
    }
)


class NVMLError(Exception):
    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    cls = type(name, (NVMLError,), {"__new__": new})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)


@dataclasses.dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 85520809984  # 81559 MiB, what an H100 80GB reports
    brand: int = NVML_BRAND_NVIDIA
    architecture: int = NVML_DEVICE_ARCH_HOPPER
    compute_capability: tuple[int, int] = (9, 0)
    bus_id: bytes = b"00000000:18:00.0"
    mig_capable: bool = True
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    """Function name -> NVML error code that call raises for this GPU."""
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError
    mig_mode: int = NVML_DEVICE_MIG_DISABLE
    mig_table: mig.MigTable = mig.H100_80GB
    """The model's partition table; its ``model`` names the ``gpu_models`` model answered."""
    lost: bool = False
    """Fallen off the bus (``FakeNvml.lose``): every call about it answers GPU_IS_LOST."""
    recovery_action: int | None = 0
    """Field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvmlDeviceGpuRecoveryAction_t; 0 = none);
    None: a driver without the field (its value answers NOT_SUPPORTED)."""
    gpu_model: gpu_models.GpuModel | None = None
    """The MIG model NVML's MIG calls answer for; None: the one ``mig_table`` names."""

    @property
    def mig_model(self) -> gpu_models.GpuModel:
        if self.gpu_model is not None:
            return self.gpu_model
        found = gpu_models.by_mig_model(self.mig_table.model)
        if found is None:
            raise ValueError(f"no gpu_models model for MIG table {self.mig_table.model}")
        return found


def nvml_profile_id(gpu: FakeGpu, profile: mig.MigProfile) -> int:
    """NVML's GPU instance profile id (``info.id``) of a profile of ``gpu``'s model."""
    for found in gpu.mig_model.profiles:
        if found.name == profile.name:
            return found.id
    raise ValueError(f"{gpu.mig_model.key} has no MIG profile {profile.name}")


@dataclasses.dataclass(eq=False)
class _ComputeInstance:
    id: int
    profile_id: int
    uuid: str
    handle: Any = dataclasses.field(default_factory=pynvml.struct_c_nvmlComputeInstance_t)


@dataclasses.dataclass(eq=False)
class _GpuInstance:
    id: int
    placement: mig.Placement
    computes: list[_ComputeInstance] = dataclasses.field(default_factory=list)
    handle: Any = dataclasses.field(default_factory=pynvml.struct_c_nvmlGpuInstance_t)


@dataclasses.dataclass(frozen=True)
class _MigHandle:
    """A MIG device handle (nvmlDeviceGetMigDeviceHandleByIndex)."""

    index: int
    gpu_instance: int
    compute_instance: int
    uuid: str


def two_h100s() -> list[FakeGpu]:
    return [
        FakeGpu(uuid="GPU-5f2a1c3e-0000-4000-8000-000000000000", bus_id=b"00000000:18:00.0"),
        FakeGpu(uuid="GPU-5f2a1c3e-0001-4000-8000-000000000001", bus_id=b"00000000:2A:00.0"),
    ]


@dataclasses.dataclass(frozen=True)
class _Handle:
    index: int


@dataclasses.dataclass
class _PciInfo:
    busId: bytes  # the real ctypes struct's field name


@dataclasses.dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclasses.dataclass
class _EventData:
    # The field names of pynvml's c_nvmlEventData_t.
    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = NVML_NO_INSTANCE  # nvml.h: 0xFFFFFFFF unless MIG-scoped
    computeInstanceId: int = NVML_NO_INSTANCE


@dataclasses.dataclass(eq=False)
class _EventSet:
    registered: dict[int, int] = dataclasses.field(default_factory=dict)  # index -> types
    events: queue.Queue[_EventData] = dataclasses.field(default_factory=queue.Queue)
    freed: bool = False
    lost_pending: bool = False  # a GPU was lost since the last wait: it answers GPU_IS_LOST


def a100_in_mig_mode(**fields: Any) -> FakeGpu:
    """An A100 40GB with MIG mode on, its profiles NVIDIA's table."""
    return FakeGpu(
        name="NVIDIA A100-SXM4-40GB",
        memory_total=40 * 2**30,
        mig_mode=1,
        mig_table=mig.A100_40GB,
        **{"architecture": NVML_DEVICE_ARCH_AMPERE, "compute_capability": (8, 0), **fields},
    )


class FakeNvml:
    """Use like the pynvml module; records which thread made each call."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_GPU_INSTANCE_PROFILE_COUNT = NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = c_nvmlGpuInstance_t

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
        errors: dict[str, int] | None = None,
    ) -> None:
        self.gpus = two_h100s() if gpus is None else gpus
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.errors = dict(errors or {})  # system-level calls: name -> error code
        self.initialised = 0  # like NVML, init and shutdown are reference counted
        self.init_calls = 0
        self.shutdown_calls = 0
        self.call_threads: list[tuple[str, int]] = []
        self.event_sets: list[_EventSet] = []
        self.instances: dict[int, list[_GpuInstance]] = {i: [] for i in range(len(self.gpus))}
        self._uuids = itertools.count(1)
        self.privileged = True
        """False: the caller is no privileged user, and every call of ``PRIVILEGED_CALLS``
        answers NVML_ERROR_NO_PERMISSION (an agent container without MIG's privileges)."""

    # ---- for tests ------------------------------------------------------------------------

    def reset(self, index: int) -> None:
        """A GPU reset (a reboot): its MIG instances are gone."""
        self.instances[index] = []

    def mig_uuids(self, index: int) -> list[str]:
        return [c.uuid for g in self.instances[index] for c in g.computes]

    def emit(
        self,
        index: int,
        event_type: int,
        data: int = 0,
        gpu_instance: int = NVML_NO_INSTANCE,
        compute_instance: int = NVML_NO_INSTANCE,
    ) -> None:
        """An event on GPU ``index``, delivered to every event set registered for it; a
        MIG-scoped XID names its GPU (and compute) instance as nvmlEventData_t does."""
        for event_set in self.event_sets:
            if not event_set.freed and event_set.registered.get(index, 0) & event_type:
                event = _EventData(_Handle(index), event_type, data)
                event.gpuInstanceId, event.computeInstanceId = gpu_instance, compute_instance
                event_set.events.put(event)

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus: from now on every call about it (its handle, its
        UUID, ...) answers GPU_IS_LOST, and the next event wait does once."""
        self.gpus[index].lost = True
        for event_set in self.event_sets:
            event_set.lost_pending = True

    def _enter(self, name: str, handle: _Handle | None = None) -> FakeGpu | None:
        self.call_threads.append((name, threading.get_ident()))
        code = self.errors.get(name)
        if code is not None:
            raise NVMLError(code)
        if name in PRIVILEGED_CALLS and not self.privileged:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if name != "nvmlInit" and not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if name in gpu.errors:
            raise NVMLError(gpu.errors[name])
        return gpu

    def _gpu(self, name: str, handle: _Handle) -> FakeGpu:
        gpu = self._enter(name, handle)
        assert gpu is not None
        return gpu

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.init_calls += 1
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.shutdown_calls += 1
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)  # nvml.h: "fallen off the bus"
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle | _MigHandle) -> str:
        if isinstance(handle, _MigHandle):
            self._enter("nvmlDeviceGetUUID")
            return handle.uuid
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceGetMinorNumber", handle)
        return handle.index  # /dev/nvidia<index>, as go-nvml's mock numbers them

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetBrand(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetBrand", handle).brand

    def nvmlDeviceGetArchitecture(self, device: _Handle) -> int:
        return self._gpu("nvmlDeviceGetArchitecture", device).architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:
        return _PciInfo(busId=self._gpu("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> _Memory:
        total = self._gpu("nvmlDeviceGetMemoryInfo", handle).memory_total
        return _Memory(total=total, free=total, used=0)

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", device)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlDeviceRegisterEvents(
        self, handle: _Handle, eventTypes: int, eventSet: _EventSet
    ) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if eventTypes & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        eventSet.registered[handle.index] = eventSet.registered.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: _EventSet, timeoutms: int) -> _EventData:
        self._enter("nvmlEventSetWait_v2")
        if eventSet.lost_pending:
            eventSet.lost_pending = False
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        try:
            return eventSet.events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlDeviceGetFieldValues(self, handle: _Handle, fieldIds: list[int]) -> Any:
        """As pynvml's: an array of c_nvmlFieldValue_t, each with its own nvmlReturn."""
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for value, field in zip(values, fieldIds, strict=True):
            value.fieldId = field
            if field == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.recovery_action
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        eventSet.freed = True

    # ---- MIG ------------------------------------------------------------------------------

    def _mig_gpu(self, name: str, handle: _Handle) -> FakeGpu:
        gpu = self._gpu(name, handle)
        if gpu.mig_mode != NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig_capable(self, name: str, handle: _Handle) -> FakeGpu:
        gpu = self._gpu(name, handle)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _profile(self, gpu: FakeGpu, profile_id: int) -> mig.MigProfile:
        """The profile of NVML's id ``profile_id`` (``info.id``, not the enum) on ``gpu``."""
        found = gpu.mig_model.by_id(profile_id)
        if found is not None:
            for profile in gpu.mig_table.profiles:
                if profile.name == found.name:
                    return profile
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def _gpu_instance(self, name: str, handle: Any) -> tuple[int, _GpuInstance]:
        self._enter(name)
        address = ctypes.addressof(handle.contents)
        for index, instances in self.instances.items():
            for instance in instances:
                if ctypes.addressof(instance.handle) == address:
                    return index, instance
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a destroyed instance's handle

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: _Handle, profile: int, version: int = 2
    ) -> Any:
        # nvml.h: "not supported" only where the GPU has no MIG or no such profile; the
        # answer does not depend on the MIG mode.
        gpu = self._mig_capable("nvmlDeviceGetGpuInstanceProfileInfo", device)
        if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        found = gpu.mig_model.by_enum(profile)
        if found is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = found.id  # NVML's profile id, not the enum asked for
        info.sliceCount = found.compute_slices
        info.instanceCount = found.instance_count
        info.memorySizeMB = found.memory_mib
        info.name = f"MIG {found.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: _Handle, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        # nvml.h: "all the possible placements ... regardless of whether MIG is enabled".
        gpu = self._mig_capable("nvmlDeviceGetGpuInstancePossiblePlacements", device)
        profile = self._profile(gpu, profileId)
        if len(placementsRef) < len(profile.starts):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(profile.starts):
            placementsRef[i].start = start
            placementsRef[i].size = profile.memory_slices
        countRef._obj.value = len(profile.starts)
        return 0

    def nvmlDeviceGetGpuInstances(
        self, device: _Handle, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu = self._mig_gpu("nvmlDeviceGetGpuInstances", device)
        profile = self._profile(gpu, profileId)
        found = [g for g in self.instances[device.index] if g.placement.profile == profile]
        if len(gpuInstancesRef) < len(found):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, instance in enumerate(found):
            gpuInstancesRef[i] = ctypes.pointer(instance.handle)
        countRef._obj.value = len(found)
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: _Handle, profileId: int, placement: Any
    ) -> Any:
        gpu = self._mig_gpu("nvmlDeviceCreateGpuInstanceWithPlacement", device)
        profile = self._profile(gpu, profileId)
        where = getattr(placement, "_obj", placement)  # passed byref, as the C call takes it
        if where.start not in profile.starts or where.size != profile.memory_slices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        existing = self.instances[device.index]
        wanted = mig.Placement(profile, where.start)
        if mig.conflict(wanted, [g.placement for g in existing]) is not None:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        ids = {g.id for g in existing}
        created = _GpuInstance(min(set(range(1, len(ids) + 2)) - ids), wanted)
        existing.append(created)
        return ctypes.pointer(created.handle)

    def nvmlDeviceGetGpuInstanceById(self, device: _Handle, gpuInstanceId: int) -> Any:
        self._mig_gpu("nvmlDeviceGetGpuInstanceById", device)
        for instance in self.instances[device.index]:
            if instance.id == gpuInstanceId:
                return ctypes.pointer(instance.handle)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        index, instance = self._gpu_instance("nvmlGpuInstanceGetInfo", gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id = instance.id
        info.profileId = nvml_profile_id(self.gpus[index], instance.placement.profile)
        info.placement.start = instance.placement.start
        info.placement.size = instance.placement.profile.memory_slices
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        index, instance = self._gpu_instance("nvmlGpuInstanceGetComputeInstanceProfileInfo", device)
        # As go-nvml's mock answers: an enum out of range is invalid, other engine profiles
        # and compute profiles the GPU instance's profile lacks are not supported.
        if not 0 <= profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpu = self.gpus[index]
        gi_profile = gpu.mig_model.by_id(nvml_profile_id(gpu, instance.placement.profile))
        assert gi_profile is not None
        compute = next((c for c in gi_profile.compute_profiles if c.enum == profile), None)
        if compute is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = compute.enum
        info.sliceCount = compute.slices
        info.instanceCount = compute.instances
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        index, instance = self._gpu_instance("nvmlGpuInstanceCreateComputeInstance", gpuInstance)
        if instance.computes:  # one spanning compute instance is all the fake offers
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        number = next(self._uuids)
        uuid = f"MIG-{index:08x}-{instance.id:04x}-4000-8000-{number:012x}"
        created = _ComputeInstance(0, profileId, uuid)
        instance.computes.append(created)
        return ctypes.pointer(created.handle)

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        _, instance = self._gpu_instance("nvmlGpuInstanceGetComputeInstanceById", gpuInstance)
        for compute in instance.computes:
            if compute.id == computeInstanceId:
                return ctypes.pointer(compute.handle)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def _compute_instance(self, name: str, handle: Any) -> tuple[_GpuInstance, _ComputeInstance]:
        self._enter(name)
        address = ctypes.addressof(handle.contents)
        for instances in self.instances.values():
            for instance in instances:
                for compute in instance.computes:
                    if ctypes.addressof(compute.handle) == address:
                        return instance, compute
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        _, compute = self._compute_instance("nvmlComputeInstanceGetInfo", computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id = compute.id
        info.profileId = compute.profile_id
        return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> None:
        instance, compute = self._compute_instance("nvmlComputeInstanceDestroy", computeInstance)
        instance.computes.remove(compute)

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> None:
        index, instance = self._gpu_instance("nvmlGpuInstanceDestroy", gpuInstance)
        if instance.computes:
            raise NVMLError(NVML_ERROR_IN_USE)
        self.instances[index].remove(instance)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        self._gpu("nvmlDeviceGetMaxMigDeviceCount", device)
        return mig.COMPUTE_SLICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _MigHandle:
        self._mig_gpu("nvmlDeviceGetMigDeviceHandleByIndex", device)
        handles = [
            _MigHandle(device.index, g.id, c.id, c.uuid)
            for g in sorted(self.instances[device.index], key=lambda g: g.id)
            for c in g.computes
        ]
        if not 0 <= index < len(handles):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return handles[index]

    def nvmlDeviceGetGpuInstanceId(self, device: _MigHandle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        return device.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, device: _MigHandle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        return device.compute_instance

    # ---- compute mode (nvml.h: nvmlDeviceGetComputeMode, nvmlDeviceSetComputeMode) ----------

    NVML_COMPUTEMODE_DEFAULT = 0  # nvmlComputeMode_t; 1 (EXCLUSIVE_THREAD) is deprecated
    NVML_COMPUTEMODE_PROHIBITED = 2
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3

    @property
    def compute_modes(self) -> dict[int, int]:
        """GPU index -> its compute mode (NVML_COMPUTEMODE_DEFAULT until set)."""
        modes: dict[int, int] = self.__dict__.setdefault("_compute_modes", {})
        return modes

    def nvmlDeviceGetComputeMode(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceGetComputeMode", handle)
        return self.compute_modes.get(handle.index, self.NVML_COMPUTEMODE_DEFAULT)

    def nvmlDeviceSetComputeMode(self, handle: _Handle, mode: int) -> None:
        # nvml.h: "Requires root/admin permissions"; a mode it does not know: INVALID_ARGUMENT.
        self._gpu("nvmlDeviceSetComputeMode", handle)
        if not self.privileged:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if mode not in (0, 2, 3):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.compute_modes[handle.index] = mode

"""A stand-in for the parts of the pynvml module that NvmlBackend calls.

Mirrors the real module (nvidia-ml-py): the same function names and parameters, the same
error classes (``NVMLError(value)`` returns the subclass for that code, e.g.
``NVMLError_NotSupported``, as pynvml's ``_extractNVMLErrorsAsClasses`` arranges), bytes for
``busId`` as the ctypes struct gives it. ``inventory/test_nvml.py`` checks the names and parameters
against the installed pynvml. A ``FakeNvml`` instance is passed where the module would be.

Events: ``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` / ``nvmlEventSetWait_v2`` /
``nvmlEventSetFree`` behave as NVML's do (a wait that times out raises ``NVML_ERROR_TIMEOUT``; the
event data has the ctypes struct's field names); a test raises an event with ``emit``.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, ClassVar

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_BRAND_TESLA = 2
NVML_BRAND_NVIDIA = 14
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


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
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclasses.dataclass(eq=False)
class _EventSet:
    registered: dict[int, int] = dataclasses.field(default_factory=dict)  # index -> types
    events: queue.Queue[_EventData] = dataclasses.field(default_factory=queue.Queue)
    freed: bool = False


class FakeNvml:
    """Use like the pynvml module; records which thread made each call."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError

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

    def emit(self, index: int, event_type: int, data: int = 0) -> None:
        """An event on GPU ``index``, delivered to every event set registered for it."""
        for event_set in self.event_sets:
            if not event_set.freed and event_set.registered.get(index, 0) & event_type:
                event_set.events.put(_EventData(_Handle(index), event_type, data))

    def _enter(self, name: str, handle: _Handle | None = None) -> FakeGpu | None:
        self.call_threads.append((name, threading.get_ident()))
        code = self.errors.get(name)
        if code is not None:
            raise NVMLError(code)
        if name != "nvmlInit" and not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
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
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

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
        if not self._gpu("nvmlDeviceGetMigMode", device).mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [0, 0]

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
        try:
            return eventSet.events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        eventSet.freed = True

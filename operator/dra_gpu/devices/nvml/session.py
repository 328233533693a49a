"""One NVML session: the pynvml surface the backend uses, its initialisation, and every call.

Owns ``NvmlApi`` (the parts of pynvml called; tests pass a fake with the same names),
``NvmlCallFailed`` (an NVML error naming the call, the GPU and NVML's code) and ``Session``:
NVML initialised once (a failed initialisation is retried on the next call), the lock every
call runs under (overlapping calls come from different threads), the call wrappers that turn
an NVML error into ``NvmlCallFailed`` and "not supported" into None where a property is
optional, and the node's log lines said once. Every method here blocks: callers run them in a
worker thread. Must not: read or publish devices (``nvml.backend``), watch health
(``nvml.health_watch``) or manage MIG instances (``nvml.instances``).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from dra_gpu.devices import model

_T = TypeVar("_T")
log = logging.getLogger(__name__)


class NvmlCallFailed(model.InventoryError):
    """An NVML call that answered an error: which call, and NVML's code."""

    def __init__(self, message: str, call: str, code: int | None) -> None:
        super().__init__(message)
        self.call = call
        self.code = code


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

    # CDI device nodes and MPS (nvml.h: nvmlDeviceGetMinorNumber, nvmlDeviceSetComputeMode).
    @property
    def NVML_COMPUTEMODE_DEFAULT(self) -> int: ...
    @property
    def NVML_COMPUTEMODE_EXCLUSIVE_PROCESS(self) -> int: ...

    def nvmlDeviceGetMinorNumber(self, device: Any) -> int: ...
    def nvmlDeviceSetComputeMode(self, device: Any, mode: int) -> None: ...

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

    # Health polls (nvml.h: nvmlDeviceGetFieldValues, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
    @property
    def NVML_FI_DEV_GET_GPU_RECOVERY_ACTION(self) -> int: ...

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any: ...

    # MIG (nvml.h: GPU instances, compute instances, MIG device handles).
    @property
    def NVML_ERROR_NOT_FOUND(self) -> int: ...
    @property
    def NVML_ERROR_NO_PERMISSION(self) -> int: ...
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


class Session:
    """NVML for one node: initialised on first use, shut down by the backend's ``aclose()``."""

    def __init__(self, node: str, nvml: NvmlApi | None = None) -> None:
        self.node = node
        self._logged: set[str] = set()  # notes on the setting, each logged once
        # Imported here, not at module load: a node without the NVIDIA driver can still import
        # the package and run the simulated backend.
        self._nvml = nvml if nvml is not None else cast(NvmlApi, importlib.import_module("pynvml"))
        self._lock = threading.Lock()  # overlapping inventory() calls run in different threads
        self._initialised = False

    def _init_locked(self) -> None:
        if not self._initialised:
            self._call("nvmlInit", None, self._nvml.nvmlInit)
            self._initialised = True

    def _shutdown_locked(self) -> None:
        if self._initialised:
            self._initialised = False
            self._call("nvmlShutdown", None, self._nvml.nvmlShutdown)

    def _nv(self, name: str, index: int | None, *args: Any) -> Any:
        """NVML's function ``name`` called with ``args``; an error names the call and GPU."""
        return self._call(name, index, getattr(self._nvml, name), *args)

    def _error(self, name: str, index: int | None, err: Exception) -> NvmlCallFailed:
        return NvmlCallFailed(
            f"{self._where(index)}: NVML {name} failed: {err}", name, error_code(err)
        )

    def _call(self, name: str, index: int | None, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise self._error(name, index, err) from err

    def _optional(
        self, name: str, index: int | None, fn: Callable[..., _T], *args: Any
    ) -> _T | None:
        """Like ``_call``, but "not supported" answers None instead of failing."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise self._error(name, index, err) from err

    def _log_once(self, level: int, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.log(level, "node %s: %s", self.node, message)

    def _where(self, index: int | None) -> str:
        return f"node {self.node}" if index is None else f"node {self.node}: GPU {index}"


def error_code(err: Exception) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def as_text(value: str | bytes) -> str:
    # Older pynvml releases return bytes; newer ones decode. Fixed-size C buffers may carry NULs.
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.rstrip("\x00").strip()

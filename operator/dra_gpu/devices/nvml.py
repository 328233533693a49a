"""The NVML backend: the node's real GPUs, read through pynvml.

This module owns the translation from NVML's answers (enums, byte counts, driver version
strings, PCI addresses) into the inventory model. Every NVML call is blocking, so all of them
run in a worker thread and never on the event loop that answers the kubelet. An NVML failure
is never turned into "no GPUs": it raises ``InventoryError`` naming the call and the GPU, because
an empty inventory would publish an empty pool and the user would only see "cannot allocate".
"Not supported" is an answer, not a failure, for the few properties that are optional.

Health: once ``faults()`` is first called, a daemon thread (``nvml-events``) waits on an NVML
event set for critical XIDs and double-bit ECC errors on every GPU (what each GPU supports) and
queues them as ``health.Fault``s, classified by the XID policy; a GPU whose registration NVML
refuses is unmonitored (``monitored()``) and the others are watched. Events are matched to GPUs
by the handle registered (a lost GPU no longer tells its UUID), and a MIG-scoped XID (its GPU
instance id) to the partition device of that instance. ``faults()`` drains that queue and polls
what has no event: a GPU that answers ``GPU_IS_LOST`` (or, read before, no longer tells its
UUID) is a ``lost`` fault for as long as it does, and a ``health.Reset`` once it answers again;
NVML's recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) is a ``recovery`` fault while it
asks for a reset, and a ``Reset`` once it is back to none. The inventory publishes a lost GPU as
it was last read well, so its taint reaches the slice and the other GPUs keep being published.
The thread wakes at least once a second, so ``aclose()`` ends it before shutting NVML down.

MIG: a GPU whose current MIG mode is on is published partitioned (``devices.mig``): its GPU
instance profiles and their possible placements are read from NVML
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
import dataclasses
import importlib
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from dra_gpu.devices import edits, health, mig, model, nvml_cdi, pci, sharing

_T = TypeVar("_T")
log = logging.getLogger(__name__)
EVENT_WAIT_MS = 1000
"""How long one nvmlEventSetWait_v2 blocks: the longest ``aclose()`` waits for the thread."""
MAX_QUEUED_FAULTS = 1024
"""Faults kept between two ``faults()`` calls; older ones are dropped (a storm of one XID)."""
WATCH_RESTART_SECONDS = 60.0
"""An event thread that ended (NVML gave no event set) is started again at most this often."""
NO_INSTANCE = 0xFFFFFFFF
"""``nvmlEventData_t.gpuInstanceId`` of an event not attributable to one MIG GPU instance."""

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
        driver_root: Path = Path("/"),
        nvidia_smi: str = "nvidia-smi",
        sysfs: Path = pci.SYSFS,
    ) -> None:
        self.node = node
        self.sysfs = sysfs
        """Where each GPU's PCIe root and NUMA node are read (``devices.pci``)."""
        self.driver_root = driver_root
        """Where the driver's ``/dev`` nodes and ``/proc/driver`` files are read (CDI edits)."""
        self.nvidia_smi = nvidia_smi
        """Runs ``compute-policy --set-timeslice`` for TimeSlicing GPUs."""
        self._minors: dict[int, int] = {}  # NVML index -> /dev/nvidia<minor> (last inventory)
        self.xids = xids or health.XidPolicy()
        self.shared_gpus = shared_gpus or sharing.SharedGpus()
        self._logged: set[str] = set()  # notes on the setting, each logged once
        # Imported here, not at module load: a node without the NVIDIA driver can still import
        # the package and run the simulated backend.
        self._nvml = nvml if nvml is not None else cast(NvmlApi, importlib.import_module("pynvml"))
        self._lock = threading.Lock()  # overlapping inventory() calls run in different threads
        self._initialised = False
        self._events: collections.deque[health.Fault | health.Reset] = collections.deque(
            maxlen=MAX_QUEUED_FAULTS
        )
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        self._watching = threading.Event()  # set once the event set is registered (tests wait)
        self._watch_started = 0.0  # time.monotonic() of the last start of the event thread
        self._known: dict[int, _Reading] = {}
        """NVML index -> the GPU as last read: a lost GPU is published from it (tainted)."""
        self._last_inventory: model.Inventory | None = None
        self._lost: set[int] = set()  # GPUs the last health poll found lost
        self._recovery: dict[int, int] = {}  # the last recovery action NVML reported per GPU
        self._monitored: dict[str, bool] = {}  # GPU -> its events registered (the event thread)
        self._mig_refused: dict[int, model.MigRefusal] = {}  # MIG-mode GPUs refusing us
        self._mig_held: set[model.MigPlacement] = set()  # instances that are the agent's

    async def inventory(self) -> model.Inventory:
        return await asyncio.to_thread(self._read_blocking)

    async def container_edits(self, devices: Sequence[edits.GivenDevice]) -> edits.ClaimEdits:
        """A claim's CDI edits as NVIDIA's toolkit (``nvcdi``) and DRA driver write them
        (``devices.nvml_cdi``): ``NVIDIA_VISIBLE_DEVICES`` and the control nodes once, each GPU's
        ``/dev/nvidia<minor>``, a MIG device's capability nodes."""
        minors = dict(self._minors)
        return await asyncio.to_thread(
            nvml_cdi.claim_edits, self.driver_root, devices, minors, self._log_once
        )

    async def set_compute_mode(self, device: str, uuid: str, exclusive: bool) -> None:
        """``EXCLUSIVE_PROCESS`` (one process, the MPS server, on the GPU) or ``DEFAULT``
        (``nvmlDeviceSetComputeMode``, as ``nvidia-smi -c``; needs root). ``agent.mps``."""
        await asyncio.to_thread(self._set_compute_mode_blocking, device, exclusive)

    def _set_compute_mode_blocking(self, device: str, exclusive: bool) -> None:
        nvml = self._nvml
        mode = (
            nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if exclusive else nvml.NVML_COMPUTEMODE_DEFAULT
        )
        with self._lock:
            self._init_locked()
            index, handle = self._mig_gpu(device)
            self._nv("nvmlDeviceSetComputeMode", index, handle, mode)

    async def set_time_slice(self, device: str, uuid: str, time_slice: str) -> None:
        """``nvidia-smi compute-policy -i <uuid> --set-timeslice <0-3>``, as NVIDIA's driver."""
        await asyncio.to_thread(self._set_time_slice_blocking, device, uuid, time_slice)

    def _set_time_slice_blocking(self, device: str, uuid: str, time_slice: str) -> None:
        argv = [
            self.nvidia_smi,
            "compute-policy",
            "-i",
            uuid,
            "--set-timeslice",
            str(model.TIME_SLICES.index(time_slice)),
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise model.InventoryError(f"{device}: {' '.join(argv)}: {err}") from None
        if done.returncode != 0:
            raise model.InventoryError(
                f"{device}: {' '.join(argv)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )

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

    async def faults(self) -> tuple[health.Fault | health.Reset, ...]:
        return await asyncio.to_thread(self._faults_blocking)

    def monitored(self) -> dict[str, bool]:
        """GPU name -> whether its XID/ECC events are registered (``health.Monitored``)."""
        return dict(self._monitored)

    def _faults_blocking(self) -> tuple[health.Fault | health.Reset, ...]:
        """(In a thread.) The events queued since the last call, then what each GPU says now:
        lost (``GPU_IS_LOST``, or a UUID lookup that fails for a GPU read before), NVML's
        recovery action, and a reset (a lost GPU that answers again, a recovery action back to
        none). One GPU's failure is logged and never hides the others."""
        nvml = self._nvml
        polled: list[health.Fault | health.Reset] = []
        with self._lock:
            self._init_locked()
            self._start_watching_locked()
            count = self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount)
            for index in range(count):
                polled += self._poll_gpu_locked(index)
        queued: list[health.Fault | health.Reset] = []
        while self._events:
            queued.append(self._events.popleft())
        return (*queued, *polled)

    def _start_watching_locked(self) -> None:
        if self._watcher is not None and self._watcher.is_alive():
            return
        now = time.monotonic()
        if self._watcher is not None and now - self._watch_started < WATCH_RESTART_SECONDS:
            return  # it ended (no event set): try again later, not on every poll
        self._watch_started = now
        self._stop_watching.clear()
        self._watcher = threading.Thread(
            target=self._watch_blocking, name="nvml-events", daemon=True
        )
        self._watcher.start()

    def _poll_gpu_locked(self, index: int) -> list[health.Fault | health.Reset]:
        nvml = self._nvml
        name = f"gpu-{index}"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceGetUUID(handle)
        except nvml.NVMLError as err:
            if _code(err) == nvml.NVML_ERROR_GPU_IS_LOST or index in self._known:
                self._lost.add(index)
                return [self.xids.lost_fault(name, f"the GPU is lost (NVML: {err})")]
            log.warning("%s: polling its health failed: %s", self._where(index), err)
            return []
        found: list[health.Fault | health.Reset] = []
        if index in self._lost:
            self._lost.discard(index)
            found.append(health.Reset(name, "the GPU answers NVML again (reset or re-attached)"))
        action = self._recovery_action(index, handle)
        before = self._recovery.get(index, 0)
        if action is not None:
            self._recovery[index] = action
            if action:
                value = health.RECOVERY_ACTIONS.get(action, f"action-{action}")
                found.append(
                    self.xids.recovery_fault(name, value, f"NVML: recovery action {value}")
                )
            elif before:
                found.append(health.Reset(name, "NVML's recovery action is back to none"))
        return found

    def _recovery_action(self, index: int, handle: Any) -> int | None:
        """NVML's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION); None where the
        driver does not report it (then only an operator clears a reset-needing taint)."""
        nvml = self._nvml
        try:
            field = nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
            [value] = nvml.nvmlDeviceGetFieldValues(handle, [field])
        except (nvml.NVMLError, AttributeError) as err:
            answer: object = err
        else:
            if value.nvmlReturn == 0:
                return int(value.value.uiVal)
            answer = f"NVML error {value.nvmlReturn}"
        self._log_once(
            logging.INFO,
            f"GPU {index}: NVML reports no recovery action ({answer}): a reset-needing taint "
            "clears when the GPU answers again after being lost, or when an operator clears it",
        )
        return None

    def _watch_blocking(self) -> None:
        """The event thread: register every GPU it can, then wait for events until told to
        stop. A GPU whose registration NVML refuses is left unmonitored (logged once, the
        ``monitored()`` map says so) and the others are watched; events are matched to GPUs
        by the handle registered, so a lost GPU, which no longer tells its UUID, is still
        named."""
        nvml = self._nvml
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            self._log_once(logging.ERROR, f"NVML events unavailable (no XID or ECC taints): {err}")
            return
        try:
            handles: dict[Any, int] = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = self._register_blocking(index, wanted, event_set)
                if handle is not None:
                    handles[_handle_key(handle)] = index
            self._watching.set()
            while not self._stop_watching.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
                except nvml.NVMLError as err:
                    if _code(err) == nvml.NVML_ERROR_GPU_IS_LOST:
                        log.warning("node %s: NVML events: a GPU is lost (%s)", self.node, err)
                    elif _code(err) != nvml.NVML_ERROR_TIMEOUT:
                        log.warning("node %s: waiting for NVML events failed: %s", self.node, err)
                        self._stop_watching.wait(EVENT_WAIT_MS / 1000)
                    continue
                try:
                    fault = self._fault_of(data, handles)
                except Exception as err:  # one event that cannot be read stops nothing
                    log.warning(
                        "node %s: an NVML event %r could not be read: %s", self.node, data, err
                    )
                    continue
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

    def _register_blocking(self, index: int, wanted: int, event_set: Any) -> Any:
        """GPU ``index``'s handle once its XID/ECC events are registered; None if NVML refused
        (``NOT_SUPPORTED`` on an old GPU, a lost GPU): that GPU only is unmonitored."""
        nvml = self._nvml
        name = f"gpu-{index}"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted
            if not supported:
                raise model.InventoryError("it reports no XID or ECC events")
            nvml.nvmlDeviceRegisterEvents(handle, supported, event_set)
        except (nvml.NVMLError, model.InventoryError) as err:
            self._monitored[name] = False
            self._log_once(
                logging.WARNING,
                f"GPU {index}: not monitored for XIDs and ECC errors ({err}); the other GPUs "
                "are, and a lost GPU is still noticed",
            )
            return None
        self._monitored[name] = True
        return handle

    def _fault_of(self, data: Any, handles: dict[Any, int]) -> health.Fault | None:
        nvml = self._nvml
        index = handles.get(_handle_key(data.device))
        if index is None:
            log.warning("node %s: an NVML event for a GPU not registered: %r", self.node, data)
            return None
        name = f"gpu-{index}"
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            gpu_instance = int(getattr(data, "gpuInstanceId", NO_INSTANCE))
            message = f"XID {xid} (NVML)"
            if gpu_instance != NO_INSTANCE and self._is_mig(index):
                partition = self._partition_at(index, gpu_instance)
                message = f"XID {xid} (NVML, GPU instance {gpu_instance})"
                if partition is None:
                    message += ", which no partition is published for: the whole GPU is tainted"
                else:
                    name = partition
            return self.xids.fault(name, xid, message)
        if data.eventType & nvml.nvmlEventTypeDoubleBitEccError:
            return self.xids.ecc_fault(name, "double-bit ECC error (NVML)")
        return None

    def _is_mig(self, index: int) -> bool:
        known = self._known.get(index)
        return known is not None and known.table is not None

    def _partition_at(self, index: int, gpu_instance: int) -> str | None:
        """(In the event thread.) The partition device of GPU ``index`` whose MIG instance is
        GPU instance ``gpu_instance`` now; None if there is none (or NVML cannot say)."""
        try:
            with self._lock:
                handle = self._nv("nvmlDeviceGetHandleByIndex", index, index)
                instances = self._instances_of(index, handle)
        except model.InventoryError as err:
            log.warning("node %s: the MIG instances of GPU %d: %s", self.node, index, err)
            return None
        placements = {i.placement for i in instances if i.gpu_instance == gpu_instance}
        inventory = self._last_inventory
        if not placements or inventory is None:
            return None
        for device in inventory.devices:
            if mig.placement_of(device) in placements:
                return device.name
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
            read: dict[int, model.Device] = {}
            for index in range(count):
                device = self._read_or_recall_locked(index, driver, cuda, tables)
                if device is not None:
                    read[index] = device
        devices = tuple(read.values())
        for name in self.shared_gpus.absent({i: d.uuid for i, d in read.items()}):
            self._log_once(
                logging.INFO, f"{self.shared_gpus.source}: {name} is not on this node: passed over"
            )
        try:
            inventory = mig.partition_inventory(self.node, devices, tables)
        except model.InventoryError as err:
            raise model.InventoryError(f"node {self.node}: MIG partitions: {err}") from None
        self._last_inventory = inventory
        return inventory

    def _read_or_recall_locked(
        self, index: int, driver: str, cuda: int | None, tables: dict[str, mig.MigTable]
    ) -> model.Device | None:
        """GPU ``index`` as NVML reads it now. A lost GPU (``GPU_IS_LOST`` from any call, or a
        UUID NVML no longer tells for a GPU read before) is the GPU as last read, so the slice
        keeps it and the health monitor's ``lost`` taint reaches it; one never read is left out
        (logged) until it answers. Any other failure fails the inventory, as before."""
        try:
            device = self._read_gpu(index, driver, cuda, tables)
        except model.InventoryError as err:
            if not self._is_lost(index):
                raise
            known = self._known.get(index)
            if known is None:
                self._log_once(
                    logging.WARNING,
                    f"GPU {index} is lost and was never read ({err}): left out until it answers",
                )
                return None
            self._log_once(
                logging.WARNING, f"GPU {index} is lost ({err}): published as last read, tainted"
            )
            if known.table is not None:
                tables[known.device.name] = known.table
            return known.device
        self._known[index] = _Reading(device, tables.get(device.name))
        return device

    def _is_lost(self, index: int) -> bool:
        nvml = self._nvml
        try:
            nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        except nvml.NVMLError as err:
            return _code(err) == nvml.NVML_ERROR_GPU_IS_LOST or index in self._known
        return False

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
        try:  # the GPU's /dev/nvidia<minor>, for the claims' CDI specs; not for publishing
            self._minors[index] = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError as err:
            self._log_once(logging.WARNING, f"GPU {index}: no device minor from NVML: {err}")
        # MIG mode is "not supported" on GPUs without MIG: that is the answer "not capable".
        mig_mode = self._optional("nvmlDeviceGetMigMode", index, nvml.nvmlDeviceGetMigMode, handle)
        mig_on = mig_mode is not None and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if mig_on:
            table = self._mig_table(index, handle, uuid, product_name, memory_bytes)
            tables[f"gpu-{index}"] = table
        else:
            self._mig_refused.pop(index, None)
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
            # The standard topology attributes (pcieRoot, numaNode), as sysfs gives them.
            topology = pci.topology(pci_bus_id(bus_id), self.sysfs)
            if topology:
                device = dataclasses.replace(device, attributes={**device.attributes, **topology})
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
        if not isinstance(err, NvmlCallFailed) or err.code != self._nvml.NVML_ERROR_NO_PERMISSION:
            return None
        refusal = model.MigRefusal(f"gpu-{index}", uuid, err.call, str(err.__cause__))
        self._mig_refused[index] = refusal
        return refusal

    def _uuid_of(self, index: int, handle: Any) -> str:
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
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

    def _error(self, name: str, index: int | None, err: Exception) -> NvmlCallFailed:
        return NvmlCallFailed(f"{self._where(index)}: NVML {name} failed: {err}", name, _code(err))

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


@dataclasses.dataclass(frozen=True)
class _Reading:
    """A GPU as last read well: its device, and its MIG table if it was in MIG mode."""

    device: model.Device
    table: mig.MigTable | None


def _handle_key(handle: Any) -> Any:
    """What identifies an NVML device handle: the address a ctypes pointer holds (each call
    returns a new pointer object to the same device), else the handle itself (a fake's)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


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

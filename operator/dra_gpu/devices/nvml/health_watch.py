"""Health through NVML: the events thread and the polls of what has no event.

Once ``faults()`` is first called, a daemon thread (``nvml-events``) waits on an NVML event set
for critical XIDs and double-bit ECC errors on every GPU (what each GPU supports) and queues
them as ``health.Fault``s, classified by the XID policy; a GPU whose registration NVML refuses
is unmonitored (``monitored()``) and the others are watched. Events are matched to GPUs by the
handle registered (a lost GPU no longer tells its UUID), and a MIG-scoped XID (its GPU instance
id) to the partition device of that instance. ``faults()`` drains that queue and polls what has
no event: a GPU that answers ``GPU_IS_LOST`` (or, read before, no longer tells its UUID) is a
``lost`` fault for as long as it does, and a ``health.Reset`` once it answers again; NVML's
recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) is a ``recovery`` fault while it asks
for a reset, and a ``Reset`` once it is back to none. The thread wakes at least once a second,
so ``aclose()`` ends it before shutting NVML down.

Owns the event thread, the fault queue and what each GPU was last read as (``Reading``: the
inventory publishes a lost GPU from it, tainted). Must not: classify XIDs (``devices.health``)
or taint devices (the agent does).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import dataclasses
import logging
import threading
import time
from typing import Any

from dra_gpu.devices import health, mig, model
from dra_gpu.devices.nvml import instances, session

log = logging.getLogger(__name__)
EVENT_WAIT_MS = 1000
"""How long one nvmlEventSetWait_v2 blocks: the longest ``aclose()`` waits for the thread."""
MAX_QUEUED_FAULTS = 1024
"""Faults kept between two ``faults()`` calls; older ones are dropped (a storm of one XID)."""
WATCH_RESTART_SECONDS = 60.0
"""An event thread that ended (NVML gave no event set) is started again at most this often."""
NO_INSTANCE = 0xFFFFFFFF
"""``nvmlEventData_t.gpuInstanceId`` of an event not attributable to one MIG GPU instance."""


@dataclasses.dataclass(frozen=True)
class Reading:
    """A GPU as last read well: its device, and its MIG table if it was in MIG mode."""

    device: model.Device
    table: mig.MigTable | None


class HealthWatch(instances.MigManagement):
    """The faults of the node's GPUs: NVML's events, and polls of lost GPUs and recovery."""

    def __init__(
        self, node: str, nvml: session.NvmlApi | None = None, xids: health.XidPolicy | None = None
    ) -> None:
        super().__init__(node, nvml)
        self.xids = xids or health.XidPolicy()
        self._events: collections.deque[health.Fault | health.Reset] = collections.deque(
            maxlen=MAX_QUEUED_FAULTS
        )
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        self._watching = threading.Event()  # set once the event set is registered (tests wait)
        self._watch_started = 0.0  # time.monotonic() of the last start of the event thread
        self._known: dict[int, Reading] = {}
        """NVML index -> the GPU as last read: a lost GPU is published from it (tainted)."""
        self._last_inventory: model.Inventory | None = None
        self._lost: set[int] = set()  # GPUs the last health poll found lost
        self._recovery: dict[int, int] = {}  # the last recovery action NVML reported per GPU
        self._monitored: dict[str, bool] = {}  # GPU -> its events registered (the event thread)

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
            if session.error_code(err) == nvml.NVML_ERROR_GPU_IS_LOST or index in self._known:
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
                    if session.error_code(err) == nvml.NVML_ERROR_GPU_IS_LOST:
                        log.warning("node %s: NVML events: a GPU is lost (%s)", self.node, err)
                    elif session.error_code(err) != nvml.NVML_ERROR_TIMEOUT:
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
                found = self._instances_of(index, handle)
        except model.InventoryError as err:
            log.warning("node %s: the MIG instances of GPU %d: %s", self.node, index, err)
            return None
        placements = {i.placement for i in found if i.gpu_instance == gpu_instance}
        inventory = self._last_inventory
        if not placements or inventory is None:
            return None
        for device in inventory.devices:
            if mig.placement_of(device) in placements:
                return device.name
        return None

    def _is_lost(self, index: int) -> bool:
        nvml = self._nvml
        try:
            nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        except nvml.NVMLError as err:
            return session.error_code(err) == nvml.NVML_ERROR_GPU_IS_LOST or index in self._known
        return False

    def _stop_watching_blocking(self) -> None:
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2 * EVENT_WAIT_MS / 1000)
            self._watcher = None


def _handle_key(handle: Any) -> Any:
    """What identifies an NVML device handle: the address a ctypes pointer holds (each call
    returns a new pointer object to the same device), else the handle itself (a fake's)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle

"""Device health on this node: the backend's faults -> taints, Events, metrics, health stream.

Every ``poll_seconds`` the monitor collects the backend's faults (NVML events queued by its
thread, a lost GPU, NVML's recovery action, the simulated faults file) and resets, and gives
them to ``devices.health``'s tracker, which decides the taints and when they clear (after the
quiet period; a reset-needing one when the GPU is reset). On a change, and only then, it asks the
publisher for a new pool generation (the publisher reads ``taints(devices)``: a MIG partition
carries its GPU's taints too), posts a Warning Event on the Node and on the claims holding the
device (or a partition of it) for a new taint (a Normal one when it clears), updates
``dra_gpu_device_health`` and ``dra_gpu_device_faults_total``, and wakes the kubelet's health
streams (``server.HealthServicer`` waits on ``changed``). ``dra_gpu_device_health_monitored``
says which devices the backend watches (``health.Monitored``).

Operator clear: a reset-needing taint also goes when the Node carries the annotation
``<driver>/gpu-reset.<device>: <RFC 3339 time>`` (``kubectl annotate --overwrite node NODE
gpu.example.com/gpu-reset.gpu-0=$(date -u +%Y-%m-%dT%H:%M:%SZ)``) with a time at or after the
taint's: "this GPU was reset then". The Node is read for it only while a device holds such a
taint, at most every ``clear_check_seconds``; a fault that goes on (a GPU still lost) taints again.

It owns no devices and does no NVML itself: a backend failure is logged and tried again on the
next poll, never ends the agent (a broken faults file must not stop prepares).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NoReturn, Protocol

from dra_gpu import kube
from dra_gpu.agent.claims import health_condition
from dra_gpu.devices import health, model
from dra_gpu.kube import events
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
COMPONENT = "dra-gpu-agent"
UNHEALTHY_REASON = "DeviceUnhealthy"
RECOVERED_REASON = "DeviceRecovered"
CLEAR_ANNOTATION = "gpu-reset."
"""``<driver>/gpu-reset.<device>`` on the Node: the operator says the device was reset then."""


@dataclasses.dataclass(frozen=True)
class ClaimOnDevice:
    """A claim this agent prepared, and the devices of this node's pool it holds."""

    namespace: str
    name: str
    uid: str
    devices: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    """One device as the kubelet's health stream reports it."""

    device: str
    healthy: bool
    message: str
    since: int
    """Unix seconds: when the device's current state began (its taint's timeAdded)."""


class HealthSource(Protocol):
    """What ``server.HealthServicer`` streams: reports, and a condition notified on change."""

    changed: asyncio.Condition
    version: int

    async def device_reports(self) -> list[DeviceReport]: ...


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class HealthMonitor:
    def __init__(
        self,
        api: kube.Kube | None,
        backend: model.Backend,
        *,
        driver: str,
        node: str,
        quiet_seconds: float,
        poll_seconds: float = 2.0,
        on_change: Callable[[], None] = lambda: None,
        inventory: Callable[[], Awaitable[model.Inventory]] | None = None,
        claims: Callable[[], Iterable[ClaimOnDevice]] = tuple,
        on_device_health: Callable[[str, dict[str, Any]], None] = lambda device, condition: None,
        clock: Callable[[], datetime.datetime] = _now,
        clear_check_seconds: float = 10.0,
    ) -> None:
        self.api = api
        self.backend = backend
        self.driver = driver
        self.node = node
        self.poll_seconds = poll_seconds
        self.on_change = on_change
        """Called after every change of the taints (the publisher's ``trigger``)."""
        self.inventory = inventory
        """The devices to report metrics for (the publisher's last inventory)."""
        self.claims = claims
        """The prepared claims (from the checkpoint): each gets the Event of its devices too."""
        self.on_device_health = on_device_health
        """Told each changed device's ``Healthy`` condition (for the claims' status.devices)."""
        self.clock = clock
        self.tracker = health.HealthTracker(driver, quiet_seconds)
        self.changed = asyncio.Condition()
        """Notified after every change; the health streams wait on it."""
        self.version = 0
        """Counts changes, so a waiter can tell whether it missed one."""
        self._states: dict[str, str] = {}
        self._monitored: dict[str, bool] = {}
        self._started = clock()
        self.clear_check_seconds = clear_check_seconds
        self._clear_checked: datetime.datetime | None = None
        self._bad_clears: set[str] = set()
        self._devices: tuple[model.Device, ...] = ()
        for cause in health.CAUSES:
            metrics.DEVICE_FAULTS.labels(node, cause)
        for change in ("added", "cleared"):
            metrics.DEVICE_TAINT_CHANGES.labels(node, change)

    def taints(
        self, devices: Iterable[model.Device] | None = None
    ) -> Mapping[str, tuple[health.Taint, ...]]:
        """Device name -> its taints: its own and, for a MIG partition of ``devices`` (the
        inventory about to be published; default the last one seen), its GPU's."""
        if devices is not None:
            self._learn(tuple(devices))
        return self.tracker.taints()

    def _learn(self, devices: tuple[model.Device, ...]) -> None:
        self._devices = devices
        self.tracker.parents = {d.name: d.partition_of for d in devices if d.partition_of}

    async def _read_inventory(self) -> tuple[model.Device, ...]:
        if self.inventory is not None:
            try:
                self._learn((await self.inventory()).devices)
            except Exception as exc:  # reported by the publisher, which reads the same
                log.debug("no inventory for device health: %s", exc)
        return self._devices

    async def device_reports(self) -> list[DeviceReport]:
        """Every device of the inventory (and any tainted one), unhealthy if it has a taint:
        a degraded device (NoSchedule) may still run its pods, but they are told."""
        names = [d.name for d in await self._read_inventory()]
        taints = self.tracker.taints()
        names += [n for n in taints if n not in names]
        started = int(self._started.timestamp())
        reports = []
        for name in names:
            fault = self.tracker.fault_of(name)
            if fault is None or not taints.get(name):
                reports.append(DeviceReport(name, True, "", started))
                continue
            since = min(t.time_added for t in taints[name])
            listed = ", ".join(map(str, taints[name]))
            message = f"{fault.message} at {health.format_time(since)}; tainted {listed}"
            reports.append(DeviceReport(name, False, message, int(since.timestamp())))
        return reports

    async def run_forever(self) -> NoReturn:
        while True:
            try:
                await self.check_once()
            except Exception as exc:  # a bad faults file, NVML hiccup: try again next time
                log.warning("collecting the device faults of node %s failed: %s", self.node, exc)
            await asyncio.sleep(self.poll_seconds)

    async def check_once(self) -> list[health.Change]:
        """Collect faults, update taints; returns what changed."""
        faults = await self.backend.faults()
        await self._read_inventory()  # partitions: a GPU's reset and taints reach them
        now = self.clock()
        changes = self.tracker.observe(faults, now) + self.tracker.expire(now)
        changes += await self._operator_clears(now)
        await self._update_metrics()
        if not changes:
            return changes
        for change in changes:
            await self._report(change, now)
        self.on_change()
        async with self.changed:
            self.version += 1
            self.changed.notify_all()
        return changes

    async def _operator_clears(self, now: datetime.datetime) -> list[health.Change]:
        """Reset-needing taints an operator cleared with the Node annotation (read only while
        there are such taints, at most every ``clear_check_seconds``)."""
        held = self.tracker.held()
        if self.api is None or not held:
            return []
        checked = self._clear_checked
        if checked is not None and (now - checked).total_seconds() < self.clear_check_seconds:
            return []
        self._clear_checked = now
        try:
            node = await self.api.get(f"/api/v1/nodes/{self.node}")
        except Exception as exc:  # the API restarting: the next check reads it again
            log.warning("reading Node %s for cleared device taints failed: %s", self.node, exc)
            return []
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        prefix = f"{self.driver}/{CLEAR_ANNOTATION}"
        changes: list[health.Change] = []
        for key, value in annotations.items():
            device = key.removeprefix(prefix)
            if not key.startswith(prefix) or device not in held:
                continue
            try:
                when = health.parse_time(str(value))
            except ValueError as err:
                if f"{key}={value}" not in self._bad_clears:
                    self._bad_clears.add(f"{key}={value}")
                    log.warning("Node %s: annotation %s: %s; no taint cleared", self.node, key, err)
                continue
            reason = f"an operator cleared it (Node annotation {key}={value})"
            changes += self.tracker.reset(device, now, reason=reason, before=when)
        return changes

    async def _update_metrics(self) -> None:
        names: set[str] = set(self.tracker.taints()) | {d.name for d in self._devices}
        # A backend without the capability sees the faults of every device (the simulated
        # faults file names any of them).
        monitored = self.backend.monitored() if isinstance(self.backend, health.Monitored) else {}
        parents = self.tracker.parents
        for name in {d.name for d in self._devices}:
            watched = monitored.get(parents.get(name, name), True)
            if self._monitored.get(name) != watched:
                metrics.DEVICE_MONITORED.labels(self.node, name).set(int(watched))
                self._monitored[name] = watched
        for name in names:
            state = self.tracker.state(name)
            if self._states.get(name) == state:
                continue
            for each in health.STATES:
                metrics.DEVICE_HEALTH.labels(self.node, name, each).set(int(each == state))
            self._states[name] = state

    async def _report(self, change: health.Change, now: datetime.datetime) -> None:
        taint = change.taint
        device = f"{self.node}/{change.device}"
        when = health.format_time(taint.time_added)
        quiet = f"{self.tracker.quiet.total_seconds():g}s"
        metrics.DEVICE_TAINT_CHANGES.labels(self.node, "added" if change.added else "cleared").inc()
        if change.added:
            assert change.fault is not None
            metrics.DEVICE_FAULTS.labels(self.node, change.fault.cause).inc()
            type_, reason = "Warning", UNHEALTHY_REASON
            message = f"{device}: {change.fault.message} at {when}: tainted {taint} until "
            if change.fault.until_reset:
                message += "the GPU is reset (NVML reports it) or an operator clears it "
                message += f"(Node annotation {self.driver}/{CLEAR_ANNOTATION}{change.device}"
                message += "=<time of the reset>)"
            else:
                message += f"it has been quiet for {quiet}"
        else:
            type_, reason = "Normal", RECOVERED_REASON
            message = f"{device}: taint {taint} (since {when}) cleared at "
            why = f"no fault for {quiet}" if change.reason in ("", "quiet") else change.reason
            message += f"{health.format_time(now)}: {why}"
        log.log(logging.WARNING if change.added else logging.INFO, "%s", message)
        taints = self.tracker.taints()
        affected = {change.device} | {
            p for p, parent in self.tracker.parents.items() if parent == change.device
        }
        for name in sorted(affected):
            remaining = taints.get(name) or ()
            self.on_device_health(
                name,
                health_condition(
                    not remaining,
                    UNHEALTHY_REASON if remaining else RECOVERED_REASON,
                    message,
                    min(t.time_added for t in remaining) if remaining else now,
                ),
            )
        if self.api is None:
            return
        regarding = [
            {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": await self._node_uid()}
        ]
        regarding += [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "namespace": claim.namespace,
                "name": claim.name,
                "uid": claim.uid,
            }
            for claim in self.claims()
            if affected & set(claim.devices)
        ]
        recorder = events.Recorder(self.api, COMPONENT, self.node)
        for ref in regarding:
            await recorder.post(ref, type_=type_, reason=reason, message=message)

    async def _node_uid(self) -> str:
        assert self.api is not None
        try:
            node = await self.api.get(f"/api/v1/nodes/{self.node}")
            return str(node["metadata"]["uid"])
        except Exception:  # the Event is best effort; the log line says it already
            return ""

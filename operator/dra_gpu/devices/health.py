"""Device health: faults a backend observed -> device taints that the agent publishes and clears.

Pure logic: no clock (every call is given ``now``), no I/O. Backends report ``Fault``s (NVML
events, the simulated backend's faults file); ``HealthTracker`` keeps, per device, the taints
they imply and clears each one only after ``quiet_seconds`` without the fault it names. That is
the flapping rule: a device that faults every few seconds stays tainted, and a taint is never
removed less than ``quiet_seconds`` after the fault behind it last showed.

Causes, taint keys and values (``<driver>`` is the DRA driver name, e.g. ``gpu.example.com``)::

    cause  key             value         severity (effect)
    xid    <driver>/xid    the XID, "79" by XidPolicy: fatal (NoExecute), degraded
                                         (NoSchedule) or ignored (no taint)
    ecc    <driver>/ecc    "double-bit"  fatal (NoExecute): an uncorrectable memory error
    lost   <driver>/lost   "true"        fatal (NoExecute): the GPU does not answer

A device's taint of one cause keeps its ``timeAdded`` while the fault repeats with the same
effect; an escalation (degraded -> fatal) is a new taint, with a new ``timeAdded``.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterable, Mapping

CAUSES = ("xid", "ecc", "lost")
"""Every cause a fault can have: the label values of ``dra_gpu_device_faults_total``."""
STATES = ("healthy", "degraded", "fatal")
"""A device's health: the label values of ``dra_gpu_device_health``."""

DEFAULT_FATAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
"""XIDs after which the GPU cannot be trusted with running work: double-bit ECC (48), internal
microcontroller halt (61, 62), row-remapping events (63, 64), NVLink error (74), fallen off the
bus (79), high single-bit ECC rate (92), contained/uncontained ECC (94, 95), GSP errors (119,
120), unrecovered ECC (140)."""
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs an application causes (illegal address, MMU fault from user code, a killed or stopped
context, preemption): they say nothing about the GPU, as NVIDIA's device plugin also treats
them. Any other XID marks the device degraded."""


class Severity(enum.Enum):
    """How bad a fault is, in increasing order; the taint effect it publishes."""

    DEGRADED = "degraded"
    FATAL = "fatal"

    @property
    def effect(self) -> str:
        return "NoExecute" if self is Severity.FATAL else "NoSchedule"

    @property
    def rank(self) -> int:
        return 2 if self is Severity.FATAL else 1


@dataclasses.dataclass(frozen=True)
class Fault:
    """One observation of something wrong with one device."""

    device: str
    cause: str  # one of CAUSES
    value: str  # the taint value: "79", "double-bit", "true"
    severity: Severity
    message: str
    """For people: what NVML (or the faults file) said, e.g. "XID 79 (NVML)"."""

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"fault cause {self.cause!r} is not one of {', '.join(CAUSES)}")


@dataclasses.dataclass(frozen=True)
class XidPolicy:
    """Which XIDs are fatal, which are ignored; every other XID is degraded."""

    fatal: frozenset[int] = DEFAULT_FATAL_XIDS
    ignored: frozenset[int] = DEFAULT_IGNORED_XIDS

    def __post_init__(self) -> None:
        both = sorted(self.fatal & self.ignored)
        if both:
            raise ValueError(f"XIDs {both} are listed both as fatal and as ignored")

    @classmethod
    def parse(cls, fatal: str | None, ignored: str | None) -> XidPolicy:
        """From comma-separated lists ("48,79"); None keeps the default, "" means none."""
        return cls(
            fatal=DEFAULT_FATAL_XIDS if fatal is None else parse_xids(fatal, "fatal"),
            ignored=DEFAULT_IGNORED_XIDS if ignored is None else parse_xids(ignored, "ignored"),
        )

    def classify(self, xid: int) -> Severity | None:
        if xid in self.ignored:
            return None
        return Severity.FATAL if xid in self.fatal else Severity.DEGRADED

    def fault(self, device: str, xid: int, message: str = "") -> Fault | None:
        """The fault an XID on ``device`` means; None for an ignored XID."""
        severity = self.classify(xid)
        if severity is None:
            return None
        return Fault(device, "xid", str(xid), severity, message or f"XID {xid}")


def parse_xids(text: str, what: str) -> frozenset[int]:
    xids: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 1 << 32:
            raise ValueError(f"{what} XIDs: {part!r} is not an XID (a positive number)")
        xids.add(int(part))
    return frozenset(xids)


def ecc_fault(device: str, message: str = "") -> Fault:
    return Fault(device, "ecc", "double-bit", Severity.FATAL, message or "double-bit ECC error")


def lost_fault(device: str, message: str = "") -> Fault:
    return Fault(device, "lost", "true", Severity.FATAL, message or "the GPU is lost")


@dataclasses.dataclass(frozen=True)
class Taint:
    """A ResourceSlice device taint (``resource.k8s.io/v1`` ``DeviceTaint``)."""

    key: str
    value: str
    effect: str  # NoSchedule | NoExecute
    time_added: datetime.datetime

    def to_api(self) -> dict[str, str]:
        """As the API server returns it: ``timeAdded`` is RFC 3339 in whole seconds, UTC."""
        return {
            "key": self.key,
            "value": self.value,
            "effect": self.effect,
            "timeAdded": format_time(self.time_added),
        }

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"


def format_time(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Change:
    """A taint that appeared (``added``) or was cleared on a device."""

    device: str
    taint: Taint
    added: bool
    fault: Fault | None = None
    """The fault behind an added taint."""


@dataclasses.dataclass
class _Active:
    taint: Taint
    severity: Severity
    last_seen: datetime.datetime
    fault: Fault


class HealthTracker:
    """The taints of one node's devices, from the faults observed so far.

    ``observe`` records faults (a repeated fault extends its taint), ``expire`` clears the taints
    whose fault has been quiet for ``quiet_seconds``; both return what changed, so the caller
    publishes a new pool generation, posts Events and updates metrics only on a change.
    """

    def __init__(self, driver: str, quiet_seconds: float) -> None:
        if quiet_seconds < 0:
            raise ValueError(f"the quiet period must not be negative, got {quiet_seconds}")
        self.driver = driver
        self.quiet = datetime.timedelta(seconds=quiet_seconds)
        self._active: dict[str, dict[str, _Active]] = {}  # device -> cause -> taint

    def observe(self, faults: Iterable[Fault], now: datetime.datetime) -> list[Change]:
        changes: list[Change] = []
        now = now.replace(microsecond=0)  # what the API keeps of timeAdded
        for fault in faults:
            causes = self._active.setdefault(fault.device, {})
            current = causes.get(fault.cause)
            if current is not None and current.severity.rank >= fault.severity.rank:
                current.last_seen = now
                continue  # the same or a lesser fault again: the taint stays as it is
            if current is not None:
                changes.append(Change(fault.device, current.taint, added=False))
            taint = Taint(
                f"{self.driver}/{fault.cause}", fault.value, fault.severity.effect, time_added=now
            )
            causes[fault.cause] = _Active(taint, fault.severity, now, fault)
            changes.append(Change(fault.device, taint, added=True, fault=fault))
        return changes

    def expire(self, now: datetime.datetime) -> list[Change]:
        changes: list[Change] = []
        for device, causes in list(self._active.items()):
            for cause, active in list(causes.items()):
                if now - active.last_seen >= self.quiet:
                    del causes[cause]
                    changes.append(Change(device, active.taint, added=False))
            if not causes:
                del self._active[device]
        return changes

    def taints(self) -> Mapping[str, tuple[Taint, ...]]:
        """Device name -> its taints, in the order of ``CAUSES``."""
        return {
            device: tuple(causes[c].taint for c in CAUSES if c in causes)
            for device, causes in self._active.items()
        }

    def state(self, device: str) -> str:
        """One of ``STATES``: the worst severity of the device's taints."""
        causes = self._active.get(device)
        if not causes:
            return "healthy"
        return max((a.severity for a in causes.values()), key=lambda s: s.rank).value

    def fault_of(self, device: str) -> Fault | None:
        """The worst active fault of a device (for the kubelet's health message)."""
        causes = self._active.get(device)
        if not causes:
            return None
        return max(causes.values(), key=lambda a: a.severity.rank).fault

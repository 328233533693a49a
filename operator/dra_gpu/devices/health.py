"""Device health: faults a backend observed -> device taints that the agent publishes and clears.

Pure logic: no clock (every call is given ``now``), no I/O. Backends report ``Fault``s (NVML
events, a lost GPU, NVML's recovery action, the simulated backend's faults file) and ``Reset``s
(NVML says the GPU was reset); ``HealthTracker`` keeps, per device, the taints they imply.

Two kinds of taint, by what the fault means for the GPU:

- *until reset* (severity ``fatal``): NVIDIA's XID catalog says the GPU needs a reset or the node
  a reboot (``RESET_GPU``, ``RESTART_BM``, …), the GPU is lost, a double-bit ECC error, or NVML's
  recovery action asks for one. The taint stays, however quiet the GPU, until the backend reports
  the GPU reset (``Reset``: NVML's recovery action back to none, a lost GPU answering again) or an
  operator clears it (``HealthTracker.reset``; the agent reads a Node annotation for that).
- *until quiet* (severity ``degraded``): anything else that taints; cleared only after
  ``quiet_seconds`` without the fault (the flapping rule: a device that faults every few seconds
  stays tainted, and a taint is never removed sooner than that after the fault behind it).

Causes, taint keys and values (``<driver>`` is the DRA driver name, e.g. ``gpu.example.com``)::

    cause     key                value                       kept
    xid       <driver>/xid       the XID, "48"               by XID_CATALOG: until reset / quiet
    ecc       <driver>/ecc       "double-bit"                until reset
    lost      <driver>/lost      "true"                      until reset (the GPU answers again)
    recovery  <driver>/recovery  NVML's action, "gpu-reset"  while NVML reports it

The effect is ``NoSchedule`` (no new claim gets the device; running pods stay and are told
through the kubelet's health stream), as NVIDIA's DRA driver does for every fault. ``NoExecute``
(kube-controller-manager evicts every pod using the device, each sharer of a shared GPU too) is
opt-in: the XIDs an operator lists, or every until-reset fault with ``reset`` (``XidPolicy``).

A device's taint of one cause keeps its ``timeAdded`` while the fault repeats the same or less
severe; an escalation (quiet -> reset, NoSchedule -> NoExecute) is a new taint, with a new
``timeAdded``. A MIG partition carries its parent GPU's taints as well as its own (``inherit``):
a GPU-wide fault of a MIG-mode GPU taints every partition of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

CAUSES = ("xid", "ecc", "lost", "recovery")
"""Every cause a fault can have: the label values of ``dra_gpu_device_faults_total``."""
STATES = ("healthy", "degraded", "fatal")
"""A device's health: the label values of ``dra_gpu_device_health`` (fatal: until reset)."""
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"

# NVIDIA's XID catalog ("Analyzing Xid Errors with the Xid Catalog",
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and its spreadsheet
# Xid-Catalog.xlsx, read 2026-08 — the R610 edition, 172 XIDs), column "Resolution Bucket
# (Immediate Action)", for every XID the catalog applies to A100, H100, B100 or GB200. XIDs the
# catalog marks "Unused" on those GPUs, and XIDs newer than the catalog, are not listed: they
# taint NoSchedule until quiet, as an unknown fault should.
XID_CATALOG: Mapping[int, str] = {
    **dict.fromkeys((8, 11, 13, 25, 31, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72), "RESTART_APP"),
    **dict.fromkeys((75, 76, 77, 80, 82, 83, 84, 85, 86, 88, 89, 94), "RESTART_APP"),
    **dict.fromkeys((*range(96, 106), *range(126, 136), 139), "RESTART_APP"),
    **dict.fromkeys((14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 108), "IGNORE"),
    **dict.fromkeys((121, 137, 141, 152, 153, 157, 160, 161), "IGNORE"),
    **dict.fromkeys((46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143), "RESET_GPU"),
    **dict.fromkeys((155, 156, 158), "RESET_GPU"),
    45: "WORKFLOW_XID_45",  # preemptive cleanup after another XID: that one says what to do
    48: "WORKFLOW_XID_48",  # double-bit ECC: reset the GPU (drain first with XID 63/64)
    54: "CHECK_MECHANICALS",
    74: "WORKFLOW_NVLINK_ERR",  # the action depends on the link's error registers
    78: "UPDATE_SWFW",
    79: "RESTART_BM",  # fallen off the bus: restart the machine
    142: "CONTACT_SUPPORT",
    **dict.fromkeys(range(144, 151), "WORKFLOW_NVLINK5_ERR"),
    151: "RESTART_VM",
    154: "XID_154",  # "GPU recovery action changed": read through NVML's recovery action
    159: "CHECK_UVM",
    **dict.fromkeys(range(162, 173), "NONE"),  # listed without an action yet
}
NO_TAINT_ACTIONS = frozenset({"IGNORE", "RESTART_APP", "WORKFLOW_XID_45", "XID_154"})
"""Catalog actions that leave the GPU in service: the fault is contained to the application
that caused it (restarting it is the fix), so no other claim, no sharer, is disturbed."""
RESET_ACTIONS = frozenset({"RESET_GPU", "WORKFLOW_XID_48", "RESTART_BM", "RESTART_VM"})
"""Catalog actions after which the GPU cannot be trusted with work until it was reset (or the
machine restarted): their taint is kept until then."""
RESET_KEYWORD = "reset"
"""In ``--fatal-xids``: every until-reset fault (reset-needing XIDs, ECC, lost) is NoExecute."""


class Severity(enum.Enum):
    """How bad a fault is, in increasing order; also how its taint clears."""

    DEGRADED = "degraded"
    """Cleared after the quiet period."""
    FATAL = "fatal"
    """Kept until the GPU is reset (or an operator clears it)."""

    @property
    def rank(self) -> int:
        return 2 if self is Severity.FATAL else 1


@dataclasses.dataclass(frozen=True)
class Fault:
    """One observation of something wrong with one device."""

    device: str
    cause: str  # one of CAUSES
    value: str  # the taint value: "79", "double-bit", "true", "gpu-reset"
    severity: Severity
    message: str
    """For people: what NVML (or the faults file) said, e.g. "XID 79 (NVML)"."""
    effect: str = NO_SCHEDULE

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"fault cause {self.cause!r} is not one of {', '.join(CAUSES)}")
        if self.effect not in (NO_SCHEDULE, NO_EXECUTE):
            raise ValueError(f"taint effect {self.effect!r} is not NoSchedule or NoExecute")

    @property
    def until_reset(self) -> bool:
        return self.severity is Severity.FATAL


@dataclasses.dataclass(frozen=True)
class Reset:
    """The backend saw the device reset: its until-reset taints (and its partitions') go."""

    device: str
    message: str


Observation = Fault | Reset


@dataclasses.dataclass(frozen=True)
class XidPolicy:
    """What an XID does: NVIDIA's catalog, plus the operator's two lists.

    ``no_execute``: XIDs whose taint is NoExecute (``--fatal-xids``); ``reset_no_execute``: every
    until-reset fault is NoExecute (the keyword ``reset`` in that list). ``ignored``: XIDs that
    taint nothing, on top of the catalog's (``--ignored-xids``)."""

    no_execute: frozenset[int] = frozenset()
    ignored: frozenset[int] = frozenset()
    reset_no_execute: bool = False

    def __post_init__(self) -> None:
        both = sorted(self.no_execute & self.ignored)
        if both:
            raise ValueError(f"XIDs {both} are listed both as fatal and as ignored")

    @classmethod
    def parse(cls, fatal: str | None, ignored: str | None) -> XidPolicy:
        """From comma-separated lists ("48,79", "reset"); None or "" means none."""
        words = {w for w in (fatal or "").replace(" ", "").split(",") if w}
        reset = RESET_KEYWORD in words
        words.discard(RESET_KEYWORD)
        return cls(
            no_execute=parse_xids(",".join(sorted(words)), "fatal"),
            ignored=parse_xids(ignored or "", "ignored"),
            reset_no_execute=reset,
        )

    def action(self, xid: int) -> str | None:
        """The catalog's immediate action for ``xid``; None for an XID it does not list."""
        return XID_CATALOG.get(xid)

    def classify(self, xid: int) -> Severity | None:
        """None: no taint; DEGRADED: until quiet; FATAL: until reset."""
        action = XID_CATALOG.get(xid)
        if xid in self.ignored or (action in NO_TAINT_ACTIONS and xid not in self.no_execute):
            return None
        return Severity.FATAL if action in RESET_ACTIONS else Severity.DEGRADED

    def effect(self, severity: Severity, xid: int | None = None) -> str:
        if xid is not None and xid in self.no_execute:
            return NO_EXECUTE
        if severity is Severity.FATAL and self.reset_no_execute:
            return NO_EXECUTE
        return NO_SCHEDULE

    def fault(self, device: str, xid: int, message: str = "") -> Fault | None:
        """The fault an XID on ``device`` means; None for an XID that taints nothing."""
        severity = self.classify(xid)
        if severity is None:
            return None
        action = XID_CATALOG.get(xid)
        text = message or f"XID {xid}"
        text += f" (NVIDIA's catalog: {action})" if action else " (not in NVIDIA's catalog)"
        return Fault(device, "xid", str(xid), severity, text, self.effect(severity, xid))

    def ecc_fault(self, device: str, message: str = "") -> Fault:
        message = message or "double-bit ECC error"
        return Fault(device, "ecc", "double-bit", Severity.FATAL, message, self._reset_effect)

    def lost_fault(self, device: str, message: str = "") -> Fault:
        message = message or "the GPU is lost"
        return Fault(device, "lost", "true", Severity.FATAL, message, self._reset_effect)

    def recovery_fault(self, device: str, action: str, message: str = "") -> Fault:
        """NVML's recovery action for the GPU is ``action`` (not none): kept while it is."""
        message = message or f"NVML asks for recovery action {action}"
        return Fault(device, "recovery", action, Severity.FATAL, message, self._reset_effect)

    @property
    def _reset_effect(self) -> str:
        return NO_EXECUTE if self.reset_no_execute else NO_SCHEDULE

    def notes(self) -> list[str]:
        """What an operator should hear about these settings (logged once at start)."""
        notes = []
        contained = sorted(x for x in self.no_execute if XID_CATALOG.get(x) in NO_TAINT_ACTIONS)
        if contained:
            listed = ", ".join(f"{x} ({XID_CATALOG[x]})" for x in contained)
            notes.append(
                f"--fatal-xids lists XIDs NVIDIA's catalog contains to the application: {listed}; "
                "each evicts every pod on the GPU (a shared GPU's sharers too). The default is "
                "none: every reset-needing XID taints NoSchedule until the GPU is reset"
            )
        return notes


def parse_xids(text: str, what: str) -> frozenset[int]:
    xids: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 1 << 32:
            raise ValueError(f"{what} XIDs: {part!r} is not an XID (a positive number)")
        xids.add(int(part))
    return frozenset(xids)


# NVML's nvmlDeviceGpuRecoveryAction_t (nvml.h), as taint values.
RECOVERY_ACTIONS = {
    1: "gpu-reset",
    2: "node-reboot",
    3: "drain-p2p",
    4: "drain-and-reset",
    5: "recover-imex-domain",
    6: "bus-reset",
    7: "system-reboot",
}


@runtime_checkable
class Monitored(Protocol):
    """An optional backend capability: which GPUs its fault detection covers."""

    def monitored(self) -> Mapping[str, bool]:
        """GPU device name -> whether faults of it are seen (False: registration refused)."""
        ...


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


def parse_time(text: str) -> datetime.datetime:
    """RFC 3339 ("2026-03-01T12:05:00Z"); ValueError naming the text."""
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time (e.g. 2026-03-01T12:05:00Z)") from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (e.g. 2026-03-01T12:05:00Z)")
    return when


def inherit(
    taints: Mapping[str, tuple[Taint, ...]], parents: Mapping[str, str]
) -> dict[str, tuple[Taint, ...]]:
    """Each device's taints with its parent GPU's after them: ``parents`` maps a MIG partition
    to its whole GPU. A key the partition has itself keeps the partition's own taint (the API
    allows one taint per key and effect, and the partition's is the more specific)."""
    out = {device: tuple(own) for device, own in taints.items() if own}
    for partition, parent in parents.items():
        inherited = taints.get(parent) or ()
        if not inherited:
            continue
        own = taints.get(partition) or ()
        have = {(t.key, t.effect) for t in own}
        out[partition] = (*own, *(t for t in inherited if (t.key, t.effect) not in have))
    return out


@dataclasses.dataclass(frozen=True)
class Change:
    """A taint that appeared (``added``) or was cleared on a device."""

    device: str
    taint: Taint
    added: bool
    fault: Fault | None = None
    """The fault behind an added taint."""
    reason: str = ""
    """Why a taint was cleared: "quiet" (the quiet period), or what reset the device."""


@dataclasses.dataclass
class _Active:
    taint: Taint
    fault: Fault
    last_seen: datetime.datetime

    @property
    def rank(self) -> tuple[int, int]:
        return (self.fault.severity.rank, int(self.fault.effect == NO_EXECUTE))


class HealthTracker:
    """The taints of one node's devices, from the faults observed so far.

    ``observe`` records faults (a repeated fault extends its taint) and resets; ``expire`` clears
    the until-quiet taints whose fault has been quiet for ``quiet_seconds``; ``reset`` clears a
    device's taints on an operator's word. Each returns what changed, so the caller publishes a
    new pool generation, posts Events and updates metrics only on a change.
    """

    def __init__(self, driver: str, quiet_seconds: float) -> None:
        if quiet_seconds < 0:
            raise ValueError(f"the quiet period must not be negative, got {quiet_seconds}")
        self.driver = driver
        self.quiet = datetime.timedelta(seconds=quiet_seconds)
        self._active: dict[str, dict[str, _Active]] = {}  # device -> cause -> taint
        self.parents: Mapping[str, str] = {}
        """MIG partition -> its whole GPU (from the inventory): a reset of the GPU resets them
        too, and ``taints()`` gives them the GPU's taints."""

    def observe(self, observed: Iterable[Observation], now: datetime.datetime) -> list[Change]:
        changes: list[Change] = []
        now = now.replace(microsecond=0)  # what the API keeps of timeAdded
        for seen in observed:
            if isinstance(seen, Reset):
                changes += self.reset(seen.device, now, reason=seen.message)
                continue
            causes = self._active.setdefault(seen.device, {})
            current = causes.get(seen.cause)
            candidate = _Active(Taint("", "", "", now), seen, now)
            if current is not None and current.rank >= candidate.rank:
                current.last_seen = now
                continue  # the same or a lesser fault again: the taint stays as it is
            if current is not None:
                changes.append(Change(seen.device, current.taint, added=False, reason="escalated"))
            taint = Taint(f"{self.driver}/{seen.cause}", seen.value, seen.effect, time_added=now)
            causes[seen.cause] = _Active(taint, seen, now)
            changes.append(Change(seen.device, taint, added=True, fault=seen))
        return changes

    def expire(self, now: datetime.datetime) -> list[Change]:
        changes: list[Change] = []
        for device, causes in list(self._active.items()):
            for cause, active in list(causes.items()):
                if active.fault.until_reset:
                    continue  # a reset-needing fault is not over because it went quiet
                if now - active.last_seen >= self.quiet:
                    del causes[cause]
                    changes.append(Change(device, active.taint, added=False, reason="quiet"))
            if not causes:
                del self._active[device]
        return changes

    def reset(
        self,
        device: str,
        now: datetime.datetime,
        *,
        reason: str,
        before: datetime.datetime | None = None,
    ) -> list[Change]:
        """Clear the taints of ``device`` and of its partitions (a GPU reset takes every MIG
        instance with it) — only those added at or before ``before`` if given (an operator's
        clear names the time of the reset: a fault seen since is a new one)."""
        changes: list[Change] = []
        family = [device, *(p for p, parent in self.parents.items() if parent == device)]
        for name in family:
            causes = self._active.get(name, {})
            for cause, active in list(causes.items()):
                if before is not None and active.taint.time_added > before:
                    continue
                del causes[cause]
                changes.append(Change(name, active.taint, added=False, reason=reason))
            if name in self._active and not causes:
                del self._active[name]
        return changes

    def held(self) -> set[str]:
        """Devices with a taint kept until reset."""
        return {
            device
            for device, causes in self._active.items()
            if any(a.fault.until_reset for a in causes.values())
        }

    def own_taints(self) -> Mapping[str, tuple[Taint, ...]]:
        """Device name -> the taints of its own faults, in the order of ``CAUSES``."""
        return {
            device: tuple(causes[c].taint for c in CAUSES if c in causes)
            for device, causes in self._active.items()
            if causes
        }

    def taints(self) -> Mapping[str, tuple[Taint, ...]]:
        """Device name -> its taints: its own, then (a MIG partition) its GPU's."""
        return inherit(self.own_taints(), self.parents)

    def _faults(self, device: str) -> list[_Active]:
        found = list(self._active.get(device, {}).values())
        parent = self.parents.get(device)
        if parent is not None:
            found += self._active.get(parent, {}).values()
        return found

    def state(self, device: str) -> str:
        """One of ``STATES``: the worst severity of the device's taints (its GPU's included)."""
        found = self._faults(device)
        if not found:
            return "healthy"
        return max((a.fault.severity for a in found), key=lambda s: s.rank).value

    def fault_of(self, device: str) -> Fault | None:
        """The worst active fault of a device or its GPU (for the kubelet's health message)."""
        found = self._faults(device)
        if not found:
            return None
        return max(found, key=lambda a: a.rank).fault


def ecc_fault(device: str, message: str = "") -> Fault:
    """A double-bit ECC error under the default policy (NoSchedule until reset)."""
    return XidPolicy().ecc_fault(device, message)


def lost_fault(device: str, message: str = "") -> Fault:
    """A lost GPU under the default policy (NoSchedule until it answers again)."""
    return XidPolicy().lost_fault(device, message)

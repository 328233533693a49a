"""What an explanation says: the result vocabulary, and how pieces of several requests combine.

Owns: ``Reason`` (in order of importance: when several requests miss pieces, the claim's
message names the most important first: class > selectors > devices published > fit >
allocation > node > driver), ``Verdict`` (one device to one request), the tutorial's four
``Piece``s (class, devices, node, driver) and the frozen results ``DeviceVerdict``,
``RequestExplanation`` and ``Explanation``, and ``to_dict``, the one JSON form of an
explanation (``dra-gpu explain -o json|yaml``; documented in docs/troubleshooting.md and stable:
keys are added, never renamed or removed).
Must not: work anything out from API bodies; the other modules of ``explain`` do.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from dra_gpu.controller.explain import wording

PIECE_NAMES = ("class", "devices", "node", "driver")


class Reason(enum.StrEnum):
    """Short machine reasons for Events and metric labels, most important first."""

    CLAIM_DELETING = "ClaimDeleting"
    DEVICE_CLASS_MISSING = "DeviceClassMissing"
    SELECTOR_INVALID = "SelectorInvalid"  # a class or request selector does not compile
    NO_DEVICES_PUBLISHED = "NoDevicesPublished"  # no device of the class is published
    POOL_INCOMPLETE = "PoolIncomplete"  # ...except possibly in pools still being written
    SELECTOR_ERROR = "SelectorError"  # CEL runtime error on a device: the scheduler errors out
    NO_DEVICE_FITS = "NoDeviceFits"  # devices of the class exist, none passes the selectors
    NOT_ENOUGH_DEVICES = "NotEnoughDevices"  # some fit, but never `count` of them on one node
    DEVICES_ALLOCATED = "DevicesAllocated"  # enough fit, but other claims hold them
    DEVICES_TAINTED = "DevicesTainted"  # enough fit, but taints the claim does not tolerate
    NODE_EXCLUDED = "NodeExcluded"  # free fitting devices only on nodes the pod cannot use
    NO_COMMON_NODE = "NoCommonNode"  # every request fits somewhere, but not all on one node
    DRIVER_NOT_READY = "DriverNotReady"  # the kubelet could not prepare (a PrepareFailure)
    SATISFIABLE = "Satisfiable"  # no missing piece found: it is the scheduler's move
    ALLOCATED = "Allocated"  # nothing to explain
    PREPARED = "Prepared"  # a claim explained as DriverNotReady was prepared: its pod runs
    FITS = "Fits"  # per request only: this request can be satisfied on its own


SEVERITY = {reason: rank for rank, reason in enumerate(Reason)}
"""Reason -> its rank: lower is more important."""


class Verdict(enum.StrEnum):
    """What one published device is to one request; checks run in this order."""

    OTHER_CLASS = "other-class"  # a class selector rules it out: not a candidate at all
    ERROR = "error"  # a selector failed to evaluate on it
    MISMATCH = "mismatch"  # of the class, but a request selector rules it out
    ALLOCATED = "allocated"  # passes, but another claim holds it
    COUNTERS = "counters"  # passes, but allocated partitions used up counters it consumes
    CAPACITY = "capacity"  # passes, a shared device, but its shares leave too little
    TAINTED = "tainted"  # passes, but has a taint the request does not tolerate
    EXCLUDED = "excluded"  # the pod cannot run on its node
    FITS = "fits"


@dataclasses.dataclass(frozen=True)
class Piece:
    """One of the tutorial's four pieces: class, devices, node, driver."""

    name: str
    satisfied: bool | None
    """True: present; False: missing; None: not checked because an earlier piece is missing."""
    reason: str

    @property
    def status(self) -> str:
        return {True: "OK", False: "NO", None: "--"}[self.satisfied]


@dataclasses.dataclass(frozen=True)
class DeviceVerdict:
    """One published device as one request sees it."""

    driver: str
    pool: str
    device: str
    node: str | None
    """The node the device is attached to; None for devices of allNodes/nodeSelector slices."""
    verdict: Verdict
    text: str
    """Plain words, starting with the device: "node-01/gpu-1 has memory 8Gi, needs >= 24Gi"."""

    @property
    def label(self) -> str:
        return f"{self.node or self.pool}/{self.device}"


@dataclasses.dataclass(frozen=True)
class RequestExplanation:
    """One request (``gpu``) or subrequest (``gpu/large``) of the claim."""

    request: str
    device_class: str
    reason: Reason
    """``Reason.FITS`` when the request can be satisfied on its own."""
    message: str
    """``request gpu: ...`` in plain words; for a fitting request, where it fits."""
    pieces: tuple[Piece, ...]
    """Always the four pieces, in ``PIECE_NAMES`` order."""
    devices: tuple[DeviceVerdict, ...] = ()
    """Every device of the complete pools, in natural order (empty if none was evaluated)."""
    notes: tuple[str, ...] = ()
    """Incomplete pools that may hold devices of the class."""
    nodes: tuple[str, ...] = ()
    """Nodes on which the request can be satisfied, sorted; empty when it cannot."""
    subrequests: tuple[RequestExplanation, ...] = ()
    """For ``firstAvailable``: each alternative, in the claim's order."""

    @property
    def satisfied(self) -> bool:
        return self.reason == Reason.FITS


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why one claim is (or is not) pending."""

    claim: str
    """``namespace/name``."""
    reason: Reason
    message: str
    """One plain-words line for the Event: the most important missing piece first."""
    pieces: tuple[Piece, ...]
    """The four pieces for the whole claim (all requests), in ``PIECE_NAMES`` order."""
    requests: tuple[RequestExplanation, ...] = ()

    @property
    def missing(self) -> bool:
        """Whether a piece is missing, i.e. whether a Warning Event is due."""
        return self.reason not in (Reason.ALLOCATED, Reason.SATISFIABLE, Reason.PREPARED)


def combine_pieces(rows: Sequence[tuple[Piece, ...]], *, any_of: bool) -> tuple[Piece, ...]:
    """The pieces of several requests: all must be satisfied (a claim's requests), or any
    (a firstAvailable request's alternatives)."""
    if not rows:
        return tuple(Piece(name, True, "no devices requested") for name in PIECE_NAMES)
    combined = []
    for index, name in enumerate(PIECE_NAMES):
        states = [row[index] for row in rows]
        if any_of and any(p.satisfied for p in states):
            satisfied: bool | None = True
        elif any(p.satisfied is False for p in states):
            satisfied = False
        else:
            satisfied = True if all(p.satisfied for p in states) else None
        chosen = [p.reason for p in states if p.satisfied is satisfied]
        reason = " | ".join(dict.fromkeys(chosen)) if satisfied is not None else wording.NOT_CHECKED
        combined.append(Piece(name, satisfied, wording.bounded(reason)))
    return tuple(combined)


def with_piece(pieces: Sequence[Piece], replacement: Piece) -> tuple[Piece, ...]:
    """``pieces`` with the one of ``replacement``'s name replaced."""
    return tuple(replacement if p.name == replacement.name else p for p in pieces)


def unchecked() -> tuple[Piece, ...]:
    """The four pieces, none checked."""
    return tuple(Piece(name, None, wording.NOT_CHECKED) for name in PIECE_NAMES)


def to_dict(explanation: Explanation) -> dict[str, Any]:
    """The explanation as plain JSON values (camelCase keys, enums as their strings), for
    ``-o json`` and ``-o yaml``: the structure docs/troubleshooting.md documents."""
    return {
        "claim": explanation.claim,
        "reason": str(explanation.reason),
        "missing": explanation.missing,
        "message": explanation.message,
        "pieces": [_piece(p) for p in explanation.pieces],
        "requests": [_request(r) for r in explanation.requests],
    }


def _piece(piece: Piece) -> dict[str, Any]:
    return {"name": piece.name, "satisfied": piece.satisfied, "reason": piece.reason}


def _request(request: RequestExplanation) -> dict[str, Any]:
    return {
        "request": request.request,
        "deviceClass": request.device_class,
        "reason": str(request.reason),
        "satisfied": request.satisfied,
        "message": request.message,
        "pieces": [_piece(p) for p in request.pieces],
        "devices": [
            {
                "driver": d.driver,
                "pool": d.pool,
                "device": d.device,
                "node": d.node,
                "verdict": str(d.verdict),
                "text": d.text,
            }
            for d in request.devices
        ],
        "notes": list(request.notes),
        "nodes": list(request.nodes),
        "subrequests": [_request(r) for r in request.subrequests],
    }

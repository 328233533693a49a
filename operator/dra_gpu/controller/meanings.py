"""What an explanation means, apart from its words: the key that decides whether to post it again.

A pending claim's message counts and names what moves at every allocation in the cluster ("and
170 more are allocated", "held by ns/a, ns/b", "4 free", "at most 5 available", "fits on
node-01, node-02 and 3 more"). Posting it again at each such move costs the API server an Event
per claim and pod for every allocation, and tells the user nothing new: the claim waits for the
same piece, for the same reason. So an explanation is posted again only when its ``Meaning``
changes.

Owns: ``Meaning`` (``of``), read from an ``explain.Explanation``'s structured form, never from
its text: the claim's reason and which of the four pieces are missing; per failing request
(each alternative of a ``firstAvailable`` one too) its name, device class, reason and pieces.
Where a reason's words count nothing, the words are part of the meaning, since there they say
what blocks: the class that does not exist, the selector that does not compile and why (per
request); which driver on which node has not prepared the claim and what the kubelet said, the
claim being deleted, the all-clear (for the claim). Left out on purpose: how many devices are
allocated, tainted, excluded, of other classes or do not match, which of them a message names
first, who holds them, what is left of a counter set or a shared device, where a request would
fit. ``dra-gpu explain`` and the metrics say those as they are now.

``is_news`` is the post/skip decision, against what the last Event on the claim said
(``Said``). ``digest`` names a Meaning in an annotation of the Event that said it
(``ANNOTATION``), so a restarted controller or a new leader knows what the last Event on a claim
meant (``heard``) instead of comparing words that counts have moved since.

Must not: do I/O, look at the cluster, or parse a message (no regex on the words): an
Explanation (or an Event's reason, words and annotation) in, frozen values out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dra_gpu.controller import explain
from dra_gpu.controller.explain import Reason

ANNOTATION = "resource.dra-gpu.io/explanation-meaning"
"""On the controller's Events of an explanation: the ``digest`` of what it meant."""

CLAIM_WORDED = frozenset(
    {Reason.CLAIM_DELETING, Reason.DRIVER_NOT_READY, Reason.PREPARED, Reason.ALLOCATED}
)
"""Reasons of a claim as a whole whose message counts nothing: the message is the meaning
(``DriverNotReady``: the driver, the node, since when, the kubelet's words; the kubelet's
retries do not change it)."""
REQUEST_WORDED = frozenset({Reason.DEVICE_CLASS_MISSING, Reason.SELECTOR_INVALID})
"""Reasons of a request whose message counts nothing: the class that does not exist, the
selector that does not compile and the compiler's complaint."""


@dataclasses.dataclass(frozen=True)
class RequestMeaning:
    """One failing request (or alternative of a ``firstAvailable`` request)."""

    request: str
    """``gpu``, or ``gpu/large`` for an alternative."""
    device_class: str
    reason: Reason
    pieces: tuple[bool | None, ...]
    """Each of the four pieces' ``satisfied``, in ``explain.PIECE_NAMES`` order."""
    words: str = ""
    """The request's message when its reason is in ``REQUEST_WORDED``, else empty."""
    alternatives: tuple[RequestMeaning, ...] = ()


@dataclasses.dataclass(frozen=True)
class Meaning:
    """What an explanation says, without what it counts: equal Meanings are the same news."""

    reason: Reason
    pieces: tuple[bool | None, ...]
    """Each of the claim's four pieces' ``satisfied``, in ``explain.PIECE_NAMES`` order."""
    requests: tuple[RequestMeaning, ...] = ()
    """The failing requests, in the claim's order."""
    words: str = ""
    """The claim's message when its reason is in ``CLAIM_WORDED``, else empty."""


def of(explanation: explain.Explanation) -> Meaning:
    """The meaning of ``explanation`` (with or without its devices written out: ``detail``
    changes nothing here)."""
    return Meaning(
        explanation.reason,
        _states(explanation.pieces),
        tuple(_request(r) for r in explanation.requests if not r.satisfied),
        explanation.message if explanation.reason in CLAIM_WORDED else "",
    )


def _request(request: explain.RequestExplanation) -> RequestMeaning:
    return RequestMeaning(
        request.request,
        request.device_class,
        request.reason,
        _states(request.pieces),
        request.message if request.reason in REQUEST_WORDED else "",
        tuple(_request(r) for r in request.subrequests),
    )


def _states(pieces: tuple[explain.Piece, ...]) -> tuple[bool | None, ...]:
    return tuple(p.satisfied for p in pieces)


def digest(meaning: Meaning) -> str:
    """A short stable name of ``meaning`` (the same in every process and version that keeps
    ``Meaning``'s fields), for ``ANNOTATION``."""
    text = json.dumps(dataclasses.asdict(meaning), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def event_annotations(meaning: Meaning) -> dict[str, str]:
    """The annotations of an Event that says ``meaning``."""
    return {ANNOTATION: digest(meaning)}


@dataclasses.dataclass(frozen=True)
class Said:
    """What the last Event of an explanation on a claim said, and what it meant."""

    reason: str
    message: str
    meaning: Meaning | None = None
    """None: not known (an Event without the annotation, or whose annotation names another
    meaning)."""


def heard(event: Mapping[str, Any] | None, meaning: Meaning) -> Said | None:
    """The last Event of ours on a claim (core/v1 or events.k8s.io shape) as a ``Said``: it
    meant ``meaning`` when its annotation names it; what it meant otherwise is not known (a
    digest names a meaning, it does not spell one out). None: no Event yet."""
    if event is None:
        return None
    annotations = (event.get("metadata") or {}).get("annotations") or {}
    words = str(event.get("message", event.get("note", "")))
    said = Said(str(event.get("reason", "")), words)
    if annotations.get(ANNOTATION) == digest(meaning):
        return dataclasses.replace(said, meaning=meaning)
    return said


def is_news(last: Said | None, reason: str, message: str, meaning: Meaning) -> bool:
    """The post/skip decision: post when nothing was said yet, or when both the meaning and the
    words differ from what was last said. A new count in the same meaning is no news; nor are
    the very words already posted, even when they now mean a little more (a second piece
    missing behind the same reason): posted again, they would read as a repeat."""
    if last is None:
        return True
    if last.meaning == meaning:
        return False
    return (last.reason, last.message) != (reason, message)

"""What the kubelet says when it cannot prepare a pod's claims, read as a ``PrepareFailure``.

Owns: the kubelet's ``FailedPrepareDynamicResources`` Event (core/v1 or events.k8s.io shape)
as a frozen ``PrepareFailure``: what it said, where, since when, on which pod, and what it
names (a driver not registered, one claim, an agent that does not answer). The view keeps the
latest per pod (``prepares`` watches the Events); ``explain`` words the driver piece from it.
Must not: do any I/O or explain anything: no client, no clock; it is a type and its parser,
so the view can hold one without importing the explanations' logic.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any

from dra_gpu.resource import bodies

PREPARE_FAILED = "FailedPrepareDynamicResources"  # the kubelet's Event reason


@dataclasses.dataclass(frozen=True)
class PrepareFailure:
    """The kubelet's word that it could not prepare a pod's claims: its latest
    ``FailedPrepareDynamicResources`` Event on the pod, which only the caller can see."""

    message: str
    """What the kubelet said, without its "Failed to prepare dynamic resources: " preamble:
    "DRA driver gpu.example.com is not registered", or the agent's error for one claim."""
    node: str | None = None
    """Where (the kubelet's host); None: unknown, the pod's node is meant."""
    since: str | None = None
    """When the kubelet first said it (RFC 3339), across its retries."""
    pod_uid: str = ""

    @functools.cached_property
    def driver(self) -> str | None:
        """The driver the kubelet names as missing, if it names one."""
        found = _NOT_REGISTERED.search(self.message)
        return found[1] if found else None

    @functools.cached_property
    def claim(self) -> str | None:
        """``namespace/name`` of the one claim the kubelet names, if it names one."""
        found = _FOR_CLAIM.search(self.message)
        return found[1] if found else None

    @property
    def unanswered(self) -> bool:
        """Whether the driver is registered but its socket does not answer (gRPC's
        ``Unavailable``: for 30 s after a plugin goes, the kubelet keeps it registered, in case
        it is only restarting)."""
        return _UNAVAILABLE in self.message

    def concerns(self, claim: Mapping[str, Any], driver: str) -> bool:
        """Whether this failure is ``driver``'s part of ``claim``: the claim is allocated with a
        device of ``driver``, and the kubelet names no other claim and no other driver."""
        meta = claim.get("metadata") or {}
        if self.claim is not None and self.claim != f"{meta.get('namespace')}/{meta.get('name')}":
            return False
        if self.driver is not None and self.driver != driver:
            return False
        return any(r.get("driver") == driver for r in bodies.allocation_results(claim))


_PREAMBLES = ("Failed to prepare dynamic resources: ", "prepare dynamic resources: ")
_NOT_REGISTERED = re.compile(r"DRA driver (\S+) is not registered")
_UNAVAILABLE = "code = Unavailable"
_FOR_CLAIM = re.compile(r"for claim ([a-z0-9.-]+/[a-z0-9.-]+)")


def prepare_failure(event: Mapping[str, Any]) -> PrepareFailure | None:
    """The ``PrepareFailure`` a kubelet Event says (core/v1 or events.k8s.io shape, as a
    core/v1 watch shows either); None when it is not a ``FailedPrepareDynamicResources``."""
    if event.get("reason") != PREPARE_FAILED:
        return None
    message = str(event.get("message") or event.get("note") or "")
    for preamble in _PREAMBLES:
        message = message.removeprefix(preamble)
    node = (event.get("source") or {}).get("host") or event.get("reportingInstance") or None
    since = event.get("firstTimestamp") or event.get("eventTime") or event.get("lastTimestamp")
    pod_uid = str((event.get("involvedObject") or event.get("regarding") or {}).get("uid") or "")
    return PrepareFailure(message, str(node) if node else None, since or None, pod_uid)

"""Device taints a request does not tolerate, and a taint in words.

Owns: resource.k8s.io/v1 ``DeviceToleration`` matching (an empty key with Exists matches every
key, an empty effect every effect, operator Equal by default) and ``device_taint_text``
("gpu.example.com/xid=79:NoExecute since 12:03"; a taint a DeviceTaintRule added, read by
``taintrules``, names the rule and says why, when the rule says: "gpu.example.com/agent-gone:
NoSchedule since 12:03 (DeviceTaintRule gpu.example.com-node-02-agent-gone: the agent of ...)").
Must not: judge node taints (``nodes`` does, by the pod's rules).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Body = Mapping[str, Any]


def untolerated(taints: Sequence[Body], tolerations: Sequence[Body]) -> tuple[Body, ...]:
    """The taints (NoSchedule/NoExecute) that no toleration of the request tolerates."""
    return tuple(t for t in taints if not any(_tolerates(x, t) for x in tolerations))


def _tolerates(toleration: Body, taint: Body) -> bool:
    # resource.k8s.io/v1 DeviceToleration: an empty key with Exists matches every key; an
    # empty effect matches every effect; operator defaults to Equal.
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator", "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def device_taint_text(taint: Body) -> str:
    """``gpu.example.com/xid=79:NoExecute since 12:03`` (UTC, from ``timeAdded``), with
    `` (DeviceTaintRule NAME: DESCRIPTION)`` for a rule's taint (``taintrules``)."""
    value = taint.get("value")
    text = f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"
    added = taint.get("timeAdded")
    if isinstance(added, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d.*", added):
        text += f" since {added[11:16]}"
    rule = taint.get("rule")
    if rule:
        description = taint.get("description")
        text += f" (DeviceTaintRule {rule}{': ' + str(description) if description else ''})"
    return text

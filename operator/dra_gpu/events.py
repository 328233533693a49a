"""Posting core/v1 Events: what users read with ``kubectl describe`` and ``get events``.

Every user-facing failure is an Event and a log line that say the same thing (see callers).
"""

from __future__ import annotations

import datetime
import logging
import secrets
from typing import Any

from dra_gpu import kube

log = logging.getLogger(__name__)


def object_ref(body: dict[str, Any]) -> dict[str, str]:
    meta = body["metadata"]
    ref = {
        "apiVersion": body.get("apiVersion", "v1"),
        "kind": body.get("kind", ""),
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    return ref


def event_body(
    regarding: dict[str, str], *, type_: str, reason: str, message: str, component: str, host: str
) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = regarding.get("namespace", "default")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{regarding['name']}.{secrets.token_hex(8)}",
            "namespace": namespace,
        },
        "involvedObject": regarding,
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component, "host": host},
        "reportingComponent": component,
        "reportingInstance": host,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post(
    api: kube.Kube,
    regarding: dict[str, str],
    *,
    type_: str,
    reason: str,
    message: str,
    component: str,
    host: str,
) -> None:
    """Post one Event; a failure to post is logged, never raised (the log line still says it)."""
    body = event_body(
        regarding, type_=type_, reason=reason, message=message, component=component, host=host
    )
    try:
        await api.create(f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)
    except Exception as exc:
        log.warning(
            "could not post event %s on %s %s: %s",
            reason,
            regarding.get("kind"),
            regarding.get("name"),
            exc,
        )

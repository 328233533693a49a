"""Posting Events: what users read with ``kubectl describe`` and ``kubectl get events``.

Every user-facing failure is an Event and a log line that say the same thing (see callers).

Owns: the Event bodies (``event_body``, ``object_ref``) and posting them, best effort
(``Recorder``, ``post_on_node``). Must not: raise when an Event cannot be posted; reach below
``client.Kube``'s verbs.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

from dra_gpu.kube import client

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
    """An events.k8s.io/v1 Event, as kube-scheduler writes its own: ``eventTime`` set and a name
    that sorts by time, so ``kubectl get events --sort-by=.lastTimestamp`` lists ours in order
    among the scheduler's (whose ``lastTimestamp`` is empty too)."""
    now = datetime.datetime.now(datetime.UTC)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{regarding['name']}.{time.time_ns():x}",
            "namespace": regarding.get("namespace", "default"),
        },
        "regarding": regarding,
        "type": type_,
        "reason": reason,
        "action": reason,
        "note": message[:1024],
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": component,
        "reportingInstance": host[:128],
    }


@dataclasses.dataclass(frozen=True)
class Recorder:
    """Posts the Events of one component (``reportingController``) running on ``host``."""

    api: client.Kube
    component: str
    host: str

    async def post(
        self,
        regarding: dict[str, str],
        *,
        type_: str,
        reason: str,
        message: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Post one Event (with ``annotations`` on it, if any); a failure to post is logged,
        never raised (the log line still says it)."""
        body = event_body(
            regarding,
            type_=type_,
            reason=reason,
            message=message,
            component=self.component,
            host=self.host,
        )
        if annotations:
            body["metadata"]["annotations"] = dict(annotations)
        try:
            namespace = body["metadata"]["namespace"]
            await self.api.create(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body)
        except Exception as exc:
            log.warning(
                "could not post event %s on %s %s: %s",
                reason,
                regarding.get("kind"),
                regarding.get("name"),
                exc,
            )


async def post_on_node(
    api: client.Kube, component: str, node: str, *, type_: str, reason: str, message: str
) -> None:
    """One Event on Node ``node``, posted by ``component`` running there; best effort: a Node
    that cannot be read is referred to by name alone, and a failure to post is logged."""
    try:
        regarding = object_ref(await api.get(f"/api/v1/nodes/{node}"))
    except Exception:  # the callers' log line says it already
        regarding = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": ""}
    regarding.setdefault("apiVersion", "v1")
    regarding["kind"] = "Node"
    await Recorder(api, component, node).post(
        regarding, type_=type_, reason=reason, message=message
    )

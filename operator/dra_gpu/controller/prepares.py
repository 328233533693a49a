"""The kubelet's prepare failures: counted, and the latest one per pod handed to the view.

Owns: a watch of core/v1 Events whose reason is ``FailedPrepareDynamicResources`` — our own
watch, not Kopf's: Kopf would filter every Event of the cluster on our side, the API server
filters this one — the ``dra_gpu_prepare_failures_total`` counter (each occurrence once, also
across relists), and, per pod, the kubelet's latest such failure (``explain.PrepareFailure``:
what it said, on which node, since when), which it sets in the view
(``ClusterView.set_prepare_failure``) so the ``Explainer`` explains the pod's claims anew. A
failure stays until its Event goes (Events expire after an hour) or a newer one replaces it;
whether it still matters (the pod still Pending) is the Explainer's reading.

Must not: explain or post anything, or keep more than a few fields per Event.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.controller import explain
from dra_gpu.controller.view import ClusterView
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Seen:
    pod: str
    """``namespace/name`` of the pod the Event is about."""
    count: int
    last: str
    """When the kubelet last said it: the newest Event of a pod is its failure."""
    failure: explain.PrepareFailure


class PrepareFailures:
    def __init__(self, api: kube.Kube, view: ClusterView, changed: Callable[[], None]) -> None:
        """``changed``: called when a pod's failure changed in the view (wakes the loop)."""
        self.api = api
        self.view = view
        self.changed = changed
        self._events: dict[str, _Seen] = {}  # Event uid -> what it says
        self._of_pod: dict[str, set[str]] = {}  # pod -> uids of its Events

    async def watch_forever(self) -> NoReturn:
        events = self.api.watch_forever(
            "/api/v1/events", fieldSelector=f"reason={explain.PREPARE_FAILED}"
        )
        async for kind, body in events:
            if self.apply(kind, body):
                self.changed()
        raise RuntimeError("the watch of the kubelet's prepare failures ended")

    def apply(self, kind: str, body: Mapping[str, Any]) -> bool:
        """One watch event (``SYNC``: a (re)list, ``body`` the listing); returns whether a
        pod's failure changed in the view."""
        pods: set[str] = set()
        if kind == "SYNC":  # what expired meanwhile is forgotten
            items = body.get("items", [])
            listed = {str(item.get("metadata", {}).get("uid", "")) for item in items}
            for uid in set(self._events) - listed:
                pods.add(self._forget(uid))
            for item in items:
                pods |= self._take(item)
        elif kind == "DELETED":  # events expire (1 h): forget them with it
            uid = str(body.get("metadata", {}).get("uid", ""))
            if uid in self._events:
                pods.add(self._forget(uid))
        else:
            pods |= self._take(body)
        changed = False
        for pod in sorted(pods):
            changed |= self.view.set_prepare_failure(pod, self._latest(pod))
        return changed

    def _take(self, event: Mapping[str, Any]) -> set[str]:
        failure = explain.prepare_failure(event)
        involved = event.get("involvedObject") or {}
        uid = str(event.get("metadata", {}).get("uid", ""))
        if failure is None or involved.get("kind", "Pod") != "Pod" or not uid:
            return set()
        count = int(event.get("count") or (event.get("series") or {}).get("count") or 1)
        seen = self._events.get(uid)
        if count > (seen.count if seen is not None else 0):
            metrics.PREPARE_FAILURES.inc(count - (seen.count if seen is not None else 0))
        last = str(
            event.get("lastTimestamp")
            or (event.get("series") or {}).get("lastObservedTime")
            or event.get("eventTime")
            or ""
        )
        pod = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
        if seen is not None and seen.pod != pod:
            self._forget(uid)
        self._events[uid] = _Seen(pod, max(count, seen.count if seen else 0), last, failure)
        self._of_pod.setdefault(pod, set()).add(uid)
        if seen is not None and seen.failure == failure and len(self._of_pod[pod]) == 1:
            return set()  # the kubelet said it once more: nothing new for the explanation
        return {pod}

    def _forget(self, uid: str) -> str:
        pod = self._events.pop(uid).pod
        uids = self._of_pod[pod]
        uids.discard(uid)
        if not uids:
            del self._of_pod[pod]
        return pod

    def _latest(self, pod: str) -> explain.PrepareFailure | None:
        mine = [self._events[uid] for uid in self._of_pod.get(pod, ())]
        return max(mine, key=lambda seen: seen.last).failure if mine else None

"""Pod timings: how long pods that use claims wait — creation to all claims allocated, and
creation to Ready — as the two histograms ``dra_gpu_pod_claims_allocated_seconds`` and
``dra_gpu_pod_running_seconds`` (its name from when it timed the Running phase; documented).

Time to Ready is the pod's own: from its ``creationTimestamp`` to its Ready condition's
``lastTransitionTime`` (``ready_since``), both the API's, so a controller that starts, or takes
over, after the pod became Ready still times it right. Time to allocated has no timestamp of
its own in the API: it is the controller's clock when its watch first shows every claim
allocated.

Owns: which pods were timed already (each pod once per step; a new pod of the same name is
another pod). Every replica keeps them, from each batch of changes: the changed pods and the
pods of changed claims (only the leader serves the histograms: ``metrics.CLUSTER``). Pure but
for the histograms; the clock is passed in.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from dra_gpu.controller.tallies import timestamp
from dra_gpu.controller.view import Changes, ClusterView
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics


class PodTimings:
    def __init__(self) -> None:
        self._timed: dict[str, dict[str, str]] = {"allocated": {}, "ready": {}}

    def update(self, view: ClusterView, changes: Changes, now: datetime.datetime) -> None:
        keys = set(changes.pods)
        for claim in changes.claims:
            keys.update(view.pod_keys_of(claim))
        for key in sorted(keys):
            pod = view.pods.get(key)
            for seen in self._timed.values():
                if seen.get(key) is not None and (pod is None or seen[key] != _uid(pod)):
                    del seen[key]  # gone, or another pod of that name
            if pod is None:
                continue
            refs = pod["spec"].get("resourceClaims") or []
            created = timestamp(pod["metadata"].get("creationTimestamp"))
            if not refs or created is None:
                continue
            uid = _uid(pod)
            if key not in self._timed["allocated"] and _claims_allocated(view, pod):
                metrics.POD_CLAIMS_ALLOCATED_SECONDS.observe(_seconds(created, now))
                self._timed["allocated"][key] = uid
            if key not in self._timed["ready"] and (ready := ready_since(pod, now)) is not None:
                metrics.POD_RUNNING_SECONDS.observe(_seconds(created, ready))
                self._timed["ready"][key] = uid


def ready_since(pod: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime | None:
    """When the pod became Ready: its Ready condition's ``lastTransitionTime`` while that
    condition is True (``now`` if it has no readable one); None while it is not Ready."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            if condition.get("status") != "True":
                return None
            return timestamp(condition.get("lastTransitionTime")) or now
    return None


def _seconds(start: datetime.datetime, end: datetime.datetime) -> float:
    """From ``start`` to ``end``; never below 0 (a node's clock behind the API server's)."""
    return max((end - start).total_seconds(), 0.0)


def _uid(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"].get("uid", ""))


def _claims_allocated(view: ClusterView, pod: Mapping[str, Any]) -> bool:
    namespace = pod["metadata"]["namespace"]
    names = {
        s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names |= {r.get("resourceClaimName") for r in pod["spec"].get("resourceClaims") or []}
    names.discard(None)
    wanted = len(pod["spec"].get("resourceClaims") or [])
    found = [view.claims.get(f"{namespace}/{n}") for n in names]
    allocated = [c for c in found if c and bodies.allocation(c) is not None]
    return len(allocated) >= wanted

"""Pod timings: how long pods that use claims wait — creation to all claims allocated, and
creation to Running — as the two histograms ``dra_gpu_pod_claims_allocated_seconds`` and
``dra_gpu_pod_running_seconds``.

Owns: which pods were timed already (each pod once per step; a new pod of the same name is
another pod). Every replica keeps them, from each batch of changes: the changed pods and the
pods of changed claims. Pure but for the histograms; the clock is passed in.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from dra_gpu.controller.view import Changes, ClusterView
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics


class PodTimings:
    def __init__(self) -> None:
        self._timed: dict[str, dict[str, str]] = {"allocated": {}, "running": {}}

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
            created = _timestamp(pod["metadata"].get("creationTimestamp"))
            if not refs or created is None:
                continue
            uid = _uid(pod)
            if key not in self._timed["allocated"] and _claims_allocated(view, pod):
                metrics.POD_CLAIMS_ALLOCATED_SECONDS.observe((now - created).total_seconds())
                self._timed["allocated"][key] = uid
            phase = (pod.get("status") or {}).get("phase")
            if key not in self._timed["running"] and phase == "Running":
                metrics.POD_RUNNING_SECONDS.observe((now - created).total_seconds())
                self._timed["running"][key] = uid


def _timestamp(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


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

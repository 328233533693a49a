"""The controller's in-memory view of the cluster, fed by Kopf's watch events.

Kopf's ``on.event`` handlers put every DeviceClass, ResourceClaim, ResourceSlice, Pod and Node
here as the API's own JSON; nothing is written back to those objects (no Kopf annotations, no
finalizers: they belong to users). Queries here are pure and cheap; the reconcile loop reads
the view, never the API, so a burst of watch events costs one pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

Body = dict[str, Any]
KINDS = ("DeviceClass", "ResourceClaim", "ResourceSlice", "Pod", "Node")


def key(body: Body) -> str:
    meta = body.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else meta["name"]


@dataclasses.dataclass
class ClusterView:
    objects: dict[str, dict[str, Body]] = dataclasses.field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )
    generation: int = 0
    """Bumped on every change, so the reconcile loop can tell a quiet view from a busy one."""

    def apply(self, kind: str, event_type: str | None, body: Body) -> None:
        store = self.objects[kind]
        if event_type == "DELETED":
            store.pop(key(body), None)
        else:
            store[key(body)] = body
        self.generation += 1

    @property
    def classes(self) -> dict[str, Body]:
        return self.objects["DeviceClass"]

    @property
    def claims(self) -> dict[str, Body]:
        return self.objects["ResourceClaim"]

    @property
    def slices(self) -> dict[str, Body]:
        return self.objects["ResourceSlice"]

    @property
    def pods(self) -> dict[str, Body]:
        return self.objects["Pod"]

    @property
    def nodes(self) -> dict[str, Body]:
        return self.objects["Node"]

    def pods_of(self, claim: Body) -> list[Body]:
        """Pods that use the claim: its owner (template claims) or pods naming it."""
        meta = claim["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        found = []
        for pod in self.pods.values():
            if pod["metadata"].get("namespace") != namespace:
                continue
            names = {
                ref.get("resourceClaimName") for ref in pod["spec"].get("resourceClaims") or []
            }
            names |= {
                status.get("resourceClaimName")
                for status in pod.get("status", {}).get("resourceClaimStatuses") or []
            }
            if name in names:
                found.append(pod)
        return sorted(found, key=key)

    def pending_claims(self) -> Iterator[Body]:
        """Claims not allocated yet, in a stable order."""
        for name in sorted(self.claims):
            claim = self.claims[name]
            if not claim.get("status", {}).get("allocation"):
                yield claim

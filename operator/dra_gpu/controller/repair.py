"""Status repair: ``status.devices`` entries of our driver for devices the claim no longer has
allocated are removed (what a crashed agent left behind).

Owns: which claims to look at (changed claims; all of them when this replica takes over). Writes
with the claim's resourceVersion: a claim changed meanwhile comes back as a change. The leader's
job: ``sweep``, ``note``, ``run_once``.
"""

from __future__ import annotations

import logging

from dra_gpu import kube
from dra_gpu.controller.view import Changes, ClusterView
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
RESOURCE = "/apis/resource.k8s.io/v1"


class StatusRepair:
    def __init__(self, view: ClusterView, api: kube.Kube, driver: str) -> None:
        self.view = view
        self.api = api
        self.driver = driver
        self._to_repair: set[str] = set()

    def sweep(self) -> None:
        self._to_repair = set(self.view.claims)

    def note(self, changes: Changes) -> None:
        self._to_repair |= changes.claims

    async def run_once(self) -> None:
        for key in sorted(self._to_repair):
            claim = self.view.claims.get(key)
            self._to_repair.discard(key)
            if claim is None:
                continue
            entries = bodies.device_statuses(claim)
            allocated = {
                (r["driver"], r["pool"], r["device"]) for r in bodies.allocation_results(claim)
            }
            stale = [
                e
                for e in entries
                if e.get("driver") == self.driver
                and (e.get("driver"), e.get("pool"), e.get("device")) not in allocated
            ]
            if not stale:
                continue
            meta = claim["metadata"]
            keep = [e for e in entries if e not in stale]
            log.warning(
                "ResourceClaim %s/%s: removing status of devices no longer allocated: %s",
                meta["namespace"],
                meta["name"],
                ", ".join(f"{e.get('pool')}/{e.get('device')}" for e in stale),
            )
            try:
                await self.api.patch(
                    f"{RESOURCE}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}/status",
                    {
                        "metadata": {"resourceVersion": meta["resourceVersion"]},
                        "status": {"devices": keep},
                    },
                )
            except kube.ApiError as exc:
                if not (exc.conflict or exc.not_found):
                    self._to_repair.add(key)
                    raise
                continue  # changed meanwhile: the new version comes as a change
            metrics.DEVICE_STATUS_REPAIRS.inc(len(stale))

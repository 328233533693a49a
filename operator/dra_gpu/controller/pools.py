"""Pool and slice checks: pools of our driver that are not complete are logged (and counted by
the tallies); our labelled slices whose Node is gone are deleted.

Owns: the last report per pool, and which slices to look at (changed slices, and the slices of
nodes that went away). A slice is deleted only when the API server, not just the view, says its
Node is gone, only when it carries our managed-by label and names our driver (hand-made slices
are never touched), and with its UID as a precondition. The leader's job: ``sweep`` when it
takes over, ``note`` every batch of changes, ``run_once``.
"""

from __future__ import annotations

import logging

from dra_gpu import kube
from dra_gpu.controller.tallies import Tally
from dra_gpu.controller.view import Changes, ClusterView
from dra_gpu.resource import labels
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
RESOURCE = "/apis/resource.k8s.io/v1"


class PoolChecks:
    def __init__(self, view: ClusterView, tally: Tally, api: kube.Kube, driver: str) -> None:
        self.view = view
        self.tally = tally
        self.api = api
        self.driver = driver
        self._reported: dict[str, str] = {}
        self._to_check: set[str] = set()

    def sweep(self) -> None:
        self._to_check = set(self.view.slices)

    def note(self, changes: Changes) -> None:
        self._to_check |= changes.slices
        gone = {n for n in changes.nodes if n not in self.view.nodes}
        if gone:
            self._to_check |= {
                name
                for name, body in self.view.slices.items()
                if (body.get("spec") or {}).get("nodeName") in gone
            }

    async def run_once(self) -> None:
        self.report_pools()
        await self.delete_stale_slices()

    def report_pools(self) -> None:
        current = {
            p.pool: p.message for p in self.tally.problems.values() if p.driver == self.driver
        }
        for pool, message in sorted(current.items()):
            if self._reported.get(pool) != message:
                log.warning("%s", message)
        self._reported = current

    async def delete_stale_slices(self) -> None:
        for name in sorted(self._to_check):
            body = self.view.slices.get(name)
            if body is None:
                self._to_check.discard(name)
                continue
            on_body = body["metadata"].get("labels") or {}
            node = body["spec"].get("nodeName")
            if (
                on_body.get(labels.MANAGED_BY_LABEL) != labels.MANAGED_BY_VALUE
                or body["spec"].get("driver") != self.driver
                or not node
                or node in self.view.nodes
            ):
                self._to_check.discard(name)
                continue
            try:  # the view may lag: only the API server can say the Node is gone
                await self.api.get(f"/api/v1/nodes/{node}")
                continue  # checked again on the next run
            except kube.ApiError as exc:
                if not exc.not_found:
                    raise
            log.warning("deleting ResourceSlice %s: its node %s no longer exists", name, node)
            await self.api.delete(f"{RESOURCE}/resourceslices/{name}", uid=body["metadata"]["uid"])
            self._to_check.discard(name)
            metrics.STALE_SLICES_DELETED.inc()

"""Publishes this node's devices as ResourceSlices and keeps them published.

The pool is named after the node and holds at most 128 devices per slice; ``slices.build_slices``
says what the slices contain. This module is the only code that writes them: it compares what
the API holds (our labelled slices of this driver and node) with what the inventory says, and
when they differ writes the whole pool again at a generation above every slice of the pool —
obsolete slices deleted first, the rest replaced or created. A slice deleted or edited by
someone else (the kubelet wipes a node's slices when it restarts) is noticed through a watch and
published again; the inventory is re-read every ``resync_seconds``.

Slices are never deleted on shutdown: a restarting agent must not empty the node, and a deleted
Node takes its slices with it through their ownerReference.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NoReturn

from dra_gpu import kube, metrics, slices
from dra_gpu.devices import model

log = logging.getLogger(__name__)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class SlicePublisher:
    def __init__(
        self,
        api: kube.Kube,
        backend: model.Backend,
        *,
        driver: str,
        node: str,
        resync_seconds: float = 30.0,
        retry_seconds: float = 2.0,
    ) -> None:
        self.api = api
        self.backend = backend
        self.driver = driver
        self.node = node
        self.resync_seconds = resync_seconds
        self.retry_seconds = retry_seconds
        self.current: model.Inventory | None = None
        self.published_generation: int | None = None
        self._wake = asyncio.Event()
        self._warned_foreign: set[str] = set()

    @property
    def _selector(self) -> str:
        return f"spec.driver={self.driver},spec.nodeName={self.node}"

    async def inventory(self, fresh: bool = False) -> model.Inventory:
        """The inventory last read, or a fresh read (which also updates the gauges)."""
        if fresh or self.current is None:
            self.current = await self.backend.inventory()
            metrics.INVENTORY_DEVICES.labels(self.node).set(len(self.current.devices))
            metrics.INVENTORY_MEMORY.labels(self.node).set(
                sum(d.memory_bytes or 0 for d in self.current.devices)
            )
        return self.current

    def trigger(self) -> None:
        """Check the slices now (after a registration, a watch event, a test)."""
        self._wake.set()

    async def run_forever(self, start: asyncio.Event | None = None) -> NoReturn:
        """Publish and keep publishing, once ``start`` is set (the kubelet registered us:
        devices published before that could be allocated to pods nobody can prepare)."""
        if start is not None and not start.is_set():
            log.info("waiting for the kubelet to register the plugin before publishing")
            await start.wait()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._watch_forever(), name="slice-watch")
            while True:
                try:
                    await self.publish_once()
                    delay = self.resync_seconds
                except Exception as exc:  # API restarting, node not registered yet, bad profile
                    metrics.SLICE_PUBLICATIONS.labels("error").inc()
                    log.warning("publishing the slices of node %s failed: %s", self.node, exc)
                    delay = self.retry_seconds
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                self._wake.clear()
        raise AssertionError("unreachable")  # pragma: no cover - TaskGroup never ends

    async def publish_once(self) -> bool:
        """Bring the API in line with the inventory; True if a new generation was written."""
        inventory = await self.inventory(fresh=True)
        node = await self.api.get(f"/api/v1/nodes/{self.node}")
        node_uid = node["metadata"]["uid"]
        listing = await self.api.get(SLICES, fieldSelector=self._selector)
        pool = [s for s in listing.get("items", []) if s["spec"]["pool"]["name"] == self.node]
        ours = [s for s in pool if _is_ours(s)]
        self._warn_foreign([s for s in pool if not _is_ours(s)])
        wanted = slices.build_slices(self.node, node_uid, self.driver, inventory.devices, 0)
        if not self._needs_update(ours, wanted, node_uid):
            self.published_generation = _generation(ours[0])
            return False
        # Above every slice of the pool and above what we published before: a pool whose
        # slices were all deleted must not come back at a generation consumers already saw.
        generation = max([*(_generation(s) for s in pool), self.published_generation or 0]) + 1
        wanted = slices.build_slices(
            self.node, node_uid, self.driver, inventory.devices, generation
        )
        await self._write(ours, wanted)
        self.published_generation = generation
        metrics.SLICE_PUBLICATIONS.labels("success").inc()
        log.info(
            "published %d devices of node %s in %d slice(s), generation %d",
            len(inventory.devices),
            self.node,
            len(wanted),
            generation,
        )
        return True

    def _needs_update(self, ours: list[Any], wanted: list[Any], node_uid: str) -> bool:
        if slices.slices_differ(ours, wanted):
            return True
        names = {s["metadata"]["name"] for s in ours}
        owners = {o.get("uid") for s in ours for o in s["metadata"].get("ownerReferences", [])}
        return names != {s["metadata"]["name"] for s in wanted} or owners != {node_uid}

    async def _write(self, ours: list[Any], wanted: list[Any]) -> None:
        existing = {s["metadata"]["name"]: s for s in ours}
        keep = {s["metadata"]["name"] for s in wanted}
        # Obsolete slices go first, so consumers never see more slices than the count says.
        for name, old in existing.items():
            if name not in keep:
                await self.api.delete(f"{SLICES}/{name}", uid=old["metadata"]["uid"])
        for body in wanted:
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                await self.api.replace(f"{SLICES}/{name}", body)
            else:
                try:
                    await self.api.create(SLICES, body)
                except kube.ApiError as exc:
                    if not exc.conflict:
                        raise
                    # A slice of that name outside our selector (another node's?): say so.
                    raise RuntimeError(
                        f"ResourceSlice {name} exists but is not one of node {self.node}'s; "
                        "delete it or rename the node"
                    ) from exc

    def _warn_foreign(self, foreign: list[Any]) -> None:
        for s in foreign:
            name = s["metadata"]["name"]
            if name not in self._warned_foreign:
                self._warned_foreign.add(name)
                log.warning(
                    "ResourceSlice %s publishes devices of driver %s in pool %s but was not "
                    "made by dra-gpu; our slices use a higher generation, so the scheduler "
                    "ignores it. Delete it if it was made by hand.",
                    name,
                    self.driver,
                    self.node,
                )

    async def _watch_forever(self) -> None:
        # Our own writes come back here too; the check they trigger then finds nothing to do.
        async for kind, obj in self.api.watch_forever(SLICES, fieldSelector=self._selector):
            if kind in ("DELETED", "MODIFIED") and _is_ours(obj):
                if kind == "DELETED":
                    log.info(
                        "ResourceSlice %s was deleted; publishing it again", obj["metadata"]["name"]
                    )
                self.trigger()


def _is_ours(body: dict[str, Any]) -> bool:
    labels = body.get("metadata", {}).get("labels") or {}
    return bool(labels.get(slices.MANAGED_BY_LABEL) == slices.MANAGED_BY_VALUE)


def _generation(body: dict[str, Any]) -> int:
    return int(body["spec"]["pool"].get("generation", 0))

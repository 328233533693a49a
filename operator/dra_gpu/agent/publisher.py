"""Publishes this node's devices as ResourceSlices and keeps them published.

The pool is named after the node and holds at most 128 devices per slice; ``slices.build_slices``
says what the slices contain. This module is the only code that writes them: it compares what
the API holds (our labelled slices of this driver and node) with what the inventory says, and
when they differ writes the whole pool again at a generation above every slice of the pool —
obsolete slices deleted first, the rest replaced or created. A slice deleted or edited by
someone else (the kubelet wipes a node's slices when it restarts) is noticed through a watch and
published again; the inventory is re-read every ``resync_seconds``.

What the API holds is read from that watch (a watch-list of the node's slices: ``kube.watch``),
not asked again at each check: a check whose inventory did not change sends nothing, so a quiet
agent costs the API server its two watches and nothing more, and an API server restart costs it
one request per watch. The pool and the Node are read by request only where the watch cannot
say: before its first state came, while it is broken, after a publication the API server
refused (a conflict: what we hold may be old; not one it did not answer, or answered 429 or
5xx) and, for the Node, after one of our slices was deleted by someone else (a Node deleted
and made again under the same name takes its slices with it, and the new slices must name the
new Node's UID).

Slices are never deleted on shutdown: a restarting agent must not empty the node, and a deleted
Node takes its slices with it through their ownerReference.

Every write is signed with this process's ``instance`` and the time the kubelet registered it
(``slices.Publisher``). A pool that another agent wrote is left to ``contention``'s rules: the
agent the kubelet registered last publishes; the other hands the pool over to it while it is
registered (``others_registered``: the kubelet's registry directory holds its live
registration; a Normal Event ``ResourcePoolHandedOver`` says so once) and takes it back at once
when it is gone, or, where that cannot be told, backs off exponentially. A conflict is logged,
posted as a Warning Event on the Node and counted (``dra_gpu_slice_pool_*`` metrics name both
instances).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.agent import slices
from dra_gpu.agent.contention import Contention
from dra_gpu.devices import health, model
from dra_gpu.kube import backoff, events
from dra_gpu.resource import labels
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
COMPONENT = "dra-gpu-agent"
CONFLICT_REASON = "ResourcePoolConflict"
HANDOVER_REASON = "ResourcePoolHandedOver"
RETRY = backoff.Backoff(duration=1.0, cap=8.0, jitter=0.5)
"""After a failed publication: 1 s doubling up to 8 s, each up to half again (the package's
back-off). Kept short: until its slices are there the scheduler sees none of the node's GPUs,
and a node without slices has no watch event to wake the loop sooner."""


class SlicePublisher:
    def __init__(
        self,
        api: kube.Kube,
        backend: model.Backend,
        *,
        driver: str,
        node: str,
        resync_seconds: float = 30.0,
        retry: backoff.Backoff = RETRY,
        instance: str = "dra-gpu-agent",
        registered_at: Callable[[], datetime.datetime | None] = lambda: None,
        contention: Contention | None = None,
        clock: Callable[[], float] = time.monotonic,
        taints: Callable[
            [tuple[model.Device, ...]], Mapping[str, tuple[health.Taint, ...]]
        ] = lambda devices: {},
        others_registered: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.api = api
        self.backend = backend
        self.driver = driver
        self.node = node
        self.resync_seconds = resync_seconds
        self.retries = retry.delays()
        """Between failed publications (an API server restarting, the Node not there yet):
        jittered, doubling, back to the first after one that succeeded. A watch event wakes
        the loop sooner."""
        self.instance = instance
        """Names this process on what it writes: unique per process (see ``new_instance``)."""
        self.registered_at = registered_at
        """When the kubelet last accepted our registration (None: not known, e.g. in tests)."""
        self.contention = contention or Contention(pool=node, driver=driver)
        self.clock = clock
        self.others_registered = others_registered
        """Whether another agent of the driver is registered with the node's kubelet now (None:
        not known; ``contention`` then backs off instead of handing the pool over)."""
        self.taints = taints
        """The devices about to be published -> the taints of each (``HealthMonitor.taints``:
        a MIG partition's include its GPU's, so a fault of a MIG-mode GPU taints them all)."""
        self.partitions_supported = True
        """False once the API server dropped the counters we wrote (``DRAPartitionableDevices``
        off: Kubernetes 1.35, or a gate turned off): partitioned GPUs are then published whole
        only, so nothing can be allocated twice."""
        self.sharing_supported = True
        """False once the API server dropped ``allowMultipleAllocations`` (consumable capacity,
        ``DRAConsumableCapacity`` off: Kubernetes 1.35): shared GPUs are then published
        exclusive, so no claim is promised a share the scheduler cannot keep."""
        self.taints_supported = True
        """False once the API server dropped the taints we wrote (``DRADeviceTaints`` off:
        Kubernetes 1.35, or a gate turned off): tainted devices are then left out instead."""
        self.current: model.Inventory | None = None
        self.published_generation: int | None = None
        self._started = datetime.datetime.now(datetime.UTC)
        self._wait: float | None = None  # set by publish_once when it holds a write back
        self._wake = asyncio.Event()
        self._warned_foreign: set[str] = set()
        self._other_series: tuple[str, str] | None = None
        self._watched: dict[str, kube.Body] | None = None
        """The node's slices (of this driver) as the watch last said, by name; None before its
        first state and while it is broken."""
        self._node: kube.Body | None = None
        """The Node as last read; None: read it at the next check."""
        self._stale = True
        """The next check reads the slices by request (the first, or one after a failure)."""

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

    @property
    def me(self) -> slices.Publisher:
        return slices.Publisher.at(self.registered_at() or self._started, self.instance)

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
                    delay = min(self.resync_seconds, self._wait or self.resync_seconds)
                    self.retries.reset()
                except Exception as exc:  # API restarting, node not registered yet, bad profile
                    metrics.SLICE_PUBLICATIONS.labels("error").inc()
                    delay = self.retries.next()
                    log.warning(
                        "publishing the slices of node %s failed: %s; again in %.1f s",
                        self.node,
                        exc,
                        delay,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                self._wake.clear()
        raise AssertionError("unreachable")  # pragma: no cover - TaskGroup never ends

    async def publish_once(self) -> bool:
        """Bring the API in line with the inventory; True if a new generation was written."""
        try:
            wrote = await self._publish()
        except Exception as exc:
            if not _not_done(exc):  # refused (a conflict...): what we hold may be old
                self._node, self._stale = None, True
            raise
        self._stale = False
        return wrote

    async def _held(self) -> tuple[kube.Body, list[kube.Body]]:
        """The Node and the node's slices of this driver: from the watch where it can say."""
        if self._node is None:
            self._node = await self.api.get(f"/api/v1/nodes/{self.node}")
        if self._watched is None or self._stale:
            listing = await self.api.get(SLICES, fieldSelector=self._selector)
            return self._node, list(listing.get("items", []))
        return self._node, list(self._watched.values())

    async def _publish(self) -> bool:
        self._wait = None
        inventory = await self.inventory(fresh=True)
        node, held = await self._held()
        node_uid = node["metadata"]["uid"]
        pool = [s for s in held if s["spec"]["pool"]["name"] == self.node]
        ours = [s for s in pool if _is_ours(s)]
        self._warn_foreign([s for s in pool if not _is_ours(s)])
        me = self.me
        if not self.partitions_supported:
            inventory = inventory.without_partitions()
        if not self.sharing_supported:
            inventory = inventory.without_sharing()
        devices = self._tainted(inventory.devices)
        sets = inventory.counter_sets
        wanted = slices.build_slices(
            self.node, node_uid, self.driver, devices, 0, counter_sets=sets
        )
        if not self._needs_update(ours, wanted, node_uid):
            self.published_generation = _generation(ours[0])
            if (line := self.contention.settled(self.clock())) is not None:
                log.warning("%s", line)
            self._update_contention_metrics()
            return False
        if not await self._may_write(ours, me, node):
            return False
        # Above every slice of the pool and above what we published before: a pool whose
        # slices were all deleted must not come back at a generation consumers already saw.
        generation = max([*(_generation(s) for s in pool), self.published_generation or 0]) + 1
        wanted = slices.build_slices(
            self.node, node_uid, self.driver, devices, generation, publisher=me, counter_sets=sets
        )
        written = await self._write(ours, wanted)
        self.contention.wrote(self.clock())
        if self.partitions_supported and _counter_sets(written) < _counter_sets(wanted):
            self.partitions_supported = False
            log.error(
                "the API server dropped the shared counters of node %s's slices (feature gate "
                "DRAPartitionableDevices is off: Kubernetes 1.35, or disabled): publishing "
                "partitioned GPUs (MIG) whole only, without their partitions",
                self.node,
            )
            self.trigger()
        if self.sharing_supported and _shared_count(written) < _shared_count(wanted):
            self.sharing_supported = False
            log.error(
                "the API server dropped allowMultipleAllocations from node %s's slices (feature "
                "gate DRAConsumableCapacity is off: Kubernetes 1.35, or disabled): publishing "
                "shared GPUs exclusive, one claim each",
                self.node,
            )
            self.trigger()
        if self.taints_supported and _taint_count(written) < _taint_count(wanted):
            self.taints_supported = False
            log.error(
                "the API server dropped the device taints of node %s's slices (feature gate "
                "DRADeviceTaints is off: Kubernetes 1.35, or disabled): leaving unhealthy "
                "devices out of the pool instead",
                self.node,
            )
            self.trigger()
        self.published_generation = generation
        metrics.SLICE_PUBLICATIONS.labels("success").inc()
        tainted = [f"{d.name} {', '.join(map(str, d.taints))}" for d in devices if d.taints]
        log.info(
            "published %d devices of node %s in %d slice(s), generation %d%s",
            sum(d.healthy for d in devices),
            self.node,
            len(wanted),
            generation,
            f"; tainted: {'; '.join(tainted)}" if tainted else "",
        )
        return True

    def _tainted(self, devices: tuple[model.Device, ...]) -> tuple[model.Device, ...]:
        taints = self.taints(devices)
        if not self.taints_supported:
            return tuple(d for d in devices if not taints.get(d.name))
        return tuple(
            dataclasses.replace(d, taints=taints[d.name]) if taints.get(d.name) else d
            for d in devices
        )

    async def _may_write(self, ours: list[Any], me: slices.Publisher, node: kube.Body) -> bool:
        """Whether we may write the pool now; if another agent wrote it last, ``contention``
        decides (and we report what it found)."""
        if not ours:
            return True
        newest = max(_generation(s) for s in ours)
        writers = {slices.publisher_of(s) for s in ours if _generation(s) == newest}
        if any(w is not None and w.instance == me.instance for w in writers):
            return True  # ours (perhaps half written, or edited by hand): put it right
        writer = max((w for w in writers if w is not None), default=None)
        registered = None if self.others_registered is None else await self.others_registered()
        decision = self.contention.foreign(
            writer, me, newest, self.clock(), newer_registered=registered
        )
        if decision.conflict:
            metrics.SLICE_POOL_CONFLICTS.inc()
        self._update_contention_metrics()
        node_ref = events.object_ref({"apiVersion": "v1", "kind": "Node", **node})
        if decision.report is not None:
            log.warning("%s", decision.report)
            await events.Recorder(self.api, COMPONENT, self.node).post(
                node_ref, type_="Warning", reason=CONFLICT_REASON, message=decision.report
            )
        if decision.notice is not None:
            log.info("%s", decision.notice)
            await events.Recorder(self.api, COMPONENT, self.node).post(
                node_ref, type_="Normal", reason=HANDOVER_REASON, message=decision.notice
            )
        if decision.wait > 0:
            self._wait = decision.wait
            return False
        if self.contention.yielding:
            log.info(
                "ResourceSlice pool %s: trying to take it over from %s",
                self.node,
                self.contention.yielding_to,
            )
        return True

    def _update_contention_metrics(self) -> None:
        metrics.SLICE_POOL_YIELDING.set(1 if self.contention.yielding else 0)
        other = self.contention.other
        series: tuple[str, str] | None = None
        if other is not None:
            series = (self.instance, other.instance)
        elif self.contention.other_unnamed:
            series = (self.instance, "unnamed")
        if series == self._other_series:
            return
        if self._other_series is not None:
            metrics.SLICE_POOL_OTHER_WRITER.remove(*self._other_series)
        if series is not None:
            metrics.SLICE_POOL_OTHER_WRITER.labels(*series).set(1)
        self._other_series = series

    def _needs_update(self, ours: list[Any], wanted: list[Any], node_uid: str) -> bool:
        if slices.slices_differ(ours, wanted):
            return True
        names = {s["metadata"]["name"] for s in ours}
        owners = {o.get("uid") for s in ours for o in s["metadata"].get("ownerReferences", [])}
        return names != {s["metadata"]["name"] for s in wanted} or owners != {node_uid}

    async def _write(self, ours: list[Any], wanted: list[Any]) -> list[Any]:
        """Writes the pool; returns the slices as the API server stored them."""
        written: list[Any] = []
        existing = {s["metadata"]["name"]: s for s in ours}
        keep = {s["metadata"]["name"] for s in wanted}
        # Obsolete slices go first, so consumers never see more slices than the count says.
        for name, old in existing.items():
            if name not in keep:
                await self.api.delete(f"{SLICES}/{name}", uid=old["metadata"]["uid"])
                self._forget(name)
        for body in wanted:
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                written.append(await self.api.replace(f"{SLICES}/{name}", body))
            else:
                try:
                    written.append(await self.api.create(SLICES, body))
                except kube.ApiError as exc:
                    if not exc.conflict:
                        raise
                    # A slice of that name outside our selector (another node's?): say so.
                    raise RuntimeError(
                        f"ResourceSlice {name} exists but is not one of node {self.node}'s; "
                        "delete it or rename the node"
                    ) from exc
        for body in written:
            self._saw(body)
        return written

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
        slices_of_node = self.api.watch_forever(
            SLICES, watch_list=True, on_break=self._watch_broke, fieldSelector=self._selector
        )
        async for kind, obj in slices_of_node:
            self.seen(kind, obj)

    def _watch_broke(self) -> None:
        self._watched = None
        metrics.WATCH_LIVE.labels("resourceslices").set(0)

    def seen(self, kind: str, obj: kube.Body) -> None:
        """What the slice watch said: ``SYNC`` (the node's slices now) or an event. Every
        change of ours, and every new state, checks the pool."""
        if kind == "SYNC":
            self._watched = {s["metadata"]["name"]: s for s in obj.get("items") or ()}
            metrics.WATCH_LIVE.labels("resourceslices").set(1)
            self.trigger()
        elif kind == "DELETED":
            if self._forget(obj["metadata"]["name"]) and _is_ours(obj):
                log.info(
                    "ResourceSlice %s was deleted; publishing it again", obj["metadata"]["name"]
                )
                self._node = None  # the Node's too, perhaps: read it again
                self.trigger()
        elif kind in ("ADDED", "MODIFIED"):
            self._saw(obj)
            if kind == "MODIFIED" and _is_ours(obj):
                self.trigger()

    def _saw(self, body: kube.Body) -> None:
        """Keeps ``body`` as the watch's copy of its slice, unless the copy is newer (a write
        of ours answered before the watch brought an older change)."""
        if self._watched is None:
            return
        name = body["metadata"]["name"]
        held = self._watched.get(name)
        if held is None or _version(held) <= _version(body):
            self._watched[name] = body

    def _forget(self, name: str) -> bool:
        """Drops a slice from the watch's copy; False if it was not there (deleted by us)."""
        return self._watched is not None and self._watched.pop(name, None) is not None


def new_instance(pod_name: str) -> str:
    """A name for this process, unique among all agents ever: the pod's name (a container's
    host name; a restarted container keeps it, so a random part follows)."""
    return f"{pod_name}.{secrets.token_hex(4)}"


def _is_ours(body: dict[str, Any]) -> bool:
    on_body = body.get("metadata", {}).get("labels") or {}
    return bool(on_body.get(labels.MANAGED_BY_LABEL) == labels.MANAGED_BY_VALUE)


def _counter_sets(bodies: list[Any]) -> int:
    return sum(len((b.get("spec") or {}).get("sharedCounters") or ()) for b in bodies)


def _shared_count(bodies: list[Any]) -> int:
    return sum(
        1
        for b in bodies
        if isinstance(b, dict)
        for d in (b.get("spec") or {}).get("devices") or ()
        if d.get("allowMultipleAllocations")
    )


def _taint_count(bodies: list[Any]) -> int:
    return sum(
        len(d.get("taints") or ())
        for b in bodies
        if isinstance(b, dict)
        for d in (b.get("spec") or {}).get("devices") or ()
    )


def _not_done(exc: Exception) -> bool:
    """Whether a failed request was not carried out: no answer (the API server away), or 429
    or 5xx (it did not take the request). Such a failure says nothing of what the API holds."""
    if isinstance(exc, kube.ApiError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, OSError)


def _version(body: kube.Body) -> int:
    """A slice's resourceVersion as a number (kube-apiserver's are etcd revisions, which only
    grow); 0 where it is not one (then the newer copy is whichever came last)."""
    rv = str(body.get("metadata", {}).get("resourceVersion", ""))
    return int(rv) if rv.isdigit() else 0


def _generation(body: dict[str, Any]) -> int:
    return int(body["spec"]["pool"].get("generation", 0))

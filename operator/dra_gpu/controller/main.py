"""The controller: a Kopf operator that watches, and a reconcile loop that explains and repairs.

Kopf runs only ``on.event`` handlers: they feed the in-memory ``ClusterView`` and wake the loop.
Event handlers are the one kind of Kopf handler that stores nothing on the objects — no
annotations, no finalizers — which matters because Pods, ResourceClaims and DeviceClasses belong
to users. Kopf's own event posting is off; our Events are posted by the ``Reporter``.

Every replica keeps the view and computes the metrics; only the holder of the Lease writes:
explanations of pending claims, reports of incomplete pools, deletion of our slices whose
Node is gone, removal of ``status.devices`` entries of ours whose device is no longer allocated.

A pass costs what changed since the last one, not what the cluster holds: the view indexes
what it is fed and hands each pass its ``Changes``; each part takes them in turn:

- watch wiring (``Controller.registry``): Kopf events -> ``ClusterView.apply``;
- the indexed view (``view.ClusterView``): pods by claim, pools, holders, claim states;
- metrics (``tallies.Tally``): per-pool contributions to the per-node and per-class sums;
- explanations (``explaining.Explainer``): claims whose inputs changed (class epochs), their
  Events posted by a task of its own, so a pass never waits for the API server;
- class checks (``_check_classes``): edited classes, classes that admit no device;
- pool reports (``_report_pools``): pools whose slices changed;
- stale slices (``_delete_stale_slices``): slices changed, nodes gone;
- status repair (``_repair_device_status``): claims changed;

and a replica that becomes the leader sweeps everything once, then follows the changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any, NoReturn, cast

import kopf

from dra_gpu import cel, httpserver, kube, metrics, slices
from dra_gpu.config import ControllerSettings
from dra_gpu.controller import explain, inventory, selections
from dra_gpu.controller.explaining import Explainer, class_drivers
from dra_gpu.controller.leader import LeaderElector
from dra_gpu.controller.reporter import Reporter
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.tallies import Tally, class_selectors
from dra_gpu.controller.view import Changes, ClusterView

log = logging.getLogger(__name__)
RESOURCE = "/apis/resource.k8s.io/v1"
WATCHED = (
    ("resource.k8s.io", "v1", "deviceclasses", "DeviceClass"),
    ("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim"),
    ("resource.k8s.io", "v1", "resourceslices", "ResourceSlice"),
    ("", "v1", "pods", "Pod"),
    ("", "v1", "nodes", "Node"),
)


class Controller:
    def __init__(self, settings: ControllerSettings, api: kube.Kube) -> None:
        self.settings = settings
        self.api = api
        self.driver = settings.driver_name
        identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
        self.view = ClusterView(pods_without_claims=False)
        self.leader = LeaderElector(
            api,
            namespace=settings.namespace,
            name=settings.lease_name,
            identity=identity,
            lease_seconds=settings.lease_seconds,
            renew_seconds=max(1.0, settings.lease_seconds / 3),
        )
        self.reporter = Reporter(api, identity)
        self.selections = Selections()
        self.tally = Tally(self.driver, self.selections)
        self.explainer = Explainer(self.view, self.reporter, self.driver, self.selections)
        self._wake = asyncio.Event()
        self._leading = False
        # Leader's work still to do: what changed since it last ran (all of it on taking over).
        self._classes_to_check: set[str] = set()
        self._slices_to_check: set[str] = set()
        self._claims_to_repair: set[str] = set()
        self._class_warnings: dict[str, str] = {}
        self._pool_warnings: dict[str, str] = {}
        self._prepare_events: dict[str, int] = {}
        self.reconciled = 0

    # ---- Kopf ----------------------------------------------------------------------------

    def registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()
        for group, version, plural, kind in WATCHED:
            self._watch(registry, group, version, plural, kind)

        @kopf.on.login(registry=registry)
        async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            # A registry of our own has none of Kopf's default handlers; log in as they would.
            return await kopf.login_via_async_client(**kwargs)

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.posting.enabled = False  # our Events say what happened, Kopf's would not
            settings.scanning.disabled = True  # we watch built-in kinds only: no CRD discovery
            settings.persistence.diffbase_storage = _NoDiffBase()
            settings.watching.chunk_size = 500  # list a big cluster's Pods without a big spike
            per_object = logging.getLogger("kopf.objects")
            if not per_object.isEnabledFor(logging.DEBUG):
                # "Handler ... succeeded" for every watch event: what we saw, not what we did.
                per_object.setLevel(logging.WARNING)
            settings.watching.server_timeout = 300
            settings.watching.client_timeout = 330
            settings.networking.error_backoffs = [1, 2, 5]

        return registry

    def _watch(
        self, registry: kopf.OperatorRegistry, group: str, version: str, plural: str, kind: str
    ) -> None:
        @kopf.on.event(group, version, plural, registry=registry)
        async def changed(event: dict[str, Any], **_: Any) -> None:
            if self.view.apply(kind, event.get("type"), event["object"]):
                self._wake.set()

    # ---- the kubelet's prepare failures ---------------------------------------------------

    async def count_prepare_failures_forever(self) -> None:
        """Counts the kubelet's FailedPrepareDynamicResources events. Our own watch, not
        Kopf's: its field filter is applied client-side, so every Event of the cluster would
        reach us; the API server filters this one."""
        events = self.api.watch_forever(
            "/api/v1/events", fieldSelector=f"reason={explain.PREPARE_FAILED}"
        )
        async for kind, body in events:
            if kind == "SYNC":  # a (re)list: what expired meanwhile is forgotten
                items = body.get("items", [])
                listed = {item.get("metadata", {}).get("uid") for item in items}
                for uid in set(self._prepare_events) - listed:
                    del self._prepare_events[uid]
                for item in items:
                    self._count_prepare_failures(item)
            elif kind == "DELETED":  # events expire (1 h): forget them with it
                self._prepare_events.pop(body.get("metadata", {}).get("uid", ""), None)
            else:
                self._count_prepare_failures(body)

    def _count_prepare_failures(self, event: kube.Body) -> None:
        uid, count = event.get("metadata", {}).get("uid", ""), int(event.get("count") or 1)
        seen = self._prepare_events.get(uid, 0)
        if count > seen:
            metrics.PREPARE_FAILURES.inc(count - seen)
            self._prepare_events[uid] = count

    # ---- the loop ------------------------------------------------------------------------

    async def run_forever(self) -> NoReturn:
        """Passes over the view, and the posting of what they explain, side by side: a pass
        never waits for the API server to take Events, so metrics follow the cluster."""
        async with asyncio.TaskGroup() as parts:
            parts.create_task(self._reconcile_forever(), name="reconcile")
            parts.create_task(self.explainer.post_forever(), name="explanations")
        # Neither returns nor raises: both were cancelled on their own (on a stop, Kopf cancels
        # the loop's other tasks), so this one ends cancelled too, as a single loop would.
        raise asyncio.CancelledError

    async def _reconcile_forever(self) -> NoReturn:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.resync_seconds):
                    await _either(self._wake, self.leader.changed)  # a change, or the lease
            self._wake.clear()
            self.leader.changed.clear()
            await asyncio.sleep(0.2)  # let a burst of watch events land first
            try:
                await self.reconcile_once()
            except Exception:
                log.exception("reconcile failed; retrying on the next change")

    async def reconcile_once(self) -> None:
        """One pass: take what changed since the last one, update the metrics, and (leader)
        explain, check and repair what it touches."""
        changes = self.view.take_changes()
        self.tally.update(self.view, changes, datetime.datetime.now(datetime.UTC))
        self.explainer.note(changes)
        self._forget_unused(changes)
        metrics.LEADER.set(1 if self.leader.is_leader else 0)
        if self.leader.is_leader:
            if not self._leading:  # just took over: everything is news to this leader
                self._leading = True
                self.explainer.restart()
                self._classes_to_check = set(self.view.classes)
                self._slices_to_check = set(self.view.slices)
                self._claims_to_repair = set(self.view.claims)
            self._note_leader_work(changes)
            await self.explainer.explain_pending()
            await self._check_classes()
            self._report_pools()
            await self._delete_stale_slices()
            await self._repair_device_status()
        else:
            self._leading = False
            self.explainer.drop_queue()
        self.reconciled += 1
        metrics.RECONCILES.inc()

    def _forget_unused(self, changes: Changes) -> None:
        if changes.classes:  # selector lists of old class versions; requests' come back
            self.selections.keep_only(
                selections.list_key(class_selectors(c)) for c in self.view.classes.values()
            )
        gone = [key for key in changes.pools if key not in self.view.pools]
        if gone:
            self.selections.forget_pools(gone)

    def _note_leader_work(self, changes: Changes) -> None:
        self._classes_to_check |= changes.classes
        if changes.pools:  # what no device satisfies may now be satisfied, and vice versa
            self._classes_to_check |= {
                name for name, counts in self.tally.admitted.items() if not counts[2]
            }
            self._classes_to_check |= set(self._class_warnings)
        self._slices_to_check |= changes.slices
        gone = {n for n in changes.nodes if n not in self.view.nodes}
        if gone:
            self._slices_to_check |= {
                name
                for name, body in self.view.slices.items()
                if (body.get("spec") or {}).get("nodeName") in gone
            }
        self._claims_to_repair |= changes.claims

    # ---- leader's work -------------------------------------------------------------------

    async def _check_classes(self) -> None:
        """A selector that cannot compile, or that no published device of any driver satisfies,
        gets one Warning Event on the DeviceClass (again only when the reason changes)."""
        published: tuple[int, inventory.PublishedDevice | None] | None = None
        for name in sorted(self._classes_to_check):
            self._classes_to_check.discard(name)
            device_class = self.view.classes.get(name)
            if device_class is None:
                self._class_warnings.pop(name, None)
                continue
            drivers = class_drivers(device_class)
            if drivers and self.driver not in drivers:
                continue  # another driver's class: not ours to judge
            if published is None:
                published = _published(self.view)
            admitted = self.tally.admitted.get(name, [0, 0, 0])[2]
            problem = _class_problem(device_class, admitted, *published)
            if problem is None:
                self._class_warnings.pop(name, None)
                continue
            reason, message = problem
            if self._class_warnings.get(name) == message:
                continue
            self._class_warnings[name] = message
            log.warning("DeviceClass %s: %s", name, message)
            await self.reporter.warn(device_class, "DeviceClass", reason, message)

    def _report_pools(self) -> None:
        current = {
            p.pool: p.message for p in self.tally.problems.values() if p.driver == self.driver
        }
        for pool, message in sorted(current.items()):
            if self._pool_warnings.get(pool) != message:
                log.warning("%s", message)
        self._pool_warnings = current

    async def _delete_stale_slices(self) -> None:
        for name in sorted(self._slices_to_check):
            body = self.view.slices.get(name)
            if body is None:
                self._slices_to_check.discard(name)
                continue
            labels = body["metadata"].get("labels") or {}
            node = body["spec"].get("nodeName")
            if (
                labels.get(slices.MANAGED_BY_LABEL) != slices.MANAGED_BY_VALUE
                or body["spec"].get("driver") != self.driver
                or not node
                or node in self.view.nodes
            ):
                self._slices_to_check.discard(name)
                continue
            try:  # the view may lag: only the API server can say the Node is gone
                await self.api.get(f"/api/v1/nodes/{node}")
                continue  # checked again on the next pass
            except kube.ApiError as exc:
                if not exc.not_found:
                    raise
            log.warning("deleting ResourceSlice %s: its node %s no longer exists", name, node)
            await self.api.delete(f"{RESOURCE}/resourceslices/{name}", uid=body["metadata"]["uid"])
            self._slices_to_check.discard(name)
            metrics.STALE_SLICES_DELETED.inc()

    async def _repair_device_status(self) -> None:
        for key in sorted(self._claims_to_repair):
            claim = self.view.claims.get(key)
            self._claims_to_repair.discard(key)
            if claim is None:
                continue
            status = claim.get("status", {})
            entries = status.get("devices") or []
            allocated = {
                (r["driver"], r["pool"], r["device"])
                for r in (status.get("allocation") or {}).get("devices", {}).get("results") or []
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
                    self._claims_to_repair.add(key)
                    raise
                continue  # changed meanwhile: the new version comes as a change
            metrics.DEVICE_STATUS_REPAIRS.inc(len(stale))


class _NoDiffBase(kopf.DiffBaseStorage):
    """Kopf's record of an object's last handled state, which only change handlers read: the
    controller has event handlers only, so it keeps none. Nothing is stored on the objects, and
    no watch event pays for a deep copy of its object (most of what Kopf spent per event)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


async def _either(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


# ---- class checks (pure) -------------------------------------------------------------------


def _selectors(device_class: kube.Body) -> list[str]:
    return [
        s["cel"]["expression"]
        for s in device_class.get("spec", {}).get("selectors") or []
        if "cel" in s
    ]


def _published(view: ClusterView) -> tuple[int, inventory.PublishedDevice | None]:
    """How many devices (any driver) complete pools hold, and the first of them, in the
    order of ``inventory.current_pools``."""
    count, first = 0, None
    for key in sorted(view.pools):
        pool = view.pools[key]
        if pool.complete and pool.devices:
            count += len(pool.devices)
            first = first or pool.devices[0]
    return count, first


def _class_problem(
    device_class: kube.Body,
    admitted: int,
    published: int,
    first: inventory.PublishedDevice | None,
) -> tuple[str, str] | None:
    """``admitted``: devices of complete pools (any driver) the class admits; ``published``:
    all of them, ``first`` the first."""
    name = device_class["metadata"]["name"]
    for index, expression in enumerate(_selectors(device_class)):
        compiled = cel.compile_selector(expression)
        if compiled.error:  # the API server checks syntax; this catches what it cannot
            return "InvalidSelector", (
                f"DeviceClass {name}: spec.selectors[{index}].cel.expression "
                f"{' '.join(expression.split())!r} does not compile: {compiled.error}"
            )
    if not published or admitted or first is None:
        return None
    why = ""
    for index, expression in enumerate(_selectors(device_class)):
        verdict = cel.evaluate(cel.compile_selector(expression), first.driver, first.body)
        if verdict.error:
            why = f"; e.g. {first.node}/{first.body['name']}: selector #{index}: "
            why += verdict.error
            break
    return "NoDeviceMatches", (
        f"DeviceClass {name}: none of the {published} published devices satisfies its "
        f"selectors; claims of this class cannot be allocated{why}"
    )


# ---- running ---------------------------------------------------------------------------------


async def run_controller(settings: ControllerSettings, stopping: asyncio.Event) -> None:
    """Probes first, then wait for the API server (as the agent does: a Deployment whose API
    server is not there yet must not crash-loop), then Kopf and our loops."""
    async with await kube.Kube.connect(settings.kubeconfig) as api:
        controller = Controller(settings, api)
        kopf_stop = asyncio.Event()
        waiting: str | None = f"the API server at {api.server} has not answered yet"

        def still_waiting(reason: str) -> None:
            nonlocal waiting
            waiting = reason

        async def healthz() -> tuple[bool, str]:
            return True, "ok"

        async def readyz() -> tuple[bool, str]:
            if waiting is not None:
                return False, waiting
            ok = controller.reconciled > 0
            return ok, "ok" if ok else "no complete pass over the cluster yet"

        async with httpserver.serving(
            settings.bind_address,
            settings.metrics_port,
            settings.health_port,
            registry=metrics.CONTROLLER,
            healthz=healthz,
            readyz=readyz,
        ):
            if not await api.wait_until_ready(stopping, on_attempt=still_waiting):
                return  # stopped before the API server answered
            waiting = None
            tasks = [
                asyncio.create_task(
                    kopf.operator(
                        registry=controller.registry(),
                        clusterwide=True,
                        standalone=True,
                        # Ours, not Kopf's guess: that asks the passwd database for the user,
                        # and an image's uid (65532) has no entry there — a crash at start.
                        identity=controller.leader.identity,  # type: ignore[arg-type]
                        stop_flag=kopf_stop,
                    ),
                    name="kopf",
                ),
                asyncio.create_task(controller.leader.run_forever(), name="leader"),
                asyncio.create_task(controller.run_forever(), name="reconcile"),
                asyncio.create_task(
                    controller.count_prepare_failures_forever(), name="prepare-failures"
                ),
            ]
            stop = asyncio.create_task(stopping.wait(), name="stop")
            done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
            kopf_stop.set()
            stop.cancel()
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await controller.leader.release()
            for task in done - {stop}:
                # Kopf handles SIGTERM too and cancels the loop's tasks: a stop, not a failure.
                if not task.cancelled() and task.exception():
                    raise task.exception()  # type: ignore[misc]

"""The controller: a Kopf operator that watches, and a reconcile loop that explains and repairs.

Kopf runs only ``on.event`` handlers: they feed the in-memory ``ClusterView`` and wake the loop.
Event handlers are the one kind of Kopf handler that stores nothing on the objects — no
annotations, no finalizers — which matters because Pods, ResourceClaims and DeviceClasses belong
to users. Kopf's own event posting is off; our Events are posted by the ``Reporter``.

Every replica keeps the view and computes the metrics; only the holder of the Lease writes:
explanations of pending claims, reports of inconsistent pools, deletion of our slices whose
Node is gone, removal of ``status.devices`` entries of ours whose device is no longer allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import re
import socket
from typing import Any, NoReturn

import kopf

from dra_gpu import cel, httpserver, kube, metrics, slices
from dra_gpu.config import ControllerSettings
from dra_gpu.controller import explain, inventory
from dra_gpu.controller.leader import LeaderElector
from dra_gpu.controller.reporter import Reporter
from dra_gpu.controller.view import ClusterView

log = logging.getLogger(__name__)
RESOURCE = "/apis/resource.k8s.io/v1"
WATCHED = (
    ("resource.k8s.io", "v1", "deviceclasses", "DeviceClass"),
    ("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim"),
    ("resource.k8s.io", "v1", "resourceslices", "ResourceSlice"),
    ("", "v1", "pods", "Pod"),
    ("", "v1", "nodes", "Node"),
)


def _timestamp(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


class Controller:
    def __init__(self, settings: ControllerSettings, api: kube.Kube) -> None:
        self.settings = settings
        self.api = api
        self.driver = settings.driver_name
        self.identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
        self.view = ClusterView()
        self.leader = LeaderElector(
            api,
            namespace=settings.namespace,
            name=settings.lease_name,
            identity=self.identity,
            lease_seconds=settings.lease_seconds,
            renew_seconds=max(1.0, settings.lease_seconds / 3),
        )
        self.reporter = Reporter(api, self.identity)
        self._wake = asyncio.Event()
        self._timed_pods: dict[str, set[str]] = {"allocated": set(), "running": set()}
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
            settings.watching.server_timeout = 300
            settings.watching.client_timeout = 330
            settings.networking.error_backoffs = [1, 2, 5]

        return registry

    def _watch(
        self, registry: kopf.OperatorRegistry, group: str, version: str, plural: str, kind: str
    ) -> None:
        @kopf.on.event(group, version, plural, registry=registry)
        async def changed(event: dict[str, Any], **_: Any) -> None:
            self.view.apply(kind, event.get("type"), event["object"])
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
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.resync_seconds)
            self._wake.clear()
            await asyncio.sleep(0.2)  # let a burst of watch events land first
            try:
                await self.reconcile_once()
            except Exception:
                log.exception("reconcile failed; retrying on the next change")

    async def reconcile_once(self) -> None:
        devices, problems = inventory.current_pools(self.view.slices.values())
        holders = inventory.allocated(self.view.claims.values())
        self._update_metrics(devices, holders)
        metrics.INCONSISTENT_POOLS.set(sum(p.driver == self.driver for p in problems))
        metrics.LEADER.set(1 if self.leader.is_leader else 0)
        if self.leader.is_leader:
            await self._explain_pending()
            await self._check_classes(devices)
            self._report_pools(problems)
            await self._delete_stale_slices()
            await self._repair_device_status()
        self.reconciled += 1
        metrics.RECONCILES.inc()

    # ---- metrics -------------------------------------------------------------------------

    def _update_metrics(
        self, devices: list[inventory.PublishedDevice], holders: dict[inventory.DeviceKey, str]
    ) -> None:
        for node, counts in inventory.per_node(devices, holders, self.driver).items():
            metrics.DEVICES.labels(node, "published").set(counts.published)
            metrics.DEVICES.labels(node, "allocated").set(counts.allocated)
            metrics.DEVICES.labels(node, "free").set(counts.free)
            metrics.MEMORY.labels(node, "published").set(counts.memory)
            metrics.MEMORY.labels(node, "allocated").set(counts.memory_allocated)
            metrics.MEMORY.labels(node, "free").set(counts.memory - counts.memory_allocated)
        ours = [d for d in devices if d.driver == self.driver]
        for name, device_class in self.view.classes.items():
            admitted = [d for d in ours if _admits(device_class, d)]
            taken = sum(d.key in holders for d in admitted)
            metrics.CLASS_DEVICES.labels(name, "published").set(len(admitted))
            metrics.CLASS_DEVICES.labels(name, "allocated").set(taken)
            metrics.CLASS_DEVICES.labels(name, "free").set(len(admitted) - taken)
        states = {"pending": 0, "allocated": 0, "reserved": 0}
        for claim in self.view.claims.values():
            states[inventory.claim_state(claim)] += 1
        for state, count in states.items():
            metrics.CLAIMS.labels(state).set(count)
        self._time_pods()

    def _time_pods(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        for pod in self.view.pods.values():
            refs = pod["spec"].get("resourceClaims") or []
            created = _timestamp(pod["metadata"].get("creationTimestamp"))
            uid = pod["metadata"]["uid"]
            if not refs or created is None:
                continue
            if uid not in self._timed_pods["allocated"] and self._claims_allocated(pod):
                metrics.POD_CLAIMS_ALLOCATED_SECONDS.observe((now - created).total_seconds())
                self._timed_pods["allocated"].add(uid)
            if uid not in self._timed_pods["running"] and pod["status"].get("phase") == "Running":
                metrics.POD_RUNNING_SECONDS.observe((now - created).total_seconds())
                self._timed_pods["running"].add(uid)
        alive = {p["metadata"]["uid"] for p in self.view.pods.values()}
        for seen in self._timed_pods.values():
            seen &= alive

    def _claims_allocated(self, pod: kube.Body) -> bool:
        namespace = pod["metadata"]["namespace"]
        names = {
            s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
        }
        names |= {r.get("resourceClaimName") for r in pod["spec"].get("resourceClaims") or []}
        names.discard(None)
        wanted = len(pod["spec"].get("resourceClaims") or [])
        found = [self.view.claims.get(f"{namespace}/{n}") for n in names]
        allocated = [c for c in found if c and c.get("status", {}).get("allocation")]
        return len(allocated) >= wanted

    # ---- leader's work -------------------------------------------------------------------

    async def _explain_pending(self) -> None:
        pending_uids = set()
        for claim in self.view.pending_claims():
            waiting = [p for p in self.view.pods_of(claim) if not p["spec"].get("nodeName")]
            if not waiting or not self._concerns_us(claim):
                continue
            pending_uids.add(claim["metadata"]["uid"])
            result = explain.explain_claim(
                claim,
                pod=waiting[0],
                classes=self.view.classes,
                slices=list(self.view.slices.values()),
                claims=list(self.view.claims.values()),
                nodes=self.view.nodes,
            )
            if result.missing:
                await self.reporter.report(claim, waiting, str(result.reason), result.message)
        self.reporter.keep_only(pending_uids)

    def _concerns_us(self, claim: kube.Body) -> bool:
        """False when every request's class exists and selects another driver only."""
        for request in claim["spec"].get("devices", {}).get("requests") or []:
            choices = (
                [request["exactly"]]
                if "exactly" in request
                else request.get("firstAvailable") or []
            )
            for choice in choices:
                device_class = self.view.classes.get(choice.get("deviceClassName", ""))
                drivers = _class_drivers(device_class) if device_class else set()
                if not drivers or self.driver in drivers:
                    return True
        return False

    async def _check_classes(self, devices: list[inventory.PublishedDevice]) -> None:
        """A selector that cannot compile, or that no published device of any driver satisfies,
        gets one Warning Event on the DeviceClass (again only when the reason changes)."""
        for name, device_class in sorted(self.view.classes.items()):
            drivers = _class_drivers(device_class)
            if drivers and self.driver not in drivers:
                continue  # another driver's class: not ours to judge
            problem = _class_problem(device_class, devices)
            if problem is None:
                self._class_warnings.pop(name, None)
                continue
            reason, message = problem
            if self._class_warnings.get(name) == message:
                continue
            self._class_warnings[name] = message
            log.warning("DeviceClass %s: %s", name, message)
            await self.reporter.warn(device_class, "DeviceClass", reason, message)

    def _report_pools(self, problems: list[inventory.PoolProblem]) -> None:
        current = {p.pool: p.message for p in problems if p.driver == self.driver}
        for pool, message in current.items():
            if self._pool_warnings.get(pool) != message:
                log.warning("%s", message)
        self._pool_warnings = current

    async def _delete_stale_slices(self) -> None:
        for body in list(self.view.slices.values()):
            labels = body["metadata"].get("labels") or {}
            node = body["spec"].get("nodeName")
            if (
                labels.get(slices.MANAGED_BY_LABEL) != slices.MANAGED_BY_VALUE
                or body["spec"].get("driver") != self.driver
                or not node
                or node in self.view.nodes
            ):
                continue
            try:  # the view may lag: only the API server can say the Node is gone
                await self.api.get(f"/api/v1/nodes/{node}")
                continue
            except kube.ApiError as exc:
                if not exc.not_found:
                    raise
            name = body["metadata"]["name"]
            log.warning("deleting ResourceSlice %s: its node %s no longer exists", name, node)
            await self.api.delete(f"{RESOURCE}/resourceslices/{name}", uid=body["metadata"]["uid"])
            metrics.STALE_SLICES_DELETED.inc()

    async def _repair_device_status(self) -> None:
        for claim in list(self.view.claims.values()):
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
                    raise
                continue  # changed meanwhile: the next pass sees the new version
            metrics.DEVICE_STATUS_REPAIRS.inc(len(stale))


# ---- class checks (pure) -------------------------------------------------------------------


def _selectors(device_class: kube.Body) -> list[str]:
    return [
        s["cel"]["expression"]
        for s in device_class.get("spec", {}).get("selectors") or []
        if "cel" in s
    ]


def _class_drivers(device_class: kube.Body) -> set[str]:
    drivers = set()
    for expression in _selectors(device_class):
        drivers |= set(re.findall(r'device\.driver\s*==\s*"([^"]+)"', expression))
    return drivers


def _admits(device_class: kube.Body, device: inventory.PublishedDevice) -> bool:
    for expression in _selectors(device_class):
        compiled = cel.compile_selector(expression)
        if compiled.error or not cel.evaluate(compiled, device.driver, device.body).matched:
            return False
    return True


def _class_problem(
    device_class: kube.Body, devices: list[inventory.PublishedDevice]
) -> tuple[str, str] | None:
    name = device_class["metadata"]["name"]
    for index, expression in enumerate(_selectors(device_class)):
        compiled = cel.compile_selector(expression)
        if compiled.error:  # the API server checks syntax; this catches what it cannot
            return "InvalidSelector", (
                f"DeviceClass {name}: spec.selectors[{index}].cel.expression "
                f"{' '.join(expression.split())!r} does not compile: {compiled.error}"
            )
    if not devices or any(_admits(device_class, d) for d in devices):
        return None
    why = ""
    for index, expression in enumerate(_selectors(device_class)):
        verdict = cel.evaluate(cel.compile_selector(expression), devices[0].driver, devices[0].body)
        if verdict.error:
            why = f"; e.g. {devices[0].node}/{devices[0].body['name']}: selector #{index}: "
            why += verdict.error
            break
    return "NoDeviceMatches", (
        f"DeviceClass {name}: none of the {len(devices)} published devices satisfies its "
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
                        identity=controller.identity,  # type: ignore[arg-type]
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
                if task.exception():
                    raise task.exception()  # type: ignore[misc]

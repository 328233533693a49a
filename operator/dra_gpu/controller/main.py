"""The controller: its jobs, each a part with one owner, run under one TaskGroup.

Every replica watches (Kopf, ``wiring``), keeps the indexed view (``view.ClusterView``) and
computes the metrics; only the holder of the Lease (``leader.LeaderElector``) writes, and serves
the cluster-wide series (``metrics.CLUSTER_WIDE``). A pass
takes the batch of changes the view noted since the last one and hands it to each part, so it
costs what changed, not what the cluster holds:

=====================  =====================================  =================================
job                    part                                   works on (per pass)
=====================  =====================================  =================================
watch wiring           ``wiring.registry`` / ``watching``     Kopf ``on.event`` -> ``view.apply``
the indexed view       ``view.ClusterView``                   (fed by the watches)
start-up reads         ``startup.StartUp``                    its own lists at start ->
                                                              ``view.offer``; changed claims
                                                              whose pod is not known yet
prepare failures       ``prepares.PrepareFailures``           its own watch of the kubelet's
                                                              Events -> the view, a counter
metrics                ``tallies.Tally``                      changed pools, devices, classes
pod timings            ``timings.PodTimings``                 changed pods and their claims'
claim explanations     ``explainer.Explainer``                claims whose inputs changed;
                                                              posted by a task of its own
admission (all)        ``admission.webhook.Webhook``          Kopf ``on.validate``: each review
                                                              against the view; certificates
class checks           ``classes.ClassChecks``                edited classes; after pool changes
pool/slice checks      ``pools.PoolChecks``                   changed slices, vanished nodes
status repair          ``repair.StatusRepair``                changed claims
driver gone            ``absences.DriverGone``                nodes whose agent pods, pools or
                                                              Node changed (all: tracking;
                                                              leader: DeviceTaintRules)
=====================  =====================================  =================================

A replica that becomes the leader (the loop wakes on the lease) has each leader part sweep
everything once, then follow the changes; one that stops leading drops what it had queued.
Nothing of the leader's runs before the start-up reads are done (``StartUp.complete``): until
then the view may still miss classes, slices, claims or waiting pods, and an explanation or a
check worked out on it would be posted, then changed once they are there. The metrics follow
the view from the first pass; readiness and admission's warnings wait for the first pass after
the start-up reads (``settled``).

``Controller.run`` runs the jobs — the lease, the passes, the posting of explanations, the
watch of prepare failures, Kopf's health — in one TaskGroup until ``stopping`` is set: a job that
fails ends them all, and the process with its error. ``run_controller`` orders the stop: the
jobs end first, the lease is released (a standby takes over at once), then Kopf stops; a
SIGTERM so ends in seconds with exit code 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
from collections.abc import Coroutine, Mapping
from typing import Any, NoReturn

import kopf

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller import agents, explain, selections, startup, wiring
from dra_gpu.controller.absences import DriverGone
from dra_gpu.controller.admission.webhook import Webhook
from dra_gpu.controller.classes import ClassChecks
from dra_gpu.controller.explainer import Explainer
from dra_gpu.controller.leader import LeaderElector, NotLeading
from dra_gpu.controller.pools import PoolChecks
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.prepares import PrepareFailures
from dra_gpu.controller.repair import StatusRepair
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.selectors import class_selectors
from dra_gpu.controller.tallies import Tally
from dra_gpu.controller.timings import PodTimings
from dra_gpu.controller.view import Changes, ClusterView
from dra_gpu.serving import collector, httpserver, metrics

log = logging.getLogger(__name__)
SETTLE_SECONDS = 0.2
"""A pass starts this long after the first change of a burst, so the burst lands first."""
WARM_BUDGET = 1.0
"""Seconds an admission review may spend working out a new selector on every device before
the object is admitted without a warning (the webhook's timeout is 5 s by default)."""
WARM_BREAK = 0.005
"""Seconds of that work between two breaks for the event loop."""


class _Stopped(Exception):
    """``stopping`` was set: the jobs end (not a failure)."""


class Controller:
    def __init__(self, settings: ControllerSettings, api: kube.Kube) -> None:
        self.settings = settings
        self.api = api
        self.driver = settings.driver_name
        identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
        selector = (
            agents.AgentSelector(settings.agent_pod_selector, settings.agent_namespace)
            if settings.agent_pod_selector
            else None
        )
        self.view = ClusterView(pods_without_claims=False, agent_pods=selector)
        self.leader = LeaderElector(
            api,
            namespace=settings.namespace,
            name=settings.lease_name,
            identity=identity,
            lease_seconds=settings.lease_seconds,
        )
        events_api = api.limited(
            settings.event_qps, settings.event_burst, "--event-qps, --event-burst"
        )
        self.reporter = Reporter(events_api, identity, lambda: self.leader.is_leader)
        self.selections = Selections()
        self.tally = Tally(self.driver, self.selections)
        self.timings = PodTimings()
        self.explainer = Explainer(self.view, self.reporter, self.driver, self.selections)
        self.prepares = PrepareFailures(api, self.view, self.wake)
        self.classes = ClassChecks(self.view, self.tally, self.reporter, self.driver)
        self.pools = PoolChecks(self.view, self.tally, api, self.driver)
        self.repair = StatusRepair(self.view, api, self.driver)
        self.driver_gone = DriverGone(
            self.view,
            api,
            self.reporter,
            self.driver,
            settings.driver_gone_seconds,
            self.wake,
            enabled=selector is not None,
        )
        self.startup = startup.StartUp(api, self.view, self.wake)
        self._wake = asyncio.Event()
        self._leading = False
        self._starting = False  # ``run`` started the start-up reads: the leader waits for them
        self.reconciled = 0
        self.settled = False
        """A pass has run over the view the start-up reads completed (or, fed by hand as in
        tests, over whatever it holds): explanations, readiness and admission's warnings may
        trust it."""
        self.webhook = (
            Webhook(
                settings,
                api,
                self.explain_now,
                self.warm,
                is_leader=lambda: self.leader.is_leader,
                leader_changed=self.leader.changed,
            )
            if settings.webhook_port
            else None
        )

    def wake(self) -> None:
        """Something changed: a pass is due."""
        self._wake.set()

    def registry(self) -> kopf.OperatorRegistry:
        """Kopf's handlers; DeviceTaintRules watched in the version served (``discover``)."""
        rules, heard = self.driver_gone.version, self.startup.heard
        if self.webhook is None:
            return wiring.registry(self.view, self.wake, taint_rules=rules, heard=heard)
        handlers = wiring.registry(
            self.view, self.wake, self.webhook.server, taint_rules=rules, heard=heard
        )
        self.webhook.register(handlers)
        return handlers

    async def warm(self, claim: Mapping[str, Any]) -> bool:
        """Work out ``claim``'s selectors on every device of this replica's view (admission,
        before ``explain_now``), taking a break every ``WARM_BREAK`` seconds; False when it
        took longer than ``WARM_BUDGET`` (or before the view is settled)."""
        if not self.settled:
            return False
        loop = asyncio.get_running_loop()
        layout = self.explainer.current_world().layout
        deadline = loop.time() + WARM_BUDGET
        pause = loop.time() + WARM_BREAK
        for selectors in explain.selector_lists(claim):
            for _pool in layout.warming(selectors):
                if loop.time() > pause:
                    await asyncio.sleep(0)
                    pause = loop.time() + WARM_BREAK
                if loop.time() > deadline:
                    return False
        return True

    def explain_now(self, claim: Mapping[str, Any]) -> explain.Explanation | None:
        """``claim`` against this replica's view as of its last pass (admission's warnings);
        None until the view is settled (``settled``: it may still be filling)."""
        if not self.settled:
            return None
        world = self.explainer.current_world()
        return explain.explain(claim, world, classes=self.view.classes, detail=False)

    # ---- running -------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event, kopf_task: asyncio.Task[None] | None) -> None:
        """Every job until ``stopping`` is set; a job's failure ends the others and is
        raised. ``kopf_task``: Kopf (``wiring.watching``), whose failure ends the controller."""
        try:
            async with asyncio.TaskGroup() as jobs:
                jobs.create_task(self.start_up(), name="start-up")
                jobs.create_task(collector.Collector(metrics.GC_PAUSES).run_forever(), name="gc")
                jobs.create_task(self.leader.run_forever(), name="lease")
                jobs.create_task(self.reconcile_forever(), name="passes")
                jobs.create_task(self.explainer.post_forever(), name="explanations")
                jobs.create_task(self.prepares.watch_forever(), name="prepare-failures")
                if kopf_task is not None:
                    jobs.create_task(wiring.wait_for_kopf(kopf_task), name="watches")
                if self.webhook is not None:
                    jobs.create_task(self.webhook.run_forever(), name="webhook-certificates")
                jobs.create_task(_raise_when(stopping), name="stop")
        except* _Stopped:
            pass

    def start_up(self) -> Coroutine[Any, Any, None]:
        """The start-up reads (``startup.StartUp.run``), to be run as a job; from this call
        on, the leader explains and checks nothing until their lists are done."""
        self._starting = True
        return self.startup.run(self.driver_gone.version)

    async def reconcile_forever(self) -> NoReturn:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.resync_seconds):
                    await _either(self._wake, self.leader.changed)  # a change, or the lease
            self._wake.clear()
            self.leader.changed.clear()
            await asyncio.sleep(SETTLE_SECONDS)
            try:
                await self.reconcile_once()
            except Exception:
                log.exception("reconcile failed; retrying on the next change")

    async def reconcile_once(self) -> None:
        """One pass: take what changed since the last one, update the metrics, and (leader)
        explain, check and repair what it touches."""
        changes = self.view.take_changes()
        # Each part reads the view as it is now (a change since ``take_changes`` is in the
        # next batch): between them, a break for the event loop (admission, watch events).
        self.tally.update(self.view, changes)
        await asyncio.sleep(0)
        self.timings.update(self.view, changes, datetime.datetime.now(datetime.UTC))
        self.driver_gone.track(changes)
        self.explainer.note(changes)
        await asyncio.sleep(0)
        self.startup.note(changes.claims)
        self._forget_unused(changes)
        metrics.LEADER.set(1 if self.leader.is_leader else 0)
        # The cluster-wide series, just brought up to date, are the leader's to serve: a
        # standby's page has none (sums over the replicas count each device once).
        metrics.CLUSTER_WIDE.leading = self.leader.is_leader
        leader_parts = (self.classes, self.pools, self.repair, self.driver_gone)
        # Before the start-up reads are done, the view may still miss what an explanation or
        # a check reads: the leader does nothing yet (and takes over once they are).
        complete = not self._starting or self.startup.complete
        if self.leader.is_leader and complete:
            if not self._leading:  # just took over: everything is news to this leader
                self._leading = True
                self.explainer.restart()
                for part in leader_parts:
                    part.sweep()
            for part in leader_parts:
                part.note(changes)
            # Cut off where the leadership ends (the renew deadline), however long a write
            # inside hangs: no replica writes once another may have taken over.
            try:
                async with self.leader.acting():
                    await self.explainer.explain_pending()
                    for part in leader_parts:
                        await part.run_once()
            except NotLeading:
                pass
            except TimeoutError:
                if self.leader.is_leader:
                    raise  # a request's own timeout, not the leadership's end
        elif not self.leader.is_leader:
            if self._leading:
                log.info("no longer leading: explanations and checks stop")
            self._leading = False
            self.explainer.drop_queue()
        self.reconciled += 1
        self.settled = self.settled or complete
        metrics.RECONCILES.inc()

    def _forget_unused(self, changes: Changes) -> None:
        if changes.classes:  # selector lists of old class versions; requests' come back
            self.selections.keep_only(
                selections.list_key(class_selectors(c)) for c in self.view.classes.values()
            )
        gone = [key for key in changes.pools if key not in self.view.pools]
        if gone:
            self.selections.forget_pools(gone)


async def _raise_when(stopping: asyncio.Event) -> NoReturn:
    await stopping.wait()
    raise _Stopped


async def _either(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def run_controller(settings: ControllerSettings, stopping: asyncio.Event) -> None:
    """Probes first, then wait for the API server (as the agent does: a Deployment whose API
    server is not there yet must not crash-loop), then Kopf and the jobs; on a stop, the jobs
    end, the lease is released, then Kopf stops."""
    async with await kube.Kube.connect(
        settings.kubeconfig,
        observer=metrics.CONTROLLER_API,
        qps=settings.api_qps,
        burst=settings.api_burst,
    ) as api:
        controller = Controller(settings, api)
        waiting: str | None = f"the API server at {api.server} has not answered yet"

        def still_waiting(reason: str) -> None:
            nonlocal waiting
            waiting = reason

        async def healthz() -> tuple[bool, str]:
            return True, "ok"

        async def readyz() -> tuple[bool, str]:
            if waiting is not None:
                return False, waiting
            if not controller.settled:
                return False, "no complete pass over the cluster yet (start-up lists)"
            if controller.webhook is not None:
                return controller.webhook.serving()
            return True, "ok"

        async with httpserver.serving(
            settings, registry=metrics.CONTROLLER, healthz=healthz, readyz=readyz
        ):
            if not await api.wait_until_ready(stopping, on_attempt=still_waiting):
                return  # stopped before the API server answered
            waiting = None
            await controller.driver_gone.discover()  # which DeviceTaintRules to watch
            identity = controller.leader.identity
            async with wiring.watching(controller.registry(), identity, stopping.set) as kopf:
                try:
                    await controller.run(stopping, kopf)
                finally:
                    await controller.leader.release()
                log.info("stopping: jobs ended, lease released; Kopf stops")

"""Watch wiring: Kopf's watches of the five kinds the controller reads, feeding the view.

Owns: the Kopf registry — one ``on.event`` handler per kind (DeviceTaintRules too, in the
version the API server serves, when it serves one: ``absences.served_version``), each a call of
``ClusterView.apply`` that wakes the passes when the view changed, after telling the start-up
what Kopf has handed over (``startup.StartUp.heard``) — Kopf's settings, and Kopf's lifetime in
the process (``watching``). Event handlers are the one kind of Kopf handler that
stores nothing on the objects: no annotations, no finalizers, and with ``_NoDiffBase`` no
"last handled" state either, because Pods, ResourceClaims and DeviceClasses belong to users.
Kopf's own event posting is off; our Events are posted by the ``Reporter``. Kopf also serves the
admission webhook, when the controller gives it one (``admission``).

Kopf takes SIGTERM and SIGINT for itself when it starts, and when it stops it cancels every
task started after it. So ``watching`` gives the signals back to the process once Kopf is up,
and the controller stops its own jobs before Kopf (``run_controller``).

Must not: do any work on an event beyond feeding the view; log per event above DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, NoReturn, cast

import kopf

from dra_gpu.controller.view import ClusterView
from dra_gpu.kube import backoff

log = logging.getLogger(__name__)
WATCHED = (
    ("resource.k8s.io", "v1", "deviceclasses", "DeviceClass"),
    ("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim"),
    ("resource.k8s.io", "v1", "resourceslices", "ResourceSlice"),
    ("", "v1", "pods", "Pod"),
    ("", "v1", "nodes", "Node"),
)
LIST_CHUNK = 500
"""Objects per page of Kopf's initial listings (a big cluster's Pods without a big spike)."""
WORKER_IDLE_SECONDS = 0.2
"""How long Kopf keeps an object's worker task after its last event (Kopf's default: 5 s).
Our one handler per kind only feeds the view, so a worker saves nothing by waiting for the
object's next event; a waiting one keeps its task, queue, timer and the last event's whole body
alive. At the admission benchmark's size that was ~2,000 workers in steady state and ~5,000
during Kopf's listing of the Pods: 60,000-400,000 objects the cyclic collector walked at each
full collection (40-140 ms, about once a second) for nothing."""
KOPF_RETRY = backoff.Backoff(duration=1.0, cap=8.0, jitter=0.5)
"""Between Kopf's tries of a failed API request: 1 s doubling, each up to half again."""
KOPF_RETRIES = 3
"""Tries after the first, as Kopf was told before (1, 2, 5 s)."""


class _Retries:
    """Kopf's ``settings.networking.error_backoffs`` on the package's back-off: Kopf iterates
    it anew for every request, so each request draws its own jitter (a fixed list would send
    every replica's retries at the same moments); Kopf waits at least what the server asked
    for (``Retry-After``)."""

    def __len__(self) -> int:
        return KOPF_RETRIES

    def __iter__(self) -> Iterator[float]:
        delays = KOPF_RETRY.delays()
        return iter([delays.next() for _ in range(KOPF_RETRIES)])


Heard = Callable[[str, str | None], None]
"""Told of each object Kopf hands over: its kind and the event's type (None: Kopf's listing)."""


def registry(
    view: ClusterView,
    changed: Callable[[], None],
    webhook: kopf.WebhookServer | None = None,
    *,
    taint_rules: str | None = None,
    heard: Heard | None = None,
) -> kopf.OperatorRegistry:
    """Kopf's handlers: every watch event of the five kinds into ``view``; ``changed`` is
    called when the view changed (in a field it keeps). ``webhook``: Kopf serves the
    admission handlers added to the registry (``admission.handlers``) there, with no webhook
    configuration of its own (the chart's is the one). ``taint_rules``: the version of
    resource.k8s.io that serves DeviceTaintRules, watched too (None: none is; Kopf would only
    warn of an unresolved resource, but nothing would come of it). ``heard``: told of each
    event first (the start-up's ``StartUp.heard``)."""
    handlers = kopf.OperatorRegistry()
    watched = list(WATCHED)
    if taint_rules is not None:
        watched.append(("resource.k8s.io", taint_rules, "devicetaintrules", "DeviceTaintRule"))
    for group, version, plural, kind in watched:
        _feed(handlers, view, changed, heard, group, version, plural, kind)

    @kopf.on.login(registry=handlers)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A registry of our own has none of Kopf's default handlers; log in as they would.
        return await kopf.login_via_async_client(**kwargs)

    @kopf.on.startup(registry=handlers)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our Events say what happened, Kopf's would not
        settings.scanning.disabled = True  # we watch built-in kinds only: no CRD discovery
        settings.persistence.diffbase_storage = _NoDiffBase()
        settings.watching.chunk_size = LIST_CHUNK
        settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
        per_object = logging.getLogger("kopf.objects")
        if not per_object.isEnabledFor(logging.DEBUG):
            # "Handler ... succeeded" for every watch event: what we saw, not what we did.
            per_object.setLevel(logging.WARNING)
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = _Retries()
        settings.admission.server = webhook
        settings.admission.managed = None

    return handlers


def _feed(
    handlers: kopf.OperatorRegistry,
    view: ClusterView,
    changed: Callable[[], None],
    heard: Heard | None,
    group: str,
    version: str,
    plural: str,
    kind: str,
) -> None:
    @kopf.on.event(group, version, plural, registry=handlers)
    async def on_event(*, event: kopf.RawEvent, **_: Any) -> None:
        event_type = event.get("type")
        if heard is not None:
            heard(kind, event_type)
        if view.apply(kind, event_type, event["object"]):
            changed()


@contextlib.asynccontextmanager
async def watching(
    handlers: kopf.OperatorRegistry, identity: str, on_signal: Callable[[], None]
) -> AsyncIterator[asyncio.Task[None]]:
    """Kopf running ``handlers`` until the block ends, then stopped and awaited. SIGTERM and
    SIGINT call ``on_signal`` again once Kopf has taken them; should Kopf stop on its own
    (a signal before that), ``on_signal`` is called too. Yields Kopf's task: a job can await it
    to end the controller if Kopf fails."""
    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    kopf_task = asyncio.create_task(
        kopf.operator(
            registry=handlers,
            clusterwide=True,
            standalone=True,
            # Ours, not Kopf's guess: that asks the passwd database for the user, and an
            # image's uid (65532) has no entry there — a crash at start.
            identity=cast(Any, identity),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        ),
        name="kopf",
    )

    def ended(task: asyncio.Task[None]) -> None:
        if not stop_flag.is_set() and not task.cancelled() and task.exception() is None:
            log.info("Kopf stopped (a signal): stopping")
            on_signal()

    kopf_task.add_done_callback(ended)
    signals_back = asyncio.create_task(_take_signals_back(ready_flag, on_signal), name="signals")
    try:
        yield kopf_task
    finally:
        signals_back.cancel()
        # Cancelled, not flagged: on a stop flag Kopf would give every task started after it
        # 5 s to end first (the /metrics server's connections, say); the controller's own have
        # ended already (``run_controller``).
        stop_flag.set()
        kopf_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await kopf_task


async def _take_signals_back(ready: asyncio.Event, on_signal: Callable[[], None]) -> None:
    await ready.wait()  # set after Kopf added its own signal handlers
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)


async def wait_for_kopf(kopf_task: asyncio.Task[None]) -> NoReturn:
    """Raises Kopf's failure, if it fails (a job of the controller: Kopf is its eyes). Kopf
    ending without one was a stop, already passed on by ``watching``: then it waits to be
    cancelled with the other jobs."""
    await asyncio.shield(kopf_task)
    await asyncio.get_running_loop().create_future()
    raise AssertionError("never set")


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

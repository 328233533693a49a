"""The node agent's lifecycle: start in a deliberate order, run until told to stop.

1. Inventory backend, API client, checkpoint (a corrupt one is moved aside, reported as an
   Event on the Node, and rebuilt from the API server and the CDI directory), CDI directory
   repaired from the checkpoint; on a node set up for CDI only (``--toolkit-cdi-kind``), the
   toolkit's spec looked for (a warning naming the command that makes it, never a failure).
   All of step 1 holds the node's serialize lock (``DeviceState.serialized``): in a rolling
   update the old pod may be preparing a claim meanwhile.
2. gRPC servers: DRA socket, then registration socket (the kubelet dials as soon as it sees it);
   with a pod UID they are the pod's own, beside the old pod's (``server``).
3. Long-lived tasks in one TaskGroup: slice publisher (from the moment the kubelet accepts
   the registration, so no pod is ever scheduled onto devices nobody can prepare), device
   health (faults -> taints, Events, the kubelet's health stream), status writer, health and
   metrics listeners, the claim cache (a watch of this node's pods, whose claims it reads as
   they are bound here; none with ``--claim-reads get``), a watch on the registration status,
   a keeper of the socket files (another agent of the same driver may replace them, see
   ``server``) and a watch on the other agents' registrations (the publisher takes the pool
   back at once when the agent it handed the pool over to is gone). A crash in one stops the
   agent instead of leaving it half alive; Kubernetes restarts it and the checkpoint carries
   the state.

SIGTERM, SIGINT and SIGHUP all stop it the same way: the calls being answered finish, the
registration socket goes, then the DRA socket; the journal is folded into the snapshot (under
the serialize lock); the slices stay published.

The configuration is the one the agent started with: the simulated backend's profile is read
once, here, so a changed profile (a ``helm upgrade``) reaches a node when the DaemonSet
replaces its pod, one node at a time, and a bad one stops only that new pod. (The chart rolls
the pods when the profile changes: its checksum is a pod annotation.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

# isort: split

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint, claims, memory, mps, server, toolkit
from dra_gpu.agent.claimcache import ClaimCache
from dra_gpu.agent.health_monitor import ClaimOnDevice, HealthMonitor
from dra_gpu.agent.publisher import SlicePublisher, new_instance
from dra_gpu.agent.state import DeviceState
from dra_gpu.agent.status import StatusWriter
from dra_gpu.config import AgentSettings
from dra_gpu.devices import model
from dra_gpu.kube import events
from dra_gpu.resource import bodies
from dra_gpu.serving import httpserver, metrics

log = logging.getLogger(__name__)
COMPONENT = "dra-gpu-agent"
LEGACY_GRACE_SECONDS = 45.0
"""After an earlier release's agent's sockets are gone: how long its writes are still merged
(its pod's grace period, 30 s, and a margin: it folds its journal as it stops)."""


class _Stop(Exception):
    """Raised inside the task group to end it on request."""


SIMULATED_HARDWARE_DIR = ".dra-gpu-simulated"
"""Under the CDI directory (a tmpfs: emptied by a reboot, as MIG instances are by a GPU reset):
the simulated GPUs' MIG instances. A directory, which CDI runtimes do not read."""


def make_backend(settings: AgentSettings) -> model.Backend:
    if settings.backend == "nvml":
        from dra_gpu.devices.nvml import NvmlBackend

        return NvmlBackend(
            settings.node_name,
            xids=settings.xid_policy,
            shared_gpus=settings.shared_gpu_policy,
            driver_root=settings.driver_root,
            nvidia_smi=settings.nvidia_smi,
        )
    from dra_gpu.devices.simulated import SimulatedBackend, load_profile

    assert settings.profile is not None  # checked by AgentSettings
    backend = SimulatedBackend(
        load_profile(settings.profile),  # once: the agent keeps the profile it started with
        settings.node_name,
        faults_file=settings.faults_file,
        xids=settings.xid_policy,
        hardware_dir=settings.cdi_dir / SIMULATED_HARDWARE_DIR,
    )
    if not backend.node_in_profile:
        log.warning(
            "node %s is not in profile %s: publishing no devices",
            settings.node_name,
            settings.profile,
        )
    return backend


STALE_CHECK_RESYNCS = 10
"""Recorded claims are checked against the API server at start and every 10 resyncs (a GET
per prepared claim, so not every resync)."""


async def run_agent(settings: AgentSettings, stopping: asyncio.Event) -> None:
    # Whatever umask the container runtime hands us: the directories we create on the host
    # (CDI, checkpoint, plugin socket dirs) must never be writable by others.
    os.umask(os.umask(0o022) | 0o022)
    # A closed terminal or a supervisor's reload signal: stop cleanly instead of dying with
    # our sockets left behind, which would keep a dead plugin registered with the kubelet.
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, stopping.set)
    backend = make_backend(settings)
    try:
        async with await kube.Kube.connect(
            settings.kubeconfig,
            observer=metrics.AGENT_API,
            qps=settings.api_qps,
            burst=settings.api_burst,
        ) as api:
            await _run(settings, api, backend, stopping)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        await backend.aclose()


async def _run(
    settings: AgentSettings, api: kube.Kube, backend: model.Backend, stopping: asyncio.Event
) -> None:
    registration = server.RegistrationStatus()
    instance = new_instance(socket.gethostname())
    monitor = HealthMonitor(
        api,
        backend,
        driver=settings.driver_name,
        node=settings.node_name,
        quiet_seconds=settings.health_quiet_seconds,
        poll_seconds=settings.health_poll_seconds,
    )
    publisher = SlicePublisher(
        api,
        backend,
        driver=settings.driver_name,
        node=settings.node_name,
        resync_seconds=settings.resync_seconds,
        instance=instance,
        registered_at=lambda: registration.accepted_at,
        taints=monitor.taints,
    )
    monitor.on_change = publisher.trigger
    monitor.inventory = publisher.inventory
    status_writer = StatusWriter(api, settings.node_name)
    cache = (
        ClaimCache(settings.driver_name, settings.node_name)
        if settings.claim_reads == "watch"
        else None
    )
    state = DeviceState(
        api=api,
        driver=settings.driver_name,
        node=settings.node_name,
        container_edits=backend.container_edits,
        cdi_dir=settings.cdi_dir,
        checkpoint_file=settings.checkpoint_file,
        inventory=publisher.inventory,
        status=status_writer,
        mig=backend if isinstance(backend, model.MigInstances) else None,
        mig_own_layout=settings.mig_own_layout,
        cache=cache,
        sharing=mps.Sharing(
            settings.sharing_dir,
            settings.mps_control_argv,
            backend if isinstance(backend, mps.GpuControls) else None,
            shm_dir=settings.mps_shm_dir,
        ),
        toolkit_cdi_kind=settings.toolkit_cdi_kind,
        serialize_lock=settings.serialize_lock,
    )
    monitor.claims = lambda: [
        ClaimOnDevice(
            c.namespace,
            c.name,
            c.uid,
            tuple(d.device for d in c.devices if d.pool == settings.node_name),
        )
        for c in state.prepared.claims.values()
    ]
    monitor.on_device_health = state.device_health
    legacy = await _legacy_agent_answers(settings)
    async with state.serialized():  # the old pod of a rolling update may be preparing
        state.load(await load_checkpoint(settings, api))
        state.beside_legacy(legacy)
        for line in await state.recover():
            log.info("recovery: %s", line)
    if settings.toolkit_cdi_kind:
        await check_toolkit_spec(settings, api, publisher.inventory)
    try:
        await _serve(
            settings,
            api,
            state,
            cache,
            publisher,
            monitor,
            status_writer,
            registration,
            instance,
            stopping,
            legacy,
        )
    finally:
        # After the servers stopped: nothing prepares any more. The journal becomes a
        # snapshot (with what another agent journaled, read again under the serialize lock),
        # which is all that an older agent (a rollback) would read; if that fails, snapshot
        # and journal still hold everything.
        try:
            await state.aclose()
        except (OSError, checkpoint.CorruptCheckpoint) as exc:
            log.error("could not fold the checkpoint's journal into its snapshot: %s", exc)


async def _serve(
    settings: AgentSettings,
    api: kube.Kube,
    state: DeviceState,
    cache: ClaimCache | None,
    publisher: SlicePublisher,
    monitor: HealthMonitor,
    status_writer: StatusWriter,
    registration: server.RegistrationStatus,
    instance: str,
    stopping: asyncio.Event,
    legacy: bool,
) -> None:
    async def healthz() -> tuple[bool, str]:
        if registration.registered is False:
            return False, f"the kubelet refused the registration: {registration.error}"
        if not await server.answers(settings.registration_socket, settings.dra_socket):
            return False, "the gRPC servers do not answer"
        return True, "ok"

    async def readyz() -> tuple[bool, str]:
        if publisher.published_generation is None:
            return False, "slices not published yet"
        return await healthz()

    def taken(found: str) -> None:
        # The checkpoint and CDI directory are the other agent's now (same host paths).
        state.retire(found)
        log.warning("no longer writing %s or %s", settings.checkpoint_file, settings.cdi_dir)

    async def back() -> None:
        # What the other agent prepared and unprepared meanwhile is on disk, not in memory.
        async with state.serialized():
            for line in await state.resume(await load_checkpoint(settings, api)):
                log.info("recovery: %s", line)

    sockets = server.serve(
        state,
        driver=settings.driver_name,
        dra_socket=settings.dra_socket,
        registration_socket=settings.registration_socket,
        status=registration,
        on_taken=taken,
        on_back=back,
        health=monitor,
        pool=settings.node_name,
    )

    async def others_registered() -> bool:
        return bool(await sockets.other_registrations())

    publisher.others_registered = others_registered
    try:
        async with (
            sockets,
            httpserver.serving(settings, registry=metrics.AGENT, healthz=healthz, readyz=readyz),
        ):
            log.info(
                "serving %s on node %s as %s: %s",
                settings.driver_name,
                settings.node_name,
                instance,
                settings.dra_socket,
            )
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(
                        publisher.run_forever(registration.accepted), name="slice-publisher"
                    )
                    tasks.create_task(status_writer.run_forever(), name="status-writer")
                    tasks.create_task(monitor.run_forever(), name="device-health")
                    tasks.create_task(
                        _release_stale_forever(
                            state, STALE_CHECK_RESYNCS * settings.resync_seconds
                        ),
                        name="stale-claims",
                    )
                    tasks.create_task(
                        _watch_registration(registration, publisher), name="registration"
                    )
                    tasks.create_task(sockets.keep_forever(), name="plugin-sockets")
                    tasks.create_task(
                        _watch_other_registrations(sockets, publisher), name="other-agents"
                    )
                    tasks.create_task(memory.trim_after_bursts(), name="memory")
                    if cache is not None:
                        tasks.create_task(cache.run_forever(api), name="claim-cache")
                    if legacy:
                        tasks.create_task(_follow_legacy(settings, state), name="legacy-agent")
                    tasks.create_task(_stop_on(stopping), name="stop")
            except* _Stop:
                log.info("stopping; slices stay published")
    finally:
        if sockets.taken and state.retired is None:  # found only as we stopped
            taken("another agent's sockets are where ours were")


async def _legacy_agent_answers(settings: AgentSettings) -> bool:
    """Whether an agent with fixed socket names (a release before per-pod sockets) serves on
    this node: the old pod of the first rolling update from such a release."""
    if not settings.pod_uid:  # we have those names ourselves
        return False
    registry = settings.kubelet_dir / "plugins_registry"
    return await server.answers(
        registry / f"{settings.driver_name}-reg.sock", settings.plugin_dir / "dra.sock"
    )


async def _follow_legacy(settings: AgentSettings, state: DeviceState) -> None:
    """Beside an agent of a release before the serialize lock: take the lock every few
    seconds, which reads and merges whatever it wrote (its last write is the fold of its
    journal as it stops, after its sockets are gone), until its sockets have been gone for
    longer than its pod's grace period."""
    gone_since: float | None = None
    loop = asyncio.get_running_loop()
    while gone_since is None or loop.time() - gone_since < LEGACY_GRACE_SECONDS:
        await asyncio.sleep(server.SOCKET_CHECK_SECONDS)
        async with state.serialized():
            pass
        if gone_since is None and not await _legacy_agent_answers(settings):
            log.info("the agent with fixed socket names is gone from this node")
            gone_since = loop.time()
    async with state.serialized():
        state.beside_legacy(False)
    log.info("no agent of an earlier release beside us any more: the checkpoint is ours")


async def _release_stale_forever(state: DeviceState, period: float) -> NoReturn:
    # In the background from the start: an unreachable API server must not delay serving.
    while True:
        for line in await state.release_stale():
            log.warning("%s", line)
        await asyncio.sleep(period)


async def _watch_other_registrations(
    sockets: server.PluginServers, publisher: SlicePublisher
) -> NoReturn:
    """Checks the pool again whenever the set of other agents registered for the driver on
    this node changes (a newer pod registered beside us, or the one we handed the pool over to
    is gone). Local: a directory listing and a connect per other socket."""
    seen: list[Path] = []
    while True:
        await asyncio.sleep(server.SOCKET_CHECK_SECONDS)
        others = await sockets.other_registrations()
        if others != seen:
            log.info(
                "other agents of %s registered on this node: %s",
                sockets.driver,
                ", ".join(p.name for p in others) or "none",
            )
            seen = others
            publisher.trigger()


async def _stop_on(stopping: asyncio.Event) -> NoReturn:
    await stopping.wait()
    raise _Stop


async def _watch_registration(
    status: server.RegistrationStatus, publisher: SlicePublisher
) -> NoReturn:
    while True:
        await status.changed.wait()
        status.changed.clear()
        if status.registered is False:
            # As the Go helper does: a refused plugin cannot serve; let Kubernetes restart it.
            raise RuntimeError(f"the kubelet refused the registration: {status.error}")
        # A (re)registration follows a kubelet start, which wipes the node's slices.
        publisher.trigger()


async def check_toolkit_spec(
    settings: AgentSettings,
    api: kube.Kube,
    inventory: Callable[[bool], Awaitable[model.Inventory]],
) -> str | None:
    """With ``--toolkit-cdi-kind``: warn (log, Event ToolkitCdiSpecMissing on the Node) when no
    spec in the CDI directory declares the toolkit's device of one of the node's GPUs, naming
    the command that makes it; the warning, or None. Never fails the agent or a prepare: the
    runtime may read the spec from another directory (``/etc/cdi``) that the agent does not see.
    """
    kind, cdi_dir = settings.toolkit_cdi_kind, settings.cdi_dir
    try:
        devices = (await inventory(False)).devices
    except Exception as exc:  # the publisher reports it; nothing to check against
        log.warning("toolkit CDI spec not checked: the inventory cannot be read: %s", exc)
        return None
    declared = await asyncio.to_thread(toolkit.declared, cdi_dir, kind)
    absent = toolkit.missing(declared, devices)
    if not absent:
        log.info("toolkit CDI spec: %s declares the devices of every GPU of %s", kind, cdi_dir)
        return None
    mig = any(d.partition_of is not None and toolkit.toolkit_name(d) in absent for d in devices)
    message = toolkit.advice(kind, cdi_dir, absent, any_spec=declared is not None, mig=mig)
    log.warning("%s", message)
    await events.post_on_node(
        api,
        COMPONENT,
        settings.node_name,
        type_="Warning",
        reason="ToolkitCdiSpecMissing",
        message=message,
    )
    return message


async def load_checkpoint(settings: AgentSettings, api: kube.Kube) -> checkpoint.Checkpoint:
    path = settings.checkpoint_file
    try:
        return await asyncio.to_thread(checkpoint.read_checkpoint, path)
    except checkpoint.CorruptCheckpoint as exc:
        moved = await asyncio.to_thread(checkpoint.quarantine, path)
        metrics.CHECKPOINT_CORRUPTIONS.inc()
        rebuilt = await rebuild_checkpoint(settings, api)
        await asyncio.to_thread(checkpoint.write_checkpoint, path, rebuilt)
        message = (
            f"{exc}; moved it to {moved.name} and rebuilt {len(rebuilt.claims)} prepared "
            f"claim(s) from the API server and {settings.cdi_dir}"
        )
        log.error("%s", message)
        await events.post_on_node(
            api,
            COMPONENT,
            settings.node_name,
            type_="Warning",
            reason="CheckpointCorrupt",
            message=message,
        )
        return rebuilt


CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


async def claims_of_uids(api: kube.Kube, uids: set[str]) -> dict[str, kube.Body]:
    """The claims of the cluster whose UID is one of ``uids``, by UID: every claim is listed,
    a page at a time (each page its own request, with its own timeout), and only these kept."""
    found: dict[str, kube.Body] = {}
    async for page in api.pages(CLAIMS):
        for claim in page.get("items") or []:
            uid = claim.get("metadata", {}).get("uid")
            if uid in uids:
                found[uid] = claim
    return found


async def rebuild_checkpoint(settings: AgentSettings, api: kube.Kube) -> checkpoint.Checkpoint:
    """Prepared claims as far as the CDI directory and the API server can tell: a spec of ours
    whose claim still exists, allocated from this node's pool, was prepared by us."""
    driver, node = settings.driver_name, settings.node_name
    specs = await asyncio.to_thread(cdi.list_claim_specs, settings.cdi_dir, driver)
    if not specs:
        return checkpoint.Checkpoint()
    by_uid = await claims_of_uids(api, set(specs))
    rebuilt = checkpoint.Checkpoint()
    for uid in specs:
        claim = by_uid.get(uid)
        spec = await asyncio.to_thread(cdi.read_claim_spec, settings.cdi_dir, driver, uid)
        if claim is None or spec is None:
            continue
        meta = claim["metadata"]
        ref = claims.ClaimRef(meta["namespace"], meta["name"], bodies.ClaimUID(uid))
        try:
            allocated = claims.allocated_devices(claim, ref, driver, node)
        except claims.ClaimError:
            continue
        record = checkpoint.record_claim(driver, uid, ref.namespace, ref.name, allocated, spec)
        if record.devices:
            rebuilt = rebuilt.with_claim(record)
    return rebuilt

"""The kubelet's view of the agent: two gRPC servers on unix sockets.

- The DRA service (``<kubelet>/plugins/<driver>/dra.sock``) serves DRAPlugin ``v1`` and
  ``v1beta1`` from one socket. The servicers are thin adapters: they translate messages and
  call ``DeviceState``, so the two versions never fork the logic.
- The DRA socket also serves the kubelet's device health stream, DRAResourceHealth ``v1``
  and ``v1alpha1`` (``HealthServicer``): the complete list of this node's devices, healthy or
  not, sent at once, on every change and every ``HEALTH_RESEND_SECONDS``; the kubelet shows it
  in pod status (``allocatedResourcesStatus``).
- The Registration service (``<kubelet>/plugins_registry/<driver>-reg.sock``) answers the
  kubelet's plugin watcher: ``GetInfo`` from memory (the kubelet allows 1 s) and
  ``NotifyRegistrationStatus``.

The kubelet dials as soon as it sees the registration socket, so ``serve`` brings the DRA socket
up first and, on the way out, removes the registration socket first. Sockets are created with
mode 0660 (owner and group only): whoever can talk to them can make the agent write files.

The socket paths are fixed, so a second agent of the same driver on the node (an old pod still
running during an upgrade, two releases with one driver name) replaces our socket files with
its own, and the kubelet registers that one instead. ``PluginServers.keep_forever`` notices:
while the other agent's sockets answer, we leave them alone (and our slices to it, see
``contention``; and the checkpoint and CDI directory, see ``on_taken``); once they are gone,
or nobody listens on them any more, ours come back (after ``on_back``) and the kubelet
registers us again. We only ever remove socket files that are ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc

from dra_gpu.agent.claims import ClaimRef, ClaimUID
from dra_gpu.agent.health import DeviceReport, HealthSource
from dra_gpu.agent.state import DeviceState, PrepareFailed
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.proto.dra.v1beta1 import api_pb2 as v1beta1
from dra_gpu.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_gpu.proto.drahealth.v1 import api_pb2 as health_v1
from dra_gpu.proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""In order of preference: a 1.34+ kubelet takes the first entry it knows."""
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
"""Advertised after the DRAPlugin versions when a health source is given: a 1.37 kubelet opens
the health stream only for a plugin that lists one (older kubelets ignore unknown entries;
1.36 calls v1alpha1 unasked)."""
HEALTH_RESEND_SECONDS = 10.0
"""The kubelet marks a device Unknown if not told about it for 30 s (its default timeout)."""
SOCKET_MODE = 0o660
MAX_SOCKET_PATH = 107
"""Bytes in a unix socket's path (``sun_path`` is 108, with the terminating NUL)."""
SOCKET_CHECK_SECONDS = 2.0
"""How often ``keep_forever`` checks that our socket files are still ours (two ``stat`` calls)."""


Context = grpc.aio.ServicerContext[Any, Any]

_PrepareResponse = TypeVar(
    "_PrepareResponse", v1.NodePrepareResourcesResponse, v1beta1.NodePrepareResourcesResponse
)
_UnprepareResponse = TypeVar(
    "_UnprepareResponse", v1.NodeUnprepareResourcesResponse, v1beta1.NodeUnprepareResourcesResponse
)


def _refs(claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, ClaimUID(c.uid)) for c in claims]


async def _prepare(
    state: DeviceState,
    claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim],
    response: _PrepareResponse,
) -> _PrepareResponse:
    """Both versions' NodePrepareResources: the messages differ only in their package."""
    for uid, result in (await state.prepare_all(_refs(claims))).items():
        entry = response.claims[uid]
        if isinstance(result, PrepareFailed):
            entry.error = result.message
            continue
        for d in result.devices:
            device = entry.devices.add(
                request_names=list(d.request_names),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            if d.share_id is not None and isinstance(device, v1.Device):
                device.share_id = d.share_id  # v1beta1 has no share_id (no shares before v1)
    return response


async def _unprepare(
    state: DeviceState,
    claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim],
    response: _UnprepareResponse,
) -> _UnprepareResponse:
    for uid, error in (await state.unprepare_all(_refs(claims))).items():
        response.claims[uid].error = error.message if error is not None else ""
    return response


class _Adapter:
    def __init__(self, state: DeviceState) -> None:
        self.state = state


class DraServicerV1(_Adapter, v1_grpc.DRAPluginServicer):
    """DRAPlugin v1: messages in and out; the logic is ``DeviceState``'s, shared by both."""

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: Context
    ) -> v1.NodePrepareResourcesResponse:
        return await _prepare(self.state, request.claims, v1.NodePrepareResourcesResponse())

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1.NodeUnprepareResourcesResponse:
        return await _unprepare(self.state, request.claims, v1.NodeUnprepareResourcesResponse())


class DraServicerV1Beta1(_Adapter, v1beta1_grpc.DRAPluginServicer):
    """DRAPlugin v1beta1: ``DraServicerV1`` with the older version's messages."""

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: Context
    ) -> v1beta1.NodePrepareResourcesResponse:
        response = v1beta1.NodePrepareResourcesResponse()
        return await _prepare(self.state, request.claims, response)

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response = v1beta1.NodeUnprepareResourcesResponse()
        return await _unprepare(self.state, request.claims, response)


_HealthResponse = TypeVar(
    "_HealthResponse",
    health_v1.NodeWatchResourcesResponse,
    health_v1alpha1.NodeWatchResourcesResponse,
)


async def _watch_health(
    source: HealthSource,
    pool: str,
    response: Callable[[], _HealthResponse],
    resend_seconds: float,
) -> AsyncIterator[_HealthResponse]:
    """Both versions' NodeWatchResources: every device, now, on each change, and periodically."""
    loop = asyncio.get_running_loop()
    log.info("the kubelet watches device health (%s)", type(response()).DESCRIPTOR.full_name)
    while True:
        seen = source.version
        reports = await source.device_reports()
        message = response()
        now = int(time.time())
        for report in reports:
            _add_report(message, pool, report, now)
        yield message
        deadline = loop.time() + resend_seconds
        async with source.changed:
            while source.version == seen and (left := deadline - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(source.changed.wait(), left)


def _add_report(
    message: health_v1.NodeWatchResourcesResponse | health_v1alpha1.NodeWatchResourcesResponse,
    pool: str,
    report: DeviceReport,
    now: int,
) -> None:
    entry = message.devices.add()
    entry.device.pool_name = pool
    entry.device.device_name = report.device
    # The enum values are the same in both versions (UNKNOWN 0, HEALTHY 1, UNHEALTHY 2).
    entry.health = health_v1.HEALTHY if report.healthy else health_v1.UNHEALTHY
    # When we last looked, not when the state began: the kubelet reads it as freshness and
    # turns a device older than its timeout (30 s) into Unknown.
    entry.last_updated_time = now
    entry.message = report.message


class HealthServicerV1(health_v1_grpc.DRAResourceHealthServicer):
    def __init__(self, source: HealthSource, pool: str, resend: float) -> None:
        self.source, self.pool, self.resend = source, pool, resend

    async def NodeWatchResources(
        self, request: health_v1.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        response = health_v1.NodeWatchResourcesResponse
        async for message in _watch_health(self.source, self.pool, response, self.resend):
            yield message


class HealthServicerV1Alpha1(health_v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, source: HealthSource, pool: str, resend: float) -> None:
        self.source, self.pool, self.resend = source, pool, resend

    async def NodeWatchResources(
        self, request: health_v1alpha1.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[health_v1alpha1.NodeWatchResourcesResponse]:
        response = health_v1alpha1.NodeWatchResourcesResponse
        async for message in _watch_health(self.source, self.pool, response, self.resend):
            yield message


@dataclasses.dataclass
class RegistrationStatus:
    """What the kubelet last told us about our registration."""

    registered: bool | None = None
    """None until the kubelet called NotifyRegistrationStatus."""
    error: str = ""
    accepted_at: datetime.datetime | None = None
    """When the kubelet last accepted us (it does again after its restart, or after our
    sockets were re-created)."""
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    accepted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set once the kubelet accepted us: devices are usable from then on."""


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self, driver: str, endpoint: Path, status: RegistrationStatus, health: bool = False
    ) -> None:
        self.info = reg.PluginInfo(
            type="DRAPlugin",
            name=driver,
            endpoint=str(endpoint),
            supported_versions=[*SUPPORTED_VERSIONS, *(HEALTH_SERVICES if health else ())],
        )
        self.status = status

    async def GetInfo(self, request: reg.InfoRequest, context: Context) -> reg.PluginInfo:
        return self.info

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Context
    ) -> reg.RegistrationStatusResponse:
        self.status.registered = request.plugin_registered
        self.status.error = request.error
        self.status.changed.set()
        if request.plugin_registered:
            self.status.accepted_at = datetime.datetime.now(datetime.UTC)
            self.status.accepted.set()
            log.info("registered with the kubelet as %s", self.info.name)
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        return reg.RegistrationStatusResponse()


SocketId = tuple[int, int]
"""(device, inode) of a socket file: a socket created again at the same path is another one."""


@dataclasses.dataclass
class _Bound:
    path: Path
    server: grpc.aio.Server
    socket_id: SocketId


async def _bind(path: Path, servicers: Sequence[tuple[object, object]]) -> _Bound:
    """A started gRPC server on a unix socket at ``path``; a stale socket file is replaced.

    The socket is bound under a hidden temporary name and renamed into place: the path never
    goes missing while it is replaced, and gRPC, which unlinks the address it bound when the
    server stops, unlinks a name that is long gone instead of whatever is at ``path`` then
    (another agent's socket, by that time)."""
    if await _answers_at(path):
        log.warning(
            "replacing %s, which a running process serves (another agent of this driver on "
            "this node?): the kubelet will call this agent instead",
            path,
        )
    # Short (socket paths are limited), hidden (the kubelet's plugin watcher skips dot files).
    bind_at = path.with_name(f".{secrets.token_hex(2)}")
    if len(os.fsencode(bind_at)) > MAX_SOCKET_PATH:
        bind_at = path  # no room for a temporary name: bind in place, as gRPC would
    _clear(bind_at)
    server = grpc.aio.server()
    for add, servicer in servicers:
        add(servicer, server)  # type: ignore[operator]
    # Bind under a restrictive umask so the socket is never world-writable, not even briefly.
    old = os.umask(0o117)
    try:
        server.add_insecure_port(f"unix://{bind_at}")
        await server.start()
    finally:
        os.umask(old)
    if bind_at != path:
        os.replace(bind_at, path)
    socket_id = _socket_id(path)
    assert socket_id is not None, f"gRPC did not create {path}"
    return _Bound(path, server, socket_id)


def _clear(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _remove_if_ours(bound: _Bound) -> None:
    if _socket_id(bound.path) == bound.socket_id:
        with contextlib.suppress(FileNotFoundError):
            bound.path.unlink()


def _socket_id(path: Path) -> SocketId | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


async def _answers_at(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket at ``path``."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 1.0)
    except (OSError, TimeoutError):
        return False  # no file, not a socket, or nobody listening: a stale file
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class PluginServers:
    """The DRA and registration servers of one agent (an async context manager), and the
    socket files that lead to them."""

    def __init__(
        self,
        state: DeviceState,
        *,
        driver: str,
        dra_socket: Path,
        registration_socket: Path,
        status: RegistrationStatus,
        on_taken: Callable[[str], None] = lambda found: None,
        on_back: Callable[[], Awaitable[None]] | None = None,
        health: HealthSource | None = None,
        pool: str = "",
        health_resend_seconds: float = HEALTH_RESEND_SECONDS,
    ) -> None:
        self.driver = driver
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self.on_taken = on_taken
        """Called (with what was found) once a live process replaced our sockets."""
        self.on_back = on_back
        """Awaited before our sockets are created again (the kubelet calls us right after)."""
        self.taken = False
        """Another process's socket is, or was since our sockets were last created, where
        ours were; also when found only as we stop."""
        dra_servicers: list[tuple[object, object]] = [
            (v1_grpc.add_DRAPluginServicer_to_server, DraServicerV1(state)),
            (v1beta1_grpc.add_DRAPluginServicer_to_server, DraServicerV1Beta1(state)),
        ]
        if health is not None:
            resend = health_resend_seconds
            dra_servicers += [
                (
                    health_v1_grpc.add_DRAResourceHealthServicer_to_server,
                    HealthServicerV1(health, pool, resend),
                ),
                (
                    health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server,
                    HealthServicerV1Alpha1(health, pool, resend),
                ),
            ]
        self._dra_servicers = tuple(dra_servicers)
        self._registration_servicers = (
            (
                reg_grpc.add_RegistrationServicer_to_server,
                RegistrationServicer(driver, dra_socket, status, health=health is not None),
            ),
        )
        self._bound: list[_Bound] = []
        self._taken_by: SocketId | None = None

    async def __aenter__(self) -> PluginServers:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """DRA socket first: the kubelet dials as soon as it sees the registration socket."""
        try:
            self._bound.append(await _bind(self.dra_socket, self._dra_servicers))
            self._bound.append(await _bind(self.registration_socket, self._registration_servicers))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Registration socket first; a socket file that is no longer ours stays."""
        while self._bound:
            bound = self._bound.pop()
            if _socket_id(bound.path) not in (None, bound.socket_id):
                self.taken = True
            _remove_if_ours(bound)
            await bound.server.stop(grace=2)

    async def check(self) -> str | None:
        """Re-create our sockets if their files are gone or lead nowhere; leave them to a live
        process that replaced them. Returns what it did or found, if anything."""
        if len(self._bound) != 2:
            return None
        dra, registration = self._bound
        if _socket_id(registration.path) == registration.socket_id:
            # Ours; a DRA socket of someone else's is another agent half way through its
            # start, whose registration socket is about to replace ours: leave it be.
            if _socket_id(dra.path) is not None:
                self._taken_by = None
                return None
        else:
            taken = _socket_id(registration.path)
            if taken is not None and await _answers_at(registration.path):
                if taken == self._taken_by:
                    return None
                self._taken_by = taken
                self.taken = True
                found = (
                    f"{registration.path} was replaced by another process's socket (another "
                    f"agent of driver {self.driver} on this node?): the kubelet calls that one "
                    "now; this agent's sockets come back when it is gone"
                )
                self.on_taken(found)
                return found
        await self.stop()
        if self.on_back is not None:
            await self.on_back()
        await self.start()
        self._taken_by = None
        self.taken = False
        return (
            f"re-created {self.dra_socket} and {self.registration_socket} (removed, or left "
            "by a process that is gone); the kubelet will register this agent again"
        )

    async def keep_forever(self, period: float = SOCKET_CHECK_SECONDS) -> NoReturn:
        while True:
            await asyncio.sleep(period)
            if (found := await self.check()) is not None:
                log.warning("%s", found)


serve = PluginServers
"""``async with serve(state, driver=..., ...)``: DRA socket first, then registration; on exit
the registration goes first."""


async def answers(registration_socket: Path, dra_socket: Path, deadline: float = 1.0) -> bool:
    """Whether both servers answer as the kubelet calls them (an empty prepare is a no-op)."""
    try:
        async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
            await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=deadline)
        async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
            await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(), timeout=deadline
            )
    except grpc.aio.AioRpcError:
        return False
    return True

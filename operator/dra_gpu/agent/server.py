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
up first. Sockets are created with mode 0660 (owner and group only): whoever can talk to them
can make the agent write files.

Rolling updates: with a pod UID (``AgentSettings.pod_uid``, the chart's), the sockets are the
pod's own, ``<driver>-<uid>-reg.sock`` and ``dra-<uid>.sock``, as upstream's helper names them.
A new pod then registers beside the old one (a kubelet of 1.33 or later keeps several
registrations of one driver and calls the newest connected one), and the old one stops
without a gap: on SIGTERM it first lets the calls it is answering finish (the kubelet closes
its connection to a plugin whose registration goes, which would cancel them), then removes
its registration socket (the kubelet drops it and keeps calling the newer one), answers what
arrived meanwhile, and closes (``PluginServers.stop``). ``other_registrations`` lists the live
registrations of the driver that are not ours (the publisher hands the pool over to a newer
one while it is there, see ``contention``).

Without a pod UID the socket paths are fixed, so a second agent of the same driver on the node
(two releases with one driver name, an agent started by hand) replaces our socket files with
its own, and the kubelet registers that one instead. ``PluginServers.keep_forever`` notices:
while the other agent's sockets answer, we leave them alone (and our slices to it, see
``contention``; and the checkpoint and CDI directory, see ``on_taken``); once they are gone,
or nobody listens on them any more, ours come back (after ``on_back``) and the kubelet
registers us again. We only ever remove socket files that are ours.

``dra_gpu_agent_registered`` says where the registration stands: 1 from the kubelet's
``NotifyRegistrationStatus`` accepting us, 0 from our sockets' (re-)creation until then, after a
refusal, and once another agent's sockets replaced ours (the kubelet calls that one).

The servers are grpclib's (gRPC over the pure-Python ``h2``), not grpcio's: grpcio's core
library alone is 10 MiB resident once loaded and keeps ~10 MiB more after a burst of 1,000
concurrent calls, on a process that runs on every GPU node; grpclib is 3 MiB and keeps almost
nothing, at the same latency (docs/results.md, "Prepare latency and memory"). The kubelet sees
the same protocol. The method tables are built from the services' descriptors (``_method``), so
a path cannot be misspelt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpclib.client
import grpclib.server
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from dra_gpu import config
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.health_monitor import DeviceReport, HealthSource
from dra_gpu.agent.state import DeviceState, PrepareFailed
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1beta1 import api_pb2 as v1beta1
from dra_gpu.proto.drahealth.v1 import api_pb2 as health_v1
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.resource.bodies import ClaimUID
from dra_gpu.serving import metrics

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
STOP_GRACE_SECONDS = 10.0
"""How long a stop waits for the calls being answered before it removes the registration (a
prepare may wait for the other agent's serialize lock; the pod's grace period is 30 s)."""
STOP_LINGER_SECONDS = 1.0
"""After the registration is gone: how long calls that arrived meanwhile get to finish."""
SOCKET_CHECK_SECONDS = 2.0
"""How often ``keep_forever`` checks that our socket files are still ours (two ``stat`` calls)."""


Handlers = dict[str, Handler]
"""grpclib's method table: ``/<package>.<Service>/<Method>`` to its handler."""


def _method(module: Any, service: str, method: str) -> str:
    """A method's path, from the service's descriptor in the generated ``api_pb2`` module."""
    descriptor = module.DESCRIPTOR.services_by_name[service]
    return f"/{descriptor.full_name}/{descriptor.methods_by_name[method].name}"


class _InFlight:
    """The unary calls being answered: a stop lets them finish, for a while, and answers
    those still running then with UNAVAILABLE (the kubelet calls again), rather than leaving
    the kubelet to wait for its deadline."""

    def __init__(self) -> None:
        self._streams: set[grpclib.server.Stream[Any, Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def answering(self, stream: grpclib.server.Stream[Any, Any]) -> Iterator[None]:
        self._streams.add(stream)
        self._idle.clear()
        try:
            yield
        finally:
            self._streams.discard(stream)
            if not self._streams:
                self._idle.set()

    @property
    def count(self) -> int:
        return len(self._streams)

    async def idle(self, within: float) -> None:
        """Once no call is being answered, or ``within`` seconds later."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), within)

    async def drained(self, within: float) -> None:
        """Once no call is being answered, or ``within`` seconds later; then the calls still
        running are answered UNAVAILABLE."""
        await self.idle(within)
        for stream in list(self._streams):
            with contextlib.suppress(Exception):  # the call may have ended meanwhile
                await stream.send_trailing_metadata(
                    status=Status.UNAVAILABLE, status_message="the agent is stopping; call again"
                )


async def _request(stream: grpclib.server.Stream[Any, Any]) -> Any:
    request = await stream.recv_message()
    if request is None:
        raise GRPCError(Status.INVALID_ARGUMENT, "the call carries no request message")
    return request


def _unary(
    calls: _InFlight, answer: Callable[[Any], Awaitable[Any]], request: type, reply: type
) -> Handler:
    async def handle(stream: grpclib.server.Stream[Any, Any]) -> None:
        received = await _request(stream)
        with calls.answering(stream):
            answered = await answer(received)
        await stream.send_message(answered)

    return Handler(handle, Cardinality.UNARY_UNARY, request, reply)


def _server_stream(
    answer: Callable[[Any], AsyncIterator[Any]], request: type, reply: type
) -> Handler:
    async def handle(stream: grpclib.server.Stream[Any, Any]) -> None:
        async for message in answer(await _request(stream)):
            await stream.send_message(message)

    return Handler(handle, Cardinality.UNARY_STREAM, request, reply)


class _Servable:
    """A method table as grpclib serves it (its ``IServable``)."""

    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers

    def __mapping__(self) -> Handlers:
        return self.handlers


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


class DraServicerV1:
    """DRAPlugin v1: messages in and out; the logic is ``DeviceState``'s, shared by both."""

    def __init__(self, state: DeviceState) -> None:
        self.state = state

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest
    ) -> v1.NodePrepareResourcesResponse:
        return await _prepare(self.state, request.claims, v1.NodePrepareResourcesResponse())

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest
    ) -> v1.NodeUnprepareResourcesResponse:
        return await _unprepare(self.state, request.claims, v1.NodeUnprepareResourcesResponse())

    def handlers(self, calls: _InFlight) -> Handlers:
        return _dra_handlers(v1, self, calls)


class DraServicerV1Beta1:
    """DRAPlugin v1beta1: ``DraServicerV1`` with the older version's messages."""

    def __init__(self, state: DeviceState) -> None:
        self.state = state

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest
    ) -> v1beta1.NodePrepareResourcesResponse:
        response = v1beta1.NodePrepareResourcesResponse()
        return await _prepare(self.state, request.claims, response)

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response = v1beta1.NodeUnprepareResourcesResponse()
        return await _unprepare(self.state, request.claims, response)

    def handlers(self, calls: _InFlight) -> Handlers:
        return _dra_handlers(v1beta1, self, calls)


def _dra_handlers(
    module: Any, servicer: DraServicerV1 | DraServicerV1Beta1, calls: _InFlight
) -> Handlers:
    return {
        _method(module, "DRAPlugin", "NodePrepareResources"): _unary(
            calls,
            servicer.NodePrepareResources,
            module.NodePrepareResourcesRequest,
            module.NodePrepareResourcesResponse,
        ),
        _method(module, "DRAPlugin", "NodeUnprepareResources"): _unary(
            calls,
            servicer.NodeUnprepareResources,
            module.NodeUnprepareResourcesRequest,
            module.NodeUnprepareResourcesResponse,
        ),
    }


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


class HealthServicer:
    """DRAResourceHealth, either version (``module``: its generated ``api_pb2``)."""

    def __init__(self, module: Any, source: HealthSource, pool: str, resend: float) -> None:
        self.module = module
        self.source, self.pool, self.resend = source, pool, resend

    async def NodeWatchResources(
        self, request: object
    ) -> AsyncIterator[
        health_v1.NodeWatchResourcesResponse | health_v1alpha1.NodeWatchResourcesResponse
    ]:
        response = self.module.NodeWatchResourcesResponse
        async for message in _watch_health(self.source, self.pool, response, self.resend):
            yield message

    def handlers(self) -> Handlers:
        return {
            _method(self.module, "DRAResourceHealth", "NodeWatchResources"): _server_stream(
                self.NodeWatchResources,
                self.module.NodeWatchResourcesRequest,
                self.module.NodeWatchResourcesResponse,
            )
        }


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


class RegistrationServicer:
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

    async def GetInfo(self, request: reg.InfoRequest) -> reg.PluginInfo:
        return self.info

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus
    ) -> reg.RegistrationStatusResponse:
        self.status.registered = request.plugin_registered
        self.status.error = request.error
        self.status.changed.set()
        metrics.REGISTERED.set(1 if request.plugin_registered else 0)
        if request.plugin_registered:
            self.status.accepted_at = datetime.datetime.now(datetime.UTC)
            self.status.accepted.set()
            log.info("registered with the kubelet as %s", self.info.name)
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        return reg.RegistrationStatusResponse()

    def handlers(self, calls: _InFlight) -> Handlers:
        return {
            _method(reg, "Registration", "GetInfo"): _unary(
                calls, self.GetInfo, reg.InfoRequest, reg.PluginInfo
            ),
            _method(reg, "Registration", "NotifyRegistrationStatus"): _unary(
                calls,
                self.NotifyRegistrationStatus,
                reg.RegistrationStatus,
                reg.RegistrationStatusResponse,
            ),
        }


SocketId = tuple[int, int]
"""(device, inode) of a socket file: a socket created again at the same path is another one."""


@dataclasses.dataclass
class _Bound:
    path: Path
    server: grpclib.server.Server
    socket_id: SocketId


async def _bind(path: Path, handlers: Handlers) -> _Bound:
    """A started gRPC server on a unix socket at ``path``; a stale socket file is replaced.

    The socket is bound under a hidden temporary name and renamed into place: the path never
    goes missing while it is replaced, and a server that unlinks the address it bound when it
    stops (asyncio's, from Python 3.13) unlinks a name that is long gone instead of whatever is
    at ``path`` then (another agent's socket, by that time)."""
    if await _answers_at(path):
        log.warning(
            "replacing %s, which a running process serves (another agent of this driver on "
            "this node?): the kubelet will call this agent instead",
            path,
        )
    # Short (socket paths are limited), hidden (the kubelet's plugin watcher skips dot files).
    bind_at = path.with_name(f".{secrets.token_hex(2)}")
    if len(os.fsencode(bind_at)) > config.MAX_SOCKET_PATH:
        bind_at = path  # no room for a temporary name: bind in place
    _clear(bind_at)
    server = grpclib.server.Server([_Servable(handlers)])
    # Bind under a restrictive umask so the socket is never world-writable, not even briefly.
    old = os.umask(0o117)
    try:
        await server.start(path=str(bind_at))
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
        self._calls = _InFlight()
        self._dra_handlers = {
            **DraServicerV1(state).handlers(self._calls),
            **DraServicerV1Beta1(state).handlers(self._calls),
        }
        if health is not None:
            for module in (health_v1, health_v1alpha1):
                servicer = HealthServicer(module, health, pool, health_resend_seconds)
                self._dra_handlers |= servicer.handlers()
        registration = RegistrationServicer(driver, dra_socket, status, health=health is not None)
        self._registration_handlers = registration.handlers(self._calls)
        self._bound: list[_Bound] = []
        self._taken_by: SocketId | None = None

    async def __aenter__(self) -> PluginServers:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """DRA socket first: the kubelet dials as soon as it sees the registration socket.
        Not registered until the kubelet says so (``dra_gpu_agent_registered`` 0)."""
        metrics.REGISTERED.set(0)
        try:
            self._bound.append(await _bind(self.dra_socket, self._dra_handlers))
            self._bound.append(await _bind(self.registration_socket, self._registration_handlers))
        except BaseException:
            await self.stop()
            raise

    async def stop(
        self, grace: float = STOP_GRACE_SECONDS, linger: float = STOP_LINGER_SECONDS
    ) -> None:
        """The calls being answered get ``grace`` seconds to finish while we are still
        registered (the kubelet cancels the calls of a plugin it deregisters); then the
        registration socket goes, and the DRA socket after it; a socket file that is no longer
        ours stays. Calls still running ``linger`` seconds later are answered UNAVAILABLE."""
        if self._calls.count:
            log.info("stopping: waiting for %d call(s) being answered", self._calls.count)
            await self._calls.idle(grace)
        for bound in reversed(self._bound):
            if _socket_id(bound.path) not in (None, bound.socket_id):
                self.taken = True
            _remove_if_ours(bound)
        await self._calls.drained(linger)
        while self._bound:
            bound = self._bound.pop()
            bound.server.close()
            await bound.server.wait_closed()

    async def other_registrations(self) -> list[Path]:
        """The registration sockets of our driver in the kubelet's registry directory, other
        than ours, that a process answers on: other agents of the driver the kubelet may
        have registered (the pod of a rolling update beside us, or, with fixed socket names,
        the agent that took ours over)."""
        found = await asyncio.to_thread(self._registration_files)
        mine = self._bound[1] if len(self._bound) == 2 else None
        others = [
            path
            for path in found
            if mine is None or path != mine.path or _socket_id(path) != mine.socket_id
        ]
        return [path for path in others if await _answers_at(path)]

    def _registration_files(self) -> list[Path]:
        pattern = re.compile(
            rf"{re.escape(self.driver)}(-[0-9a-f]{{8}}(-[0-9a-f]{{4}}){{3}}-[0-9a-f]{{12}})?-reg\.sock"
        )
        try:
            names = os.listdir(self.registration_socket.parent)
        except FileNotFoundError:
            return []
        return sorted(self.registration_socket.parent / n for n in names if pattern.fullmatch(n))

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
                metrics.REGISTERED.set(0)  # the kubelet calls the other agent now
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
        async with grpclib.client.Channel(path=str(registration_socket)) as channel:
            get_info = grpclib.client.UnaryUnaryMethod(
                channel, _method(reg, "Registration", "GetInfo"), reg.InfoRequest, reg.PluginInfo
            )
            await get_info(reg.InfoRequest(), timeout=deadline)
        async with grpclib.client.Channel(path=str(dra_socket)) as channel:
            prepare = grpclib.client.UnaryUnaryMethod(
                channel,
                _method(v1, "DRAPlugin", "NodePrepareResources"),
                v1.NodePrepareResourcesRequest,
                v1.NodePrepareResourcesResponse,
            )
            await prepare(v1.NodePrepareResourcesRequest(), timeout=deadline)
    except (GRPCError, StreamTerminatedError, ProtocolError, OSError, TimeoutError):
        return False
    return True

"""The kubelet's view of the agent: two gRPC servers on unix sockets.

- The DRA service (``<kubelet>/plugins/<driver>/dra.sock``) serves DRAPlugin ``v1`` and
  ``v1beta1`` from one socket. The servicers are thin adapters: they translate messages and
  call ``DeviceState``, so the two versions never fork the logic.
- The Registration service (``<kubelet>/plugins_registry/<driver>-reg.sock``) answers the
  kubelet's plugin watcher: ``GetInfo`` from memory (the kubelet allows 1 s) and
  ``NotifyRegistrationStatus``.

The kubelet dials as soon as it sees the registration socket, so ``serve`` brings the DRA socket
up first and, on the way out, removes the registration socket first. Sockets are created with
mode 0660 (owner and group only): whoever can talk to them can make the agent write files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from dra_gpu import checkpoint
from dra_gpu.agent.claims import ClaimRef, ClaimUID
from dra_gpu.agent.state import DeviceState, PrepareFailed
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.proto.dra.v1beta1 import api_pb2 as v1beta1
from dra_gpu.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""In order of preference: a 1.34+ kubelet takes the first entry it knows."""
SOCKET_MODE = 0o660


def _refs(claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, ClaimUID(c.uid)) for c in claims]


class _DraServicer:
    """Both versions' servicer logic; ``pb`` is the generated module of one version."""

    def __init__(self, state: DeviceState, pb: object) -> None:
        self.state = state
        self.pb = pb

    async def NodePrepareResources(self, request, context):  # type: ignore[no-untyped-def]
        pb = self.pb
        results = await self.state.prepare_all(_refs(request.claims))
        response = pb.NodePrepareResourcesResponse()  # type: ignore[attr-defined]
        for uid, result in results.items():
            entry = response.claims[uid]
            if isinstance(result, PrepareFailed):
                entry.error = result.message
            else:
                entry.devices.extend(_devices(pb, result))
        return response

    async def NodeUnprepareResources(self, request, context):  # type: ignore[no-untyped-def]
        results = await self.state.unprepare_all(_refs(request.claims))
        response = self.pb.NodeUnprepareResourcesResponse()  # type: ignore[attr-defined]
        for uid, error in results.items():
            entry = response.claims[uid]
            if error is not None:
                entry.error = error.message
        return response


def _devices(pb: object, claim: checkpoint.PreparedClaim) -> list[object]:
    return [
        pb.Device(  # type: ignore[attr-defined]
            request_names=list(d.request_names),
            pool_name=d.pool,
            device_name=d.device,
            cdi_device_ids=list(d.cdi_device_ids),
        )
        for d in claim.devices
    ]


class DraServicerV1(_DraServicer, v1_grpc.DRAPluginServicer):
    def __init__(self, state: DeviceState) -> None:
        super().__init__(state, v1)


class DraServicerV1Beta1(_DraServicer, v1beta1_grpc.DRAPluginServicer):
    def __init__(self, state: DeviceState) -> None:
        super().__init__(state, v1beta1)


@dataclasses.dataclass
class RegistrationStatus:
    """What the kubelet last told us about our registration."""

    registered: bool | None = None
    """None until the kubelet called NotifyRegistrationStatus."""
    error: str = ""
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    accepted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set once the kubelet accepted us: devices are usable from then on."""


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path, status: RegistrationStatus) -> None:
        self.info = reg.PluginInfo(
            type="DRAPlugin",
            name=driver,
            endpoint=str(endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )
        self.status = status

    async def GetInfo(self, request, context):  # type: ignore[no-untyped-def]
        return self.info

    async def NotifyRegistrationStatus(self, request, context):  # type: ignore[no-untyped-def]
        self.status.registered = request.plugin_registered
        self.status.error = request.error
        self.status.changed.set()
        if request.plugin_registered:
            self.status.accepted.set()
            log.info("registered with the kubelet as %s", self.info.name)
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        return reg.RegistrationStatusResponse()


@contextlib.asynccontextmanager
async def unix_server(
    path: Path, *servicers: tuple[object, object]
) -> AsyncIterator[grpc.aio.Server]:
    """A gRPC server on a unix socket at ``path``; a stale socket file is replaced."""
    _remove_socket(path, make_parent=True)
    server = grpc.aio.server()
    for add, servicer in servicers:
        add(servicer, server)  # type: ignore[operator]
    # Bind under a restrictive umask so the socket is never world-writable, not even briefly.
    old = os.umask(0o117)
    try:
        server.add_insecure_port(f"unix://{path}")
        await server.start()
    finally:
        os.umask(old)
    try:
        yield server
    finally:
        _remove_socket(path)
        await server.stop(grace=2)


def _remove_socket(path: Path, *, make_parent: bool = False) -> None:
    if make_parent:
        path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@contextlib.asynccontextmanager
async def serve(
    state: DeviceState,
    *,
    driver: str,
    dra_socket: Path,
    registration_socket: Path,
    status: RegistrationStatus,
) -> AsyncIterator[None]:
    """DRA socket first, then registration; on exit the registration goes first."""
    async with (
        unix_server(
            dra_socket,
            (v1_grpc.add_DRAPluginServicer_to_server, DraServicerV1(state)),
            (v1beta1_grpc.add_DRAPluginServicer_to_server, DraServicerV1Beta1(state)),
        ),
        unix_server(
            registration_socket,
            (
                reg_grpc.add_RegistrationServicer_to_server,
                RegistrationServicer(driver, dra_socket, status),
            ),
        ),
    ):
        yield


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

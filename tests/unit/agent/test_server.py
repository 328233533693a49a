"""The agent's gRPC servers on real unix sockets: what the kubelet's plugin watcher sees."""

from __future__ import annotations

import asyncio
import socket
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.agent import server
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_gpu.serving import metrics
from dra_gpu.testing import eventually
from tests.unit.agent.test_state import state


async def test_registration_advertises_v1_first_and_health_follows_the_servers(
    tmp_path: Path,
) -> None:
    dra_socket = tmp_path / "plugins" / "gpu.example.com" / "dra.sock"
    reg_socket = tmp_path / "plugins_registry" / "gpu.example.com-reg.sock"
    status = server.RegistrationStatus()
    async with server.serve(
        state(tmp_path),
        driver="gpu.example.com",
        dra_socket=dra_socket,
        registration_socket=reg_socket,
        status=status,
    ):
        async with grpc.aio.insecure_channel(f"unix://{reg_socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=1)
            await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            "gpu.example.com",
            str(dra_socket),
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert status.accepted.is_set()
        for socket in (dra_socket, reg_socket):
            mode = stat.S_IMODE(socket.stat().st_mode)
            assert mode & 0o007 == 0, f"{socket} is open to others: {oct(mode)}"
        assert await server.answers(reg_socket, dra_socket)
    assert not reg_socket.exists()
    assert not dra_socket.exists()
    assert not await server.answers(reg_socket, dra_socket)


async def test_a_refused_registration_is_recorded_with_the_kubelets_reason(tmp_path: Path) -> None:
    status = server.RegistrationStatus()
    servicer = server.RegistrationServicer("gpu.example.com", tmp_path / "dra.sock", status)
    await servicer.NotifyRegistrationStatus(
        reg.RegistrationStatus(plugin_registered=False, error="version mismatch")
    )
    assert (status.registered, status.error) == (False, "version mismatch")
    assert not status.accepted.is_set()


def registered() -> float | None:
    return metrics.AGENT.get_sample_value("dra_gpu_agent_registered")


async def test_the_registered_gauge_follows_the_kubelet_and_our_sockets(tmp_path: Path) -> None:
    first, second = servers(tmp_path, "a"), servers(tmp_path, "b")
    # The kubelet's calls to the first agent (the gauge is the process's, as in an agent).
    kubelet = server.RegistrationServicer(
        "gpu.example.com", first.dra_socket, server.RegistrationStatus()
    )
    accept = reg.RegistrationStatus(plugin_registered=True)
    async with first:
        assert registered() == 0  # sockets up: not registered until the kubelet says so
        await kubelet.NotifyRegistrationStatus(accept)
        assert registered() == 1
        await kubelet.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="version mismatch")
        )
        assert registered() == 0
        await kubelet.NotifyRegistrationStatus(accept)
        async with second:
            await kubelet.NotifyRegistrationStatus(accept)
            assert await first.check() is not None  # replaced: the kubelet calls the other
            assert registered() == 0
        await kubelet.NotifyRegistrationStatus(accept)
        assert (await first.check() or "").startswith("re-created")
        assert registered() == 0  # ours again: until the kubelet registers them again
        await kubelet.NotifyRegistrationStatus(accept)
        assert registered() == 1


def servers(tmp_path: Path, name: str, events: list[str] | None = None) -> server.PluginServers:
    seen = events if events is not None else []

    async def back() -> None:
        seen.append("back")

    return server.serve(
        state(tmp_path / name),
        driver="gpu.example.com",
        dra_socket=tmp_path / "plugins" / "gpu.example.com" / "dra.sock",
        registration_socket=tmp_path / "plugins_registry" / "gpu.example.com-reg.sock",
        status=server.RegistrationStatus(),
        on_taken=lambda found: seen.append("taken"),
        on_back=back,
    )


async def test_sockets_taken_by_another_agent_are_left_to_it_and_come_back_when_it_goes(
    tmp_path: Path,
) -> None:
    events: list[str] = []
    first, second = servers(tmp_path, "a", events), servers(tmp_path, "b")
    async with first:
        assert await first.check() is None
        async with second:  # another agent of the driver starts: it replaces our sockets
            found = await first.check()
            assert found is not None
            assert "was replaced by another process's socket" in found
            assert await first.check() is None  # said once
            assert await server.answers(second.registration_socket, second.dra_socket)
            assert (events, first.taken) == (["taken"], True)
        # It stopped and removed its sockets (only its own): ours come back.
        assert not first.registration_socket.exists()
        found = await first.check()
        assert found is not None
        assert found.startswith("re-created")
        assert await server.answers(first.registration_socket, first.dra_socket)
        assert (events, first.taken) == (["taken", "back"], False)
    assert not first.registration_socket.exists()


async def test_a_socket_file_nobody_listens_on_is_replaced(tmp_path: Path) -> None:
    first = servers(tmp_path, "a")
    async with first:
        # A crashed agent's leftover: a socket file of its own that nobody listens on.
        first.registration_socket.unlink()
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(str(first.registration_socket))
        found = await first.check()
        assert found is not None
        assert found.startswith("re-created")
        assert await server.answers(first.registration_socket, first.dra_socket)


async def test_stopping_leaves_a_socket_that_another_agent_put_in_our_place(
    tmp_path: Path,
) -> None:
    first, second = servers(tmp_path, "a"), servers(tmp_path, "b")
    await first.start()
    async with second:
        await first.stop()  # the old pod finally goes, after the new one started
        assert await server.answers(second.registration_socket, second.dra_socket)
        assert first.taken, "found as it stopped"


def held(tmp_path: Path) -> tuple[server.PluginServers, asyncio.Event, list[str]]:
    """Servers whose prepares wait for the returned event (each arrival is listed)."""
    release, arrived = asyncio.Event(), []
    held_state = state(tmp_path / "held")

    async def prepare_all(refs: Any) -> Any:
        arrived.append("prepare")
        await release.wait()
        return {}

    held_state.prepare_all = prepare_all  # type: ignore[method-assign]
    servers_ = server.serve(
        held_state,
        driver="gpu.example.com",
        dra_socket=tmp_path / "dra.sock",
        registration_socket=tmp_path / "reg.sock",
        status=server.RegistrationStatus(),
    )
    return servers_, release, arrived


async def prepare_call(socket: Path) -> v1.NodePrepareResourcesResponse:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        request = v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace="ns", name="c", uid="uid-1")]
        )
        return await v1_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=10)


async def test_a_stop_lets_the_call_being_answered_finish_before_the_registration_goes(
    tmp_path: Path,
) -> None:
    # The kubelet closes its connection to a plugin whose registration socket goes, which
    # cancels the calls on it ("grpc: the client connection is closing"): so they finish first.
    servers_, release, arrived = held(tmp_path)
    await servers_.start()
    call = asyncio.create_task(prepare_call(servers_.dra_socket))
    await eventually(lambda: arrived, what="the prepare arrived")
    stopping = asyncio.create_task(servers_.stop(grace=10))
    await asyncio.sleep(0.2)
    assert not stopping.done()  # waiting for the call
    assert servers_.registration_socket.exists()  # still registered meanwhile
    release.set()
    assert (await call).claims == {}
    await stopping
    assert not servers_.registration_socket.exists()
    assert not servers_.dra_socket.exists()


async def test_a_call_that_outlasts_a_stops_grace_is_answered_unavailable_at_once(
    tmp_path: Path,
) -> None:
    servers_, _, arrived = held(tmp_path)
    await servers_.start()
    call = asyncio.create_task(prepare_call(servers_.dra_socket))
    await eventually(lambda: arrived, what="the prepare arrived")
    await asyncio.wait_for(servers_.stop(grace=0.2, linger=0.2), 5)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(call, 2)  # answered now, not at the call's deadline
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "the agent is stopping" in str(refused.value.details())

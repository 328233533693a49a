"""The API server's egress proxy (``dra_gpu.testing._egress``): where each CONNECT goes (a pure
decision on the routing table), and the two roles speaking the protocol for real on unix
sockets: host proxy -> node forwarder -> a TCP server on loopback (standing in for a pod)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dra_gpu.testing import _egress
from dra_gpu.testing._egress import NodeRoute, Refused, ViaNode

NODE_1 = NodeRoute("node-01", "192.0.2.1", "198.19.1.0/24", "/n1/egress.sock")
NODE_2 = NodeRoute("node-02", "192.0.2.2", "198.19.2.0/24", "/n2/egress.sock")
TABLE = [NODE_1, NODE_2]


# ---- routing ---------------------------------------------------------------------------------


def test_a_pod_ip_goes_to_the_node_whose_pod_subnet_has_it() -> None:
    assert _egress.route("198.19.2.7:8080", TABLE) == ViaNode(NODE_2, "198.19.2.7", 8080, "pod")
    assert _egress.route("198.19.1.250:443", TABLE) == ViaNode(NODE_1, "198.19.1.250", 443, "pod")


def test_a_node_name_or_address_goes_to_that_node_at_its_address() -> None:
    """The API server dials a kubelet by the node's Hostname address (its name)."""
    assert _egress.route("node-01:10250", TABLE) == ViaNode(NODE_1, "192.0.2.1", 10250, "node")
    assert _egress.route("192.0.2.2:10250", TABLE) == ViaNode(NODE_2, "192.0.2.2", 10250, "node")


@pytest.mark.parametrize(
    "target",
    [
        "203.0.113.7:80",  # nobody's
        "198.19.3.4:80",  # a pod subnet of no node in the table
        "127.0.0.1:6443",  # this machine's loopback is not the cluster
        "node-03:10250",
        "[2001:db8::1]:443",
        "kubernetes.default.svc:443",
    ],
)
def test_anything_else_is_refused_with_a_reason(target: str) -> None:
    decision = _egress.route(target, TABLE)
    assert isinstance(decision, Refused)
    assert "no route to" in decision.reason


@pytest.mark.parametrize("target", ["node-01", "node-01:", ":80", "node-01:http", "node-01:70000"])
def test_a_target_that_is_not_host_and_port_is_refused(target: str) -> None:
    decision = _egress.route(target, TABLE)
    assert decision == Refused(f"not a host:port: {target!r}")


def test_nothing_routes_before_a_node_started() -> None:
    assert isinstance(_egress.route("198.19.1.2:80", []), Refused)


def test_the_table_round_trips_and_a_restarted_node_replaces_its_entry(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    assert _egress.read_routes(path) == []
    _egress.write_routes(path, _egress.with_node([], NODE_1))
    moved = NodeRoute("node-01", "192.0.2.1", "198.19.1.0/24", "/elsewhere/egress.sock")
    table = _egress.with_node(_egress.with_node(_egress.read_routes(path), NODE_2), moved)
    _egress.write_routes(path, table)
    assert _egress.read_routes(path) == [NODE_2, moved]
    assert [p.name for p in tmp_path.iterdir()] == ["routes.json"], "no temp file left"


# ---- the protocol, for real ------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Sockets must fit 107 bytes; pytest's tmp_path may not."""
    with tempfile.TemporaryDirectory(prefix="egress-") as directory:
        yield Path(directory)


@contextlib.asynccontextmanager
async def serving(
    path: Path, handler: _egress.HostProxy | _egress.NodeForwarder
) -> AsyncIterator[None]:
    server = await asyncio.start_unix_server(handler.handle, path=str(path))
    async with server:
        yield


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """A TCP server on loopback that answers each line in capitals: the "pod"."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def connect(
    socket: Path, target: str
) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
    """A CONNECT as the API server sends it; returns the status line and the streams."""
    reader, writer = await asyncio.open_unix_connection(str(socket))
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    return head.split(b"\r\n", 1)[0].decode(), reader, writer


@contextlib.asynccontextmanager
async def proxies(short_dir: Path) -> AsyncIterator[Path]:
    """A host proxy whose one node (pods on loopback) has its forwarder at a path too long
    for a socket (reached by its directory's descriptor); yields the host proxy's socket."""
    node_dir = short_dir / ("n" * 60) / ("d" * 60)
    node_dir.mkdir(parents=True)
    node_socket = node_dir / "egress.sock"
    routes = short_dir / "routes.json"
    _egress.write_routes(
        routes, [NodeRoute("node-01", "192.0.2.1", "127.0.0.0/8", str(node_socket))]
    )
    host_socket = short_dir / "egress.sock"
    cwd = os.getcwd()
    os.chdir(node_dir)  # to listen there, as _node_init starts it (relative path)
    try:
        server = await asyncio.start_unix_server(_egress.NodeForwarder().handle, path="egress.sock")
    finally:
        os.chdir(cwd)
    async with server, serving(host_socket, _egress.HostProxy(routes)):
        yield host_socket


async def test_a_connect_to_a_pod_is_spliced_through_the_node_both_ways(short_dir: Path) -> None:
    async with echo_server() as port, proxies(short_dir) as socket:
        status, reader, writer = await connect(socket, f"127.0.0.1:{port}")
        assert status == "HTTP/1.1 200 Connection established"
        writer.write(b"hello\n")
        assert await asyncio.wait_for(reader.readline(), 10) == b"HELLO\n"
        writer.write_eof()  # passed on: the pod ends, and so does the tunnel
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


async def test_a_connect_nobody_routes_is_answered_502_at_once(short_dir: Path) -> None:
    async with proxies(short_dir) as socket:
        status, reader, writer = await connect(socket, "203.0.113.7:80")
        assert status.startswith("HTTP/1.1 502 no route to 203.0.113.7")
        assert await asyncio.wait_for(reader.read(), 10) == b"", "then closed"
        writer.close()


async def test_a_pod_port_nothing_listens_on_is_answered_502_by_the_node(short_dir: Path) -> None:
    async with echo_server() as port:
        pass  # the port is free again
    async with proxies(short_dir) as socket:
        status, _, writer = await connect(socket, f"127.0.0.1:{port}")
        assert status.startswith("HTTP/1.1 502 dial 127.0.0.1:")
        assert "ConnectionRefusedError" in status
        writer.close()


async def test_a_node_whose_forwarder_is_gone_is_answered_502(short_dir: Path) -> None:
    routes = short_dir / "routes.json"
    gone = NodeRoute("node-01", "192.0.2.1", "198.19.1.0/24", str(short_dir / "none.sock"))
    _egress.write_routes(routes, [gone])
    async with serving(short_dir / "egress.sock", _egress.HostProxy(routes)):
        status, _, writer = await connect(short_dir / "egress.sock", "node-01:10250")
        assert status.startswith("HTTP/1.1 502 node node-01 unreachable")
        writer.close()


async def test_a_request_that_is_not_a_connect_is_refused(short_dir: Path) -> None:
    async with serving(short_dir / "egress.sock", _egress.HostProxy(short_dir / "routes.json")):
        reader, writer = await asyncio.open_unix_connection(str(short_dir / "egress.sock"))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 405 only CONNECT is served, not GET")
        writer.close()

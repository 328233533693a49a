"""Real servers on loopback for the HTTP client and ``kube``'s transport: each test scripts what
its server sends, byte for byte (a chunked stream, a connection closed at the wrong moment,
garbage), over plain TCP or TLS (``Pki``: the certificates of the ``pki`` fixture); and a
real HTTP proxy (``proxying``: ``CONNECT`` tunnels, Basic proxy authentication, its own names);
and a scripted API server (``scripted_api``: JSON answers from a test's own state)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from dra_gpu import kube
from dra_gpu.kube import transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[object]]
"""A connection's script: its reader, its writer, and which connection it is (0, 1, ...)."""


@dataclasses.dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path
    """Signs every certificate below."""
    server: tuple[Path, Path]
    """For IP:127.0.0.1 and DNS:localhost."""
    named: tuple[Path, Path]
    """For DNS:api.example.test only."""
    client: tuple[Path, Path]
    """CN=me, O=team."""

    def server_context(self, pair: tuple[Path, Path], *, client_ca: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*pair)
        if client_ca:
            context.load_verify_locations(cafile=str(self.ca))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclasses.dataclass
class Server:
    port: int
    connections: int = 0
    """Connections accepted so far."""
    open: int = 0
    """Connections open now."""
    most_open: int = 0
    requests: list[bytes] = dataclasses.field(default_factory=list)
    """The head and body of every request ``read_request`` read, in order."""

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def serving(handler: Handler, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    """A server on a loopback port that runs ``handler`` for each connection, then closes it;
    at exit, closes everything and waits for the handlers to end."""
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        writers.append(writer)
        index = state.connections
        state.connections += 1
        state.open += 1
        state.most_open = max(state.most_open, state.open)
        try:
            await handler(reader, writer, index)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            state.open -= 1
            writer.close()

    server = await asyncio.start_server(connected, "127.0.0.1", 0, ssl=tls)
    state = Server(server.sockets[0].getsockname()[1])
    try:
        yield state
    finally:
        server.close()
        for writer in writers:
            writer.close()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for task in tasks:  # a script still waiting: its test failed already
            task.cancel()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader, server: Server | None = None) -> bytes:
    """One request, head and body (Content-Length only); recorded in ``server.requests``."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    request = head + (await reader.readexactly(length) if length else b"")
    if server is not None:
        server.requests.append(request)
    return request


def answer(body: bytes, status: str = "200 OK", *headers: str) -> bytes:
    """A whole HTTP/1.1 answer with a Content-Length."""
    extra = "".join(f"{h}\r\n" for h in headers)
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def chunked_head(status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


@dataclasses.dataclass
class Proxy:
    server: Server
    tunnels: list[str] = dataclasses.field(default_factory=list)
    """The ``host:port`` of every ``CONNECT``, in order."""
    heads: list[bytes] = dataclasses.field(default_factory=list)
    """The head of every request the proxy got (``CONNECT`` or a forwarded one)."""

    def url(self, scheme: str = "http", userinfo: str = "") -> str:
        return f"{scheme}://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.server.port}"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def proxying(
    *,
    hosts: Mapping[str, str] | None = None,
    authorization: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[Proxy]:
    """An HTTP proxy on a loopback port, as squid or tinyproxy would be: ``CONNECT host:port``
    opens a tunnel to that address (``hosts`` is its name resolution: ``api.example.test`` can
    be 127.0.0.1), ``200 Connection established``, then bytes both ways; with
    ``authorization``, a request without that ``Proxy-Authorization`` gets 407. A request in
    absolute form (``GET http://host/path``) is answered by the proxy itself with what it got:
    ``{"target": ..., "proxy-authorization": ...}``. Over TLS with ``tls``."""
    names = dict(hosts or {})

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        proxy.heads.append(head)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ")
        headers = {
            name.strip().lower(): value.strip()
            for name, _colon, value in (line.partition(":") for line in lines[1:] if line)
        }
        if authorization is not None and headers.get("proxy-authorization") != authorization:
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n\r\n'
            )
            return
        if method != "CONNECT":
            body = json.dumps(
                {"target": target, "proxy-authorization": headers.get("proxy-authorization")}
            ).encode()
            writer.write(answer(body))
            await writer.drain()
            return
        proxy.tunnels.append(target)
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        try:
            up_reader, up_writer = await asyncio.open_connection(names.get(host, host), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async with serving(handler, tls=tls) as server:
        proxy = Proxy(server)
        yield proxy


class Scripted(Protocol):
    """An API server's state as a test keeps it: every request it was sent, and its answer."""

    requests: list[tuple[str, str, Any]]

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]: ...


def status(code: int, reason: str) -> dict[str, Any]:
    """A ``Status`` body as the API server sends it with an error code."""
    return {"kind": "Status", "code": code, "reason": reason, "message": reason}


@contextlib.asynccontextmanager
async def scripted_api(fake: Scripted) -> AsyncIterator[kube.Kube]:
    """A ``kube.Kube`` on a loopback server that answers every JSON request as ``fake`` does
    (paths without their query), recording it in ``fake.requests``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader)
            head, _blank, payload = request.partition(b"\r\n\r\n")
            method, target, _version = head.split(b"\r\n")[0].decode().split(" ")
            path = target.partition("?")[0]
            body = json.loads(payload) if payload else None
            fake.requests.append((method, path, body))
            code, obj = fake.answer(method, path, body)
            writer.write(answer(json.dumps(obj).encode(), f"{code} Status"))
            await writer.drain()

    async with serving(handler) as server, kube.Kube(transport.Client(server.url())) as api:
        yield api

"""Real servers on loopback for the HTTP client and ``kube``'s transport: each test scripts what
its server sends, byte for byte (a chunked stream, a connection closed at the wrong moment,
garbage), over plain TCP or TLS (``Pki``: the certificates of the ``pki`` fixture); and a
real HTTP proxy (``proxying``: ``CONNECT`` tunnels, Basic proxy authentication, its own names);
and a scripted API server (``scripted_api``: JSON answers from a test's own state, or
``Reply``s as the real API server gives them under pressure: 429 with ``Retry-After``, 5xx,
410 Gone, watch streams with ERROR events, cut in the middle or held open, slow answers);
and ``FakeTime``, the clock, sleeps and jitter of a client whose waits a test only records."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import parse_qsl

from dra_gpu import kube
from dra_gpu.kube import backoff, throttling, transport

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


@dataclasses.dataclass(frozen=True)
class Request:
    """A request as the scripted API server got it."""

    method: str
    path: str
    query: dict[str, str]
    body: Any

    @property
    def watching(self) -> bool:
        return self.query.get("watch") == "true"


@dataclasses.dataclass(frozen=True)
class Reply:
    """One answer as the API server gives it: a JSON body with a status and headers, or (with
    ``events``) a watch's chunked stream of events that ends as ``end`` says."""

    code: int = 200
    body: Any = None
    headers: tuple[str, ...] = ()
    events: tuple[Any, ...] | None = None
    """A watch: these events, one chunk each."""
    end: Literal["end", "cut", "hold"] = "end"
    """After the events: ``end`` the stream (the server's timeoutSeconds ran out), ``cut`` the
    connection in the middle of the stream (no last chunk), or ``hold`` it open until the
    client goes."""
    hold: asyncio.Event | None = None
    """A slow answer: sent only once this is set."""


@runtime_checkable
class Replying(Protocol):
    """An API server scripted with ``Reply``s: every request it got, and its reply to each."""

    requests: list[Request]

    def reply(self, request: Request) -> Reply: ...


class Script:
    """Replies in the order given, by kind of request (``WATCH`` for a watch, else its method);
    the last reply of a kind repeats. Every request is kept in ``requests``."""

    def __init__(self, **replies: Sequence[Reply]) -> None:
        self.replies = {kind: list(queue) for kind, queue in replies.items()}
        self.requests: list[Request] = []

    def reply(self, request: Request) -> Reply:
        queue = self.replies["WATCH" if request.watching else request.method]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def of(self, kind: str) -> list[Request]:
        """The requests of one kind (``WATCH``, ``GET``, ...), in order."""
        return [r for r in self.requests if ("WATCH" if r.watching else r.method) == kind]


def status(code: int, reason: str, message: str = "", **details: Any) -> dict[str, Any]:
    """A ``Status`` body as the API server sends it with an error code."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message or reason,
    }
    if details:
        body["details"] = details
    return body


Route = Sequence[Reply] | Callable[[Request], Reply]
"""How ``Routed`` answers one kind of request to one path: replies in order (the last repeats),
or a function of the request."""


class Routed:
    """Replies by kind of request (``WATCH`` for a watch, else its method) and path, as
    ``routes`` says; a request with no route is answered 404 NotFound, as the API server answers
    a GET of an object that is not there. Every request is kept in ``requests``."""

    def __init__(self, routes: Mapping[tuple[str, str], Route]) -> None:
        self.routes: dict[tuple[str, str], list[Reply] | Callable[[Request], Reply]] = {
            key: route if callable(route) else list(route) for key, route in routes.items()
        }
        self.requests: list[Request] = []

    def reply(self, request: Request) -> Reply:
        route = self.routes.get(("WATCH" if request.watching else request.method, request.path))
        if route is None:
            return not_found(request.path)
        if callable(route):
            return route(request)
        return route.pop(0) if len(route) > 1 else route[0]

    def of(self, kind: str, path: str | None = None) -> list[Request]:
        """The requests of one kind (``WATCH``, ``GET``, ...), to ``path`` if given, in order."""
        return [
            r
            for r in self.requests
            if ("WATCH" if r.watching else r.method) == kind and path in (None, r.path)
        ]


def not_found(path: str) -> Reply:
    """404 as the API server answers a GET of an object that is not there (``path``: the
    object's, ``.../<resource>/<name>``)."""
    resource, name = path.rstrip("/").split("/")[-2:]
    message = f'{resource} "{name}" not found'
    return Reply(404, status(404, "NotFound", message, name=name, kind=resource))


def ok(body: Any) -> Reply:
    return Reply(200, body)


def listing(items: Sequence[Any], rv: str, more: str = "") -> Reply:
    """A list (a page, when ``more`` is its ``continue`` token) at resourceVersion ``rv``."""
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if more:
        metadata["continue"] = more
    return ok({"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": list(items)})


def too_many_requests(retry_after: int | None = 1) -> Reply:
    """429 as priority and fairness rejects a request (``Retry-After`` and
    ``details.retryAfterSeconds``; None: a 429 without them, which no API server sends)."""
    if retry_after is None:
        return Reply(429, status(429, "TooManyRequests"))
    body = status(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        retryAfterSeconds=retry_after,
    )
    return Reply(429, body, (f"Retry-After: {retry_after}",))


def unavailable(retry_after: int | None = None, code: int = 503) -> Reply:
    """A 5xx (503 by default), with ``Retry-After`` if given."""
    headers = (f"Retry-After: {retry_after}",) if retry_after is not None else ()
    return Reply(code, status(code, "ServiceUnavailable", "the server is shutting down"), headers)


def internal_error() -> Reply:
    return Reply(
        500, status(500, "InternalError", "Internal error occurred: etcdserver: leader changed")
    )


def gone(rv: str = "1") -> Reply:
    """410 as the API server answers a resourceVersion it no longer keeps."""
    return Reply(410, status(410, "Expired", f"too old resource version: {rv} (100)"))


def event(kind: str, name: str, rv: str) -> dict[str, Any]:
    """A watch event of an object ``name`` at resourceVersion ``rv``."""
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}


def bookmark(rv: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}


def initial_events_end(rv: str) -> dict[str, Any]:
    """The bookmark that ends a watch-list's initial events, as the API server sends it."""
    metadata = {"resourceVersion": rv, "annotations": {"k8s.io/initial-events-end": "true"}}
    return {"type": "BOOKMARK", "object": {"metadata": metadata}}


def watch_listed(
    items: Sequence[dict[str, Any]],
    rv: str,
    *events: Any,
    end: Literal["end", "cut", "hold"] = "hold",
    hold: asyncio.Event | None = None,
) -> Reply:
    """A watch-list's answer (``sendInitialEvents=true``): ``items`` as ADDED events, the
    bookmark that ends them at ``rv``, then ``events``, then ``end`` (held open by default)."""
    added = tuple({"type": "ADDED", "object": item} for item in items)
    return Reply(200, events=(*added, initial_events_end(rv), *events), end=end, hold=hold)


def watch_list_refused() -> Reply:
    """422 as an API server with the ``WatchList`` gate off answers a watch-list."""
    message = (
        'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents '
        "is forbidden for watch unless the WatchList feature gate is enabled"
    )
    return Reply(422, status(422, "Invalid", message, group="meta.k8s.io", kind="ListOptions"))


def error_event(code: int, reason: str, **details: Any) -> dict[str, Any]:
    """An ERROR event: the Status the API server ends a watch with."""
    return {"type": "ERROR", "object": status(code, reason, **details)}


def stream(*events: Any, end: Literal["end", "cut", "hold"] = "end") -> Reply:
    """A watch's answer: ``events``, then ``end`` (see ``Reply.end``)."""
    return Reply(200, events=events, end=end)


class FakeTime:
    """Time as a test tells it: a sleep returns at once (the loop runs once meanwhile), moves
    the clock on and is recorded; the jitter draws ``draw``. More than ``limit`` sleeps fail
    the test: a loop that only sleeps would spin."""

    def __init__(self, draw: float = 0.5, limit: int = 1000) -> None:
        self.now = 1000.0
        self.draw = draw
        self.limit = limit
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        assert len(self.slept) <= self.limit, f"{len(self.slept)} sleeps: the loop spins"
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)

    def random(self) -> float:
        return self.draw

    @property
    def timing(self) -> backoff.Timing:
        return backoff.Timing(clock=self.clock, sleep=self.sleep, random=self.random)


async def _send_reply(
    reply: Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    """Write ``reply``; False when the connection is done with (cut, or held until the client
    left)."""
    if reply.hold is not None:
        await reply.hold.wait()
    if reply.events is None:
        writer.write(
            answer(json.dumps(reply.body).encode(), f"{reply.code} Status", *reply.headers)
        )
        await writer.drain()
        return True
    writer.write(chunked_head(f"{reply.code} OK"))
    for item in reply.events:
        writer.write(chunk(json.dumps(item).encode() + b"\n"))
    await writer.drain()
    if reply.end == "end":
        writer.write(LAST_CHUNK)
        await writer.drain()
        return True
    if reply.end == "hold":
        await reader.read()  # until the client closes its end
    return False


@contextlib.asynccontextmanager
async def scripted_api(
    fake: Scripted | Replying,
    *,
    timing: backoff.Timing = backoff.REAL,
    limiter: throttling.TokenBucket | None = None,
) -> AsyncIterator[kube.Kube]:
    """A ``kube.Kube`` on a loopback server that answers every request as ``fake`` does.

    A ``Scripted`` fake answers JSON requests (paths without their query), each recorded in
    ``fake.requests`` as ``(method, path, body)``; a ``Replying`` one gets each ``Request``
    whole (its query too), recorded in ``fake.requests``, and answers with a ``Reply``. The
    client uses ``timing`` and ``limiter``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader)
            head, _blank, payload = request.partition(b"\r\n\r\n")
            method, target, _version = head.split(b"\r\n")[0].decode().split(" ")
            path, _mark, query = target.partition("?")
            body = json.loads(payload) if payload else None
            if isinstance(fake, Replying):
                got = Request(method, path, dict(parse_qsl(query)), body)
                fake.requests.append(got)
                if not await _send_reply(fake.reply(got), reader, writer):
                    return
                continue
            fake.requests.append((method, path, body))
            code, obj = fake.answer(method, path, body)
            writer.write(answer(json.dumps(obj).encode(), f"{code} Status"))
            await writer.drain()

    async with (
        serving(handler) as server,
        kube.Kube(transport.Client(server.url()), limiter=limiter, timing=timing) as api,
    ):
        yield api

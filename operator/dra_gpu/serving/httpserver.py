"""The HTTP side of a process: Prometheus ``/metrics``, ``/healthz`` and ``/readyz``.

Health is a coroutine the owner passes in, so each process decides what "alive" means (the agent:
its gRPC servers answer). The metrics and health listeners may share a port.

A small HTTP/1.1 server on asyncio streams, h11 parsing, instead of aiohttp's web server: the
node agent serves these three paths on every GPU node, and aiohttp costs it about 15 MiB.
Each connection is its own task, so a slow client holds up nobody else; it may send several
requests one after the other (keep-alive), waits at most ``IDLE_SECONDS`` between them and
``REQUEST_SECONDS`` for a request to arrive whole and its answer to leave. A request that is
not valid HTTP gets ``400`` and the connection closes; nothing a client sends stops the server.
``/metrics`` is written out in a thread of its own (``SCRAPES``): a full scrape of the
controller at a thousand nodes is tens of milliseconds of Python, which on the event loop would
hold up every watch event, pass and admission review meanwhile (prometheus_client's metrics
take their locks; the thread gives the loop the interpreter back every few milliseconds).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Protocol
from urllib.parse import parse_qsl

import h11
import prometheus_client

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[tuple[bool, str]]]
Answer = tuple[int, str, bytes]
"""Status, Content-Type, body."""
Route = Callable[[str], Awaitable[Answer]]
"""A path's handler: the query string in, the answer out."""

TEXT: Final = "text/plain; charset=utf-8"
IDLE_SECONDS: Final = 75.0
"""How long a kept-alive connection may wait for its next request (aiohttp's default too)."""
REQUEST_SECONDS: Final = 30.0
"""How long a request may take to arrive whole, and its answer to be sent."""
MAX_HEAD: Final = 16384
"""The largest request head (request line and headers) accepted."""
MAX_BODY: Final = 65536
"""These paths take no body; a client may send a small one, which is read and ignored."""
SCRAPES: Final = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics")
"""Where ``/metrics`` answers are written out, one at a time (started at the first scrape)."""


def _routes(
    *,
    registry: prometheus_client.CollectorRegistry | None,
    healthz: Check | None,
    readyz: Check | None,
) -> dict[str, Route]:
    routes: dict[str, Route] = {}

    def metrics_route(registry: prometheus_client.CollectorRegistry) -> Route:
        async def route(query: str) -> Answer:
            # ``?name[]=a&name[]=b``: those metrics only, as prometheus_client's own exposition
            # serves them (a probe that reads one metric does not pay for every series).
            names = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "name[]"]
            scraped = registry.restricted_registry(names) if names else registry
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(SCRAPES, prometheus_client.generate_latest, scraped)
            return 200, prometheus_client.CONTENT_TYPE_LATEST, body

        return route

    def check_route(check: Check) -> Route:
        async def route(query: str) -> Answer:
            ok, detail = await check()
            return 200 if ok else 503, TEXT, (detail + "\n").encode()

        return route

    if registry is not None:
        routes["/metrics"] = metrics_route(registry)
    if healthz:
        routes["/healthz"] = check_route(healthz)
    if readyz:
        routes["/readyz"] = check_route(readyz)
    return routes


async def _answer(routes: dict[str, Route], request: h11.Request) -> Answer:
    """The answer to one request, as aiohttp's router gave it: 404, 405, or the route's."""
    path, _, query = request.target.decode("latin-1").partition("?")
    route = routes.get(path)
    if route is None:
        return 404, TEXT, b"404: Not Found"
    if request.method not in (b"GET", b"HEAD"):
        return 405, TEXT, b"405: Method Not Allowed"
    try:
        return await route(query)
    except Exception:  # a failing check is a 500 for the prober, and a traceback in the log
        log.exception("answering %s %s failed", request.method.decode(), path)
        return 500, TEXT, b"500 Internal Server Error\n\nServer got itself in trouble"


class _Connection:
    """One client's connection: requests in, answers out, until either side closes."""

    def __init__(
        self, routes: dict[str, Route], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.routes, self.reader, self.writer = routes, reader, writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.started = False
        """The current request's first byte came (its time limit is running)."""

    async def serve(self) -> None:
        try:
            while await self._one_request():
                self.h11.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            await self._refuse(exc.error_status_hint, str(exc))
        except (OSError, TimeoutError, h11.LocalProtocolError):
            pass  # the client went away or stalled: nobody to answer
        finally:
            self.writer.close()

    async def _one_request(self) -> bool:
        """Serve one request; True when the connection may carry another. The wait for it
        may last ``IDLE_SECONDS``; from its first byte, all of it ``REQUEST_SECONDS``."""
        self.started = False
        async with asyncio.timeout(IDLE_SECONDS) as limit:
            event = await self._next_event(limit)
            if isinstance(event, h11.ConnectionClosed):
                return False
            assert isinstance(event, h11.Request), event  # h11: a request comes first
            received = 0
            while not isinstance(body := await self._next_event(limit), h11.EndOfMessage):
                if isinstance(body, h11.Data):
                    received += len(body.data)
                    if received > MAX_BODY:
                        raise h11.RemoteProtocolError("request body too large", 413)
            status, content_type, content = await _answer(self.routes, event)
            headers = [("Content-Type", content_type), ("Content-Length", str(len(content)))]
            if status == 405:
                headers.append(("Allow", "GET, HEAD"))
            response = h11.Response(status_code=status, headers=headers, reason=_phrase(status))
            data = self.h11.send(response) or b""
            if event.method != b"HEAD":
                data += self.h11.send(h11.Data(data=content)) or b""
            data += self.h11.send(h11.EndOfMessage()) or b""
            self.writer.write(data)
            await self.writer.drain()
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    async def _next_event(self, limit: asyncio.Timeout) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = await self.reader.read(MAX_HEAD)
                if data and not self.started:  # a request begins
                    self.started = True
                    limit.reschedule(asyncio.get_running_loop().time() + REQUEST_SECONDS)
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.Event):
                return event
            # PAUSED: a pipelined request waits for this one's answer; we read one at a time.
            raise h11.RemoteProtocolError("pipelined requests are not served", 400)

    async def _refuse(self, status: int, reason: str) -> None:
        """Answer a request that is not valid HTTP, if it is still our turn to answer."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = f"{status}: {reason}".encode()
        headers = [
            ("Content-Type", TEXT),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
        try:
            response = h11.Response(status_code=status, headers=headers, reason=_phrase(status))
            data = self.h11.send(response) or b""
            data += self.h11.send(h11.Data(data=body)) or b""
            data += self.h11.send(h11.EndOfMessage()) or b""
            self.writer.write(data)
            async with asyncio.timeout(REQUEST_SECONDS):
                await self.writer.drain()
        except (OSError, TimeoutError, h11.LocalProtocolError):
            pass


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


class _Listener:
    """One listening socket and the tasks of its connections, closed together."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.connections: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.closing = False

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            await _Connection(self.routes, reader, writer).serve()
        except asyncio.CancelledError:
            # Python 3.11's streams log a cancelled connection task as an error in a callback:
            # ended by ``close``, it ends normally.
            if not self.closing:
                raise
        finally:
            self.connections.discard(task)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (``port`` 0: one the system chose)."""
        self.server = await asyncio.start_server(self._connected, host, port)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self.closing = True
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()


class Listening(Protocol):
    """Where to serve (the agent's and the controller's settings): 0 turns a part off; the
    two parts share one listener when their ports are the same."""

    @property
    def bind_address(self) -> str: ...
    @property
    def metrics_port(self) -> int: ...
    @property
    def health_port(self) -> int: ...


@contextlib.asynccontextmanager
async def serving(
    where: Listening,
    *,
    registry: prometheus_client.CollectorRegistry,
    healthz: Check,
    readyz: Check,
) -> AsyncIterator[list[int]]:
    """Serve until exit; yields the bound ports (useful with port 0 in tests)."""
    layout: dict[int, dict[str, bool]] = {}
    if where.metrics_port:
        layout.setdefault(where.metrics_port, {})["metrics"] = True
    if where.health_port:
        layout.setdefault(where.health_port, {})["health"] = True
    listeners: list[_Listener] = []
    ports: list[int] = []
    try:
        for port, parts in layout.items():
            listener = _Listener(
                _routes(
                    registry=registry if parts.get("metrics") else None,
                    healthz=healthz if parts.get("health") else None,
                    readyz=readyz if parts.get("health") else None,
                )
            )
            listeners.append(listener)
            ports.append(await listener.start(where.bind_address, port))
        yield ports
    finally:
        for listener in listeners:
            await listener.close()

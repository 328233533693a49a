"""A small HTTP/1.1 client on asyncio streams, with h11 as the parser: what ``kube`` sends its
requests over.

It exists for the node agent's memory: aiohttp (and kubernetes-asyncio's client, built on it)
costs about 15 MiB resident on every GPU node, h11 under half a MiB. It does what ``kube`` needs
from one API server and nothing more: no redirects, cookies or compression.

- One ``Client`` per server: a pool of keep-alive connections, at most ``limit`` at a time
  (further requests wait their turn, first come first served). A connection goes back to the
  pool only after its answer was read to the end and neither side asked to close it; any
  failure drops it. An idle connection the server has closed is noticed and dropped, and an
  idempotent request that fails on a reused connection before any byte of the answer came is
  sent once more, on a fresh connection: the server may close an idle connection at the very
  moment we reuse it.
- TLS is the caller's ``ssl.SSLContext`` (CA, client certificate, verification), with
  ``server_hostname`` for a certificate issued to another name than the URL's host.
- Through an HTTP proxy (``proxy``: ``http://`` or ``https://``, perhaps with ``user:password@``,
  sent as ``Proxy-Authorization: Basic``) as Go's ``net/http`` goes: to an ``https://`` server,
  a ``CONNECT host:port`` tunnel and TLS to the server inside it (an ``https://`` proxy is itself
  reached over TLS, checked with the same context, as Go checks it); to an ``http://`` server,
  each request in absolute form to the proxy. Which proxy, if any, is the caller's choice
  (``proxies``).
- ``Timeout``: connect, the whole request (waiting for a connection and reading the answer
  included), and for a streamed body (a watch) the longest silence between two chunks.
- A response's body is read by its owner, whole (``read``) or line by line as it arrives
  (``lines``); Content-Length and chunked bodies alike. ``release`` hands the connection back,
  or closes it when the body was not read to the end.

Every failure to get an answer is an ``OSError``, as Python's own sockets raise them::

    OSError
    ├── TimeoutError                  connect, the request or a silence took longer than allowed
    ├── ssl.SSLError                  TLS (ssl.SSLCertVerificationError: certificate not trusted)
    ├── socket.gaierror               the host name does not resolve
    ├── ConnectionRefusedError, ...   the connection failed, errno set
    └── HttpError (ConnectionError)
        ├── ConnectionClosed          the server closed the connection before the answer ended
        ├── ProtocolError             the answer is not HTTP/1.1
        └── ProxyError                the proxy did not open the tunnel (its status, in words)
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Final
from urllib.parse import unquote, urlsplit

import h11

CHUNK: Final = 65536
"""The most bytes one read takes from a socket."""
MAX_HEAD: Final = 65536
"""The largest response head (status line and headers) accepted."""
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods sent once more after a reused connection failed before any answer (RFC 9110)."""


class HttpError(ConnectionError):
    """The server's answer did not arrive whole, or is not HTTP."""


class ConnectionClosed(HttpError):
    """The server closed the connection before its answer ended (or began)."""


class ProtocolError(HttpError):
    """What the server sent is not valid HTTP/1.1."""


class ProxyError(HttpError):
    """The proxy did not open a tunnel to the server: it answered ``CONNECT`` with another
    status than 200, or closed the connection."""


@dataclasses.dataclass(frozen=True)
class Timeout:
    """How long a request may take, in seconds; None for no limit.

    ``Timeout(total=10)``: a plain request; ``Timeout(total=None, read=330)``: a watch, which
    may last as long as it keeps sending."""

    connect: float | None = 10.0
    """Opening a connection: TCP and the TLS handshake."""
    total: float | None = 30.0
    """The whole request: waiting for a free connection, sending, and reading the answer."""
    read: float | None = None
    """The longest silence while reading the answer."""

    def __post_init__(self) -> None:
        for name in ("connect", "total", "read"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(
                    f"Timeout({name}={value!r}): a positive number of seconds, or None"
                )


DEFAULT_TIMEOUT: Final = Timeout()


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a ``Client`` connects: scheme, host and port of its URL, and the path prefix
    every target is appended to (an API server behind a proxy path)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        """``https://host[:port][/prefix]``; ``ValueError`` in words for anything else."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"{url!r} has an invalid port") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self._host if self.port == default else self.authority

    @property
    def authority(self) -> str:
        """``host:port``, an IPv6 host in brackets: what ``CONNECT`` asks for."""
        return f"{self._host}:{self.port}"

    @property
    def _host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host


@dataclasses.dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: where it is, and the ``Proxy-Authorization`` its URL's user and password
    make (Basic, as Go makes it)."""

    origin: Origin
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """``http[s]://[user[:password]@]host[:port]``; ``ValueError`` in words otherwise."""
        parts = urlsplit(url)
        origin = Origin.parse(url)
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(origin, authorization)

    def __str__(self) -> str:
        """The URL without its user and password, for messages."""
        return f"{self.origin.scheme}://{self.origin.authority}"


class _Connection:
    """One socket and its h11 state machine; used by one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self.reused = False
        """Served a request before this one (taken from the idle pool)."""
        self.answered = False
        """Some byte of the current answer came."""
        self.idle_since = 0.0

    def usable(self) -> bool:
        """An idle connection can serve another request: the server has not closed it."""
        return not (self.reader.at_eof() or self.writer.is_closing())

    async def send(self, data: bytes, deadline: float | None) -> None:
        self.writer.write(data)
        async with asyncio.timeout_at(deadline):
            await self.writer.drain()

    async def next_event(self, deadline: float | None) -> h11.Event:
        """The next event of the answer, reading from the socket as needed."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                if self.reader.at_eof():
                    raise ConnectionClosed(
                        "the server closed the connection "
                        + ("in the middle of its answer" if self.answered else "before answering")
                    ) from None
                raise ProtocolError(f"the server's answer is not valid HTTP/1.1: {exc}") from None
            if event is h11.NEED_DATA:
                async with asyncio.timeout_at(deadline):
                    data = await self.reader.read(CHUNK)
                self.answered = self.answered or bool(data)
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise ConnectionClosed("the server closed the connection before answering")
            if isinstance(event, h11.Event):
                return event
            # PAUSED: the server answered more than was asked (h11 waits for the next cycle).
            raise ProtocolError("the server sent more than one answer to one request")

    def reusable(self) -> bool:
        """The answer ended and neither side asked to close: start the next cycle."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return self.usable()
        return False

    def close(self) -> None:
        self.writer.close()


class Response:
    """The status and headers of an answer; its body is read by the caller, then ``release``
    hands the connection back (or closes it when the body was not read to the end)."""

    def __init__(
        self,
        client: Client,
        connection: _Connection,
        head: h11.Response,
        timeout: Timeout,
        deadline: float | None,
    ) -> None:
        self.status: int = head.status_code
        self.reason: str = head.reason.decode("latin-1")
        self.headers: list[tuple[bytes, bytes]] = list(head.headers)
        self._client = client
        self._connection: _Connection | None = connection
        self._timeout, self._deadline = timeout, deadline
        self._done = False

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower().encode()
        return next((v.decode("latin-1") for k, v in self.headers if k == wanted), None)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, each piece as the socket gave it."""
        loop = asyncio.get_running_loop()
        while (connection := self._connection) is not None and not self._done:
            deadline = self._deadline
            if self._timeout.read is not None:
                silence = loop.time() + self._timeout.read
                deadline = silence if deadline is None else min(deadline, silence)
            try:
                event = await connection.next_event(deadline)
            except BaseException:
                self.release()
                raise
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
                self.release()
                return

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line, each as soon as its newline came (without it); a last line
        without a newline too."""
        pending = bytearray()
        async for chunk in self.chunks():
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if pending:
                    pending += chunk[start:end]
                    yield bytes(pending)
                    pending.clear()
                else:
                    yield chunk[start:end]
                start = end + 1
            pending += chunk[start:]
        if pending:
            yield bytes(pending)

    def release(self) -> None:
        """Give the connection back; safe to call more than once."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._release(connection, keep=self._done)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Client:
    """HTTP/1.1 requests to one server over a pool of keep-alive connections.

    ``Client("https://10.0.0.1:443", ssl_context=context)``; close with ``aclose`` (or use as
    an async context manager)."""

    def __init__(
        self,
        url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        limit: int = 100,
        idle_seconds: float = 30.0,
        user_agent: str = "dra-gpu",
        proxy: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.origin = Origin.parse(self.url)
        self.proxy = Proxy.parse(proxy) if proxy else None
        """Every connection goes through this proxy; None: straight to the server."""
        self._user_agent = user_agent
        if self.origin.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self._ssl = ssl_context if self.origin.scheme == "https" else None
        self._server_hostname = server_hostname or None
        self._idle_seconds = idle_seconds
        self._idle: collections.deque[_Connection] = collections.deque()
        self._slots = asyncio.Semaphore(limit)
        self._closed = False
        self._fixed_headers = [("Host", self.origin.host_header), ("User-Agent", user_agent)]

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        timeouts: Timeout | None = None,
    ) -> Response:
        """Send one request (``target``: path and query, after the URL's path prefix); returns
        when the answer's head has come. The caller reads the body, then releases it."""
        if self._closed:
            raise RuntimeError(f"the HTTP client of {self.url} is closed")
        timeout = timeouts or DEFAULT_TIMEOUT
        loop = asyncio.get_running_loop()
        deadline = None if timeout.total is None else loop.time() + timeout.total
        all_headers = [*self._fixed_headers, *headers]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            all_headers.append(("Content-Length", str(len(body or b""))))
        full_target = self.origin.prefix + target
        if self.proxy is not None and self.origin.scheme == "http":  # no tunnel: absolute form
            full_target = f"http://{self.origin.host_header}{full_target}"
            if self.proxy.authorization is not None:
                all_headers.append(("Proxy-Authorization", self.proxy.authorization))
        request = h11.Request(method=method, target=full_target, headers=all_headers)
        fresh = False
        while True:
            connection = await self._acquire(deadline, timeout.connect, fresh=fresh)
            try:
                head = await self._exchange(connection, request, body, deadline)
            except BaseException as exc:
                self._release(connection, keep=False)
                retry = (
                    isinstance(exc, OSError)
                    and not isinstance(exc, TimeoutError)
                    and connection.reused
                    and not connection.answered
                    and method in IDEMPOTENT
                    and not fresh
                )
                if not retry:
                    raise
                fresh = True  # the server closed it as we reused it: once more, on a new one
                continue
            return Response(self, connection, head, timeout, deadline)

    async def _exchange(
        self,
        connection: _Connection,
        request: h11.Request,
        body: bytes | None,
        deadline: float | None,
    ) -> h11.Response:
        data = connection.h11.send(request) or b""
        if body:
            data += connection.h11.send(h11.Data(data=body)) or b""
        data += connection.h11.send(h11.EndOfMessage()) or b""
        await connection.send(data, deadline)
        while True:
            event = await connection.next_event(deadline)
            if isinstance(event, h11.Response):
                return event
            # h11.InformationalResponse (100 Continue and the like): the real answer follows.

    async def _acquire(
        self, deadline: float | None, connect: float | None, *, fresh: bool
    ) -> _Connection:
        async with asyncio.timeout_at(deadline):
            await self._slots.acquire()
        try:
            loop = asyncio.get_running_loop()
            now = loop.time()
            while self._idle and not fresh:
                connection = self._idle.pop()  # the most recent: the least likely closed
                if connection.usable() and now - connection.idle_since < self._idle_seconds:
                    connection.reused, connection.answered = True, False
                    return connection
                connection.close()
            limit = None if connect is None else now + connect
            if deadline is not None:
                limit = deadline if limit is None else min(limit, deadline)
            async with asyncio.timeout_at(limit):
                return await self._open()
        except BaseException:
            self._slots.release()
            raise

    async def _open(self) -> _Connection:
        """A new connection: to the server, or through the proxy (a tunnel to an ``https://``
        server, TLS to the server inside it)."""
        hostname = self._server_hostname or self.origin.host
        if self.proxy is None:
            return _Connection(*await self._dial(self.origin, self._ssl, hostname))
        proxy = self.proxy.origin
        proxy_tls = None
        if proxy.scheme == "https":
            proxy_tls = self._ssl or ssl.create_default_context()
        reader, writer = await self._dial(proxy, proxy_tls, proxy.host)
        try:
            if self._ssl is not None:
                await self._tunnel(reader, writer)
                await writer.start_tls(self._ssl, server_hostname=hostname)
        except BaseException:
            writer.close()
            raise
        return _Connection(reader, writer)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``CONNECT host:port`` through the proxy; returns once it answered 200 (Go accepts
        no other status)."""
        assert self.proxy is not None
        proxy, target = self.proxy, self.origin.authority
        headers = [("Host", target), ("User-Agent", self._user_agent)]
        if proxy.authorization is not None:
            headers.append(("Proxy-Authorization", proxy.authorization))
        http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        data = http.send(h11.Request(method="CONNECT", target=target, headers=headers)) or b""
        writer.write(data + (http.send(h11.EndOfMessage()) or b""))
        await writer.drain()
        while True:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as exc:
                raise ProtocolError(
                    f"the proxy {proxy}'s answer to CONNECT {target} is not HTTP/1.1: {exc}"
                ) from None
            if event is h11.NEED_DATA:
                received = await reader.read(CHUNK)
                if not received:
                    raise ProxyError(
                        f"the proxy {proxy} closed the connection before answering CONNECT {target}"
                    )
                http.receive_data(received)
            elif isinstance(event, h11.Response):
                break
            elif not isinstance(event, h11.InformationalResponse):
                raise ProtocolError(f"the proxy {proxy} sent {event!r} to CONNECT {target}")
        if event.status_code != 200:
            reason = event.reason.decode("latin-1")
            raise ProxyError(
                f"the proxy {proxy} answered {event.status_code} {reason} to CONNECT {target}"
                + (": check the user and password in its URL" if event.status_code == 407 else "")
            )
        if http.trailing_data[0]:
            raise ProtocolError(f"the proxy {proxy} sent data before the tunnel's TLS handshake")

    async def _dial(
        self, origin: Origin, tls: ssl.SSLContext | None, hostname: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``origin``: each address of its host in turn, then ``tls``. The
        first address's error is raised when none connects (errno set, unlike asyncio's
        combined error)."""
        loop = asyncio.get_running_loop()
        addresses = await loop.getaddrinfo(
            origin.host, origin.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        errors: list[OSError] = []
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                errors.append(exc)
                continue
            except BaseException:
                sock.close()
                raise
            try:
                reader, writer = await asyncio.open_connection(
                    sock=sock,
                    ssl=tls,
                    server_hostname=hostname if tls else None,
                    limit=CHUNK,
                )
            except BaseException:
                sock.close()
                raise
            return reader, writer
        if errors:
            raise errors[0]
        raise OSError(f"{origin.host} has no address")  # getaddrinfo answers at least one

    def _release(self, connection: _Connection, *, keep: bool) -> None:
        if keep and not self._closed and connection.reusable():
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.close()
        self._slots.release()

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their answer is released."""
        self._closed = True
        closing = list(self._idle)
        self._idle.clear()
        for connection in closing:
            connection.close()
        for connection in closing:
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await connection.writer.wait_closed()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

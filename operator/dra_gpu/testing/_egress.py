"""The cluster's network as the API server sees it: an HTTP CONNECT proxy on a unix socket.

The kit's nodes live in network namespaces of their own, with no link to this machine. The API
server's ``cluster`` egress (``EgressSelectorConfiguration``: ``HTTPConnect`` over ``uds``)
sends every dial to the cluster here: the kubelets (logs, exec, port-forward), webhooks and
aggregated APIs behind Services (``--enable-aggregator-routing``: a ready endpoint's pod IP),
and the ``services/proxy`` and ``pods/proxy`` subresources. One protocol, two roles:

- ``host`` (``python _egress.py host --listen egress.sock --routes egress-routes.json``),
  beside the API server: each ``CONNECT host:port`` is routed by ``route`` against the table
  the kit writes as nodes start (``write_routes``; re-read per connection): a pod IP in a node's
  pod subnet, or the node's name or address, goes to that node's forwarder; anything else is
  answered ``502`` and logged.
- ``node`` (``python _egress.py node --listen egress.sock``), the node's forwarder, started by
  ``_node_init.py`` inside the node's network namespace: it dials the ``CONNECT`` target (an IP
  address) from there.

Both answer ``200`` once the target is connected, then splice bytes both ways until both sides
are done; every connect and every wait for a request has a timeout, and a bad request or a
failed dial is a status line and a log line, never a crash. Standard library only, run by path
(like ``_pdeathsig.py``): a node runs it without the project on its path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

CONNECT_TIMEOUT = 10.0
"""Seconds for a dial (the node's socket, the target in the node) and for a request's head."""
HEAD_LIMIT = 64 * 1024
"""Bytes of a request's (or the node's answer's) head: a CONNECT has a line or two."""
SPLICE_CHUNK = 64 * 1024
UNIX_PATH_MAX = 107
"""Bytes of a unix socket's path (``sun_path`` less its NUL)."""

log = logging.getLogger("egress")


# ---- routing (pure) --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NodeRoute:
    """One node as the table names it: what the API server may dial there."""

    name: str
    address: str
    """The node's InternalIP (``--node-ip``), on the loopback of its namespace."""
    pod_subnet: str
    """Its pods' addresses (CIDR), on its ``cni0`` bridge."""
    socket: str
    """The node's forwarder (``node`` role): an absolute path, of any length."""

    def has_pod_ip(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return ip in ipaddress.ip_network(self.pod_subnet, strict=False)


@dataclasses.dataclass(frozen=True)
class ViaNode:
    """Dial ``host:port`` inside ``node``'s network namespace."""

    node: NodeRoute
    host: str
    port: int
    kind: str
    """What the target is there: ``"pod"`` or ``"node"`` (its kubelet, a host port)."""


@dataclasses.dataclass(frozen=True)
class Refused:
    """No route: the reason goes into the 502's status line and the log."""

    reason: str


def split_target(target: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` too) as a CONNECT names it; None when it is not one."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def route(target: str, nodes: Sequence[NodeRoute]) -> ViaNode | Refused:
    """Where a ``CONNECT target`` goes. Deterministic and side-effect free: the table in,
    the decision out.

    - an IP in a node's pod subnet: that node, the pod's address;
    - a node's name (what the API server dials a kubelet by: its Hostname address) or its
      address: that node, its address, the port asked for;
    - anything else: refused.
    """
    split = split_target(target)
    if split is None:
        return Refused(f"not a host:port: {target!r}")
    host, port = split
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for node in nodes:
        if host in (node.name, node.address):
            return ViaNode(node, node.address, port, "node")
        if ip is not None and node.has_pod_ip(ip):
            return ViaNode(node, str(ip), port, "pod")
    return Refused(f"no route to {host}: neither a node nor in a node's pod subnet")


def read_routes(path: Path) -> list[NodeRoute]:
    """The table at ``path``; empty while there is none (no node started yet)."""
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    return [NodeRoute(**entry) for entry in body["nodes"]]


def write_routes(path: Path, nodes: Sequence[NodeRoute]) -> Path:
    """The table, atomically (a proxy reading it never sees half of it); returns ``path``."""
    body = {"nodes": [dataclasses.asdict(node) for node in nodes]}
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out, indent=2)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return path


def with_node(nodes: Sequence[NodeRoute], node: NodeRoute) -> list[NodeRoute]:
    """``nodes`` with ``node`` added, or in place of the entry of the same name."""
    return [*(n for n in nodes if n.name != node.name), node]


# ---- the protocol ------------------------------------------------------------------------------


class BadRequest(Exception):
    """Not a CONNECT this proxy serves: ``status`` says which."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


async def read_connect(reader: asyncio.StreamReader) -> str:
    """The target of the ``CONNECT`` request at the head of ``reader`` (its head consumed)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
    except TimeoutError:
        raise BadRequest("408 no request within the timeout") from None
    except asyncio.IncompleteReadError:
        raise BadRequest("400 connection closed before a whole request") from None
    except asyncio.LimitOverrunError:
        raise BadRequest("431 request head too large") from None
    method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
    target = rest.split(" ", 1)[0]
    if method != "CONNECT":
        raise BadRequest(f"405 only CONNECT is served, not {method or '(nothing)'}")
    return target


async def reply(writer: asyncio.StreamWriter, status: str) -> None:
    """A response head with ``status`` (``"502 why"``); no body, whatever the status."""
    writer.write(f"HTTP/1.1 {_one_line(status)}\r\n\r\n".encode("latin-1", "replace"))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Bytes both ways until both sides are done (an EOF is passed on as one); a reset on
    either side closes both."""
    tasks = [asyncio.create_task(_pipe(a[0], b[1])), asyncio.create_task(_pipe(b[0], a[1]))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, writer in (a, b):
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(SPLICE_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


async def open_unix(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the unix socket at ``path``, even one longer than a socket path may be (by
    its directory's descriptor: ``/proc/self/fd/N/name``)."""
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        return await asyncio.wait_for(
            asyncio.open_unix_connection(path, limit=HEAD_LIMIT), CONNECT_TIMEOUT
        )
    directory = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        short = f"/proc/self/fd/{directory}/{os.path.basename(path)}"
        return await asyncio.wait_for(
            asyncio.open_unix_connection(short, limit=HEAD_LIMIT), CONNECT_TIMEOUT
        )
    finally:
        os.close(directory)


# ---- the two roles -----------------------------------------------------------------------------


class _Proxy:
    """What both roles do with a connection: number it, read its ``CONNECT`` (a bad one is
    answered), relay it (``_relay``), close it; one connection's failure never ends the proxy."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        try:
            try:
                target = await read_connect(reader)
            except BadRequest as bad:
                log.warning("#%d bad request: %s", conn, bad.status)
                await reply(writer, bad.status)
                return
            await self._relay(conn, target, reader, writer)
        except Exception:
            log.exception("#%d failed", conn)
        finally:
            writer.close()

    async def _relay(
        self, conn: int, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        raise NotImplementedError


class HostProxy(_Proxy):
    """The API server's end: routes by the table at ``routes``, relays through the nodes."""

    def __init__(self, routes: Path) -> None:
        super().__init__()
        self.routes = routes

    async def _relay(
        self, conn: int, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            nodes = read_routes(self.routes)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("#%d CONNECT %s: cannot read %s: %s", conn, target, self.routes, exc)
            await reply(writer, f"502 routing table unreadable: {exc}")
            return
        decision = route(target, nodes)
        if isinstance(decision, Refused):
            log.warning("#%d CONNECT %s refused: %s", conn, target, decision.reason)
            await reply(writer, f"502 {decision.reason}")
            return
        upstream = await self._through_node(conn, target, decision, writer)
        if upstream is not None:
            await reply(writer, "200 Connection established")
            await splice((reader, writer), upstream)
            log.info("#%d CONNECT %s closed", conn, target)

    async def _through_node(
        self, conn: int, target: str, via: ViaNode, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The node's forwarder connected to ``via``'s target, or None once the failure was
        answered."""
        where = f"{via.host}:{via.port} in node {via.node.name} ({via.kind})"
        try:
            up_reader, up_writer = await open_unix(via.node.socket)
        except (OSError, TimeoutError) as exc:
            log.warning("#%d CONNECT %s -> %s: node unreachable: %s", conn, target, where, exc)
            await reply(writer, f"502 node {via.node.name} unreachable: {exc!r}")
            return None
        dial = _host_port(via.host, via.port)
        up_writer.write(f"CONNECT {dial} HTTP/1.1\r\nHost: {dial}\r\n\r\n".encode())
        try:
            head = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), 2 * CONNECT_TIMEOUT)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            head = b"HTTP/1.1 502 no answer from the node's forwarder\r\n\r\n"
        status = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")[2]
        if not status.startswith("200"):
            up_writer.close()
            log.warning("#%d CONNECT %s -> %s: %s", conn, target, where, status)
            await reply(writer, status if status.startswith("5") else f"502 {status}")
            return None
        log.info("#%d CONNECT %s -> %s", conn, target, where)
        return up_reader, up_writer


class NodeForwarder(_Proxy):
    """A node's end, in its network namespace: dials the target (an IP address) itself."""

    async def _relay(
        self, conn: int, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        split = split_target(target)
        if split is None or not _is_ip(split[0]):
            log.warning("#%d CONNECT %s refused: not an IP address and port", conn, target)
            await reply(writer, f"502 not an IP address and port: {target}")
            return
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*split), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            log.warning("#%d CONNECT %s failed: %r", conn, target, exc)
            await reply(writer, f"502 dial {target} in the node failed: {exc!r}")
            return
        log.info("#%d CONNECT %s", conn, target)
        await reply(writer, "200 Connection established")
        await splice((reader, writer), upstream)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- the process -------------------------------------------------------------------------------


async def serve(listen: str, handler: HostProxy | NodeForwarder) -> None:
    """Serve on the unix socket ``listen`` (owner only) until killed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(listen)
    old = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(handler.handle, path=listen, limit=HEAD_LIMIT)
    finally:
        os.umask(old)
    log.info("serving on %s", listen)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="_egress.py", description="HTTP CONNECT egress")
    roles = parser.add_subparsers(dest="role", required=True)
    host = roles.add_parser("host", help="the API server's end: route by the table")
    host.add_argument("--listen", required=True, help="unix socket (relative: to the cwd)")
    host.add_argument("--routes", required=True, type=Path, help="the routing table (JSON)")
    node = roles.add_parser("node", help="a node's end: dial in this network namespace")
    node.add_argument("--listen", required=True, help="unix socket (relative: to the cwd)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s egress-{args.role} %(levelname)s %(message)s",
    )
    handler = HostProxy(args.routes) if args.role == "host" else NodeForwarder()
    log.info("starting in %s", os.getcwd())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, handler))
    return 0


if __name__ == "__main__":
    sys.exit(main())

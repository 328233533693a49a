"""The HTTP side of a process: Prometheus ``/metrics``, ``/healthz`` and ``/readyz``.

Health is a coroutine the owner passes in, so each process decides what "alive" means (the agent:
its gRPC servers answer). The metrics and health listeners may share a port.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import prometheus_client
from aiohttp import web

Check = Callable[[], Awaitable[tuple[bool, str]]]


def _app(
    *,
    registry: prometheus_client.CollectorRegistry | None,
    healthz: Check | None,
    readyz: Check | None,
) -> web.Application:
    app = web.Application()

    def metrics_handler(
        registry: prometheus_client.CollectorRegistry,
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            # ``?name[]=a&name[]=b``: those metrics only, as prometheus_client's own exposition
            # serves them (a probe that reads one metric does not pay for every series).
            names = request.query.getall("name[]", [])
            body = prometheus_client.generate_latest(
                registry.restricted_registry(names) if names else registry
            )
            return web.Response(
                body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST}
            )

        return handler

    def check_handler(check: Check) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            ok, detail = await check()
            return web.Response(status=200 if ok else 503, text=detail + "\n")

        return handler

    if registry is not None:
        app.router.add_get("/metrics", metrics_handler(registry))
    if healthz:
        app.router.add_get("/healthz", check_handler(healthz))
    if readyz:
        app.router.add_get("/readyz", check_handler(readyz))
    return app


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
    runners: list[web.AppRunner] = []
    ports: list[int] = []
    try:
        for port, parts in layout.items():
            app = _app(
                registry=registry if parts.get("metrics") else None,
                healthz=healthz if parts.get("health") else None,
                readyz=readyz if parts.get("health") else None,
            )
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, where.bind_address, port)
            await site.start()
            server = site._server  # aiohttp exposes the bound sockets only here
            sockets = getattr(server, "sockets", None) or []
            ports.extend(s.getsockname()[1] for s in sockets[:1])
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()

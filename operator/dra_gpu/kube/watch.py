"""List, then watch: the one loop every long-running component follows the API server with.

Owns: ``once`` (one watch request from a resourceVersion, its events as they stream in),
``forever`` (list, then watch, again and again: it relists after ``410 Gone``, reconnects after
network errors and API server restarts, and never returns) and the paging of a list (``limit``
and ``continue``), so that one page at a time is in memory. ``Kube.watch_once`` and
``Kube.watch_forever`` are these, on the client.

Must not: build requests or read credentials (``Api``, the client, sends them), or know which
objects are watched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from dra_gpu.kube import errors, transport

log = logging.getLogger(__name__)


class Api(Protocol):
    """What a watch needs of the client: a JSON ``GET``, and a request whose answer streams."""

    async def get(self, path: str, **query: Any) -> errors.Body: ...

    async def send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        timeouts: transport.Timeout = ...,
    ) -> transport.Response: ...


async def once(
    api: Api, path: str, resource_version: str, *, timeout_seconds: int = 300, **query: Any
) -> AsyncGenerator[errors.Body, None]:
    """One watch request from ``resource_version``; yields raw watch events."""
    response = await api.send(
        "GET",
        path,
        query={
            **query,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        },
        timeouts=transport.Timeout(connect=10, total=None, read=timeout_seconds + 30),
    )
    try:
        async for line in response.lines():
            if line.strip():
                yield json.loads(line)
    finally:
        response.release()


async def forever(
    api: Api,
    path: str,
    *,
    retry_delay: float = 1.0,
    on_break: Callable[[], None] | None = None,
    page_size: int | None = None,
    **query: Any,
) -> AsyncGenerator[tuple[str, errors.Body], None]:
    """List, then watch, forever. Yields ``("SYNC", list_body)`` after every (re)list,
    then ``(event_type, object)`` for ADDED/MODIFIED/DELETED. Survives API restarts.
    ``on_break`` is called each time the watch breaks, before the relist: until the next
    ``SYNC``, events may have been missed.

    With ``page_size``, each (re)list comes in pages of that many objects (``limit`` and
    ``continue``), so that one page at a time is in memory, however many objects there
    are: ``("PAGE", page)`` for each, then ``("SYNC", ...)`` with no items. A list that
    fails half way (an expired ``continue``, the API server gone) starts again after
    ``on_break``."""
    while True:
        listing: errors.Body = {}
        try:
            async for page in pages(api, path, page_size, **query):
                if page_size is None:
                    listing = page
                else:
                    listing = {"metadata": page.get("metadata", {}), "items": []}
                    yield "PAGE", page
        except (errors.ApiError, OSError) as exc:
            if page_size is not None and on_break is not None:
                on_break()
            log.warning("list %s failed, retrying: %s", path, exc)
            await asyncio.sleep(retry_delay)
            continue
        yield "SYNC", listing
        rv = listing.get("metadata", {}).get("resourceVersion", "")
        while True:
            try:
                async for event in once(api, path, rv, **query):
                    kind = str(event.get("type", ""))
                    obj = event.get("object", {})
                    if kind == "ERROR":
                        raise errors.ApiError("WATCH", path, int(obj.get("code", 500)), obj)
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if kind != "BOOKMARK":
                        yield kind, obj
            except errors.ApiError as exc:
                if on_break is not None:
                    on_break()
                if exc.status == 410:
                    log.debug("watch %s expired, relisting", path)
                else:
                    log.warning("watch %s failed, relisting: %s", path, exc)
                    await asyncio.sleep(retry_delay)
                break
            except (OSError, ValueError) as exc:
                if on_break is not None:
                    on_break()
                log.warning("watch %s interrupted, relisting: %s", path, exc)
                await asyncio.sleep(retry_delay)
                break


async def pages(
    api: Api, path: str, page_size: int | None, **query: Any
) -> AsyncIterator[errors.Body]:
    """A list, whole (``page_size`` None) or page by page; the last page's metadata has
    the list's resourceVersion."""
    more = ""
    while True:
        paging: dict[str, Any] = {} if page_size is None else {"limit": page_size}
        if more:
            paging["continue"] = more
        page = await api.get(path, **query, **paging)
        yield page
        more = str(page.get("metadata", {}).get("continue") or "")
        if page_size is None or not more:
            return

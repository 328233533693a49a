"""List, then watch: the one loop every long-running component follows the API server with.

Owns: ``once`` (one watch request from a resourceVersion, its events as they stream in),
``forever`` (list, then watch, again and again; it never returns) and the paging of a list
(``limit`` and ``continue``), so that one page at a time is in memory. ``Kube.watch_once`` and
``Kube.watch_forever`` are these, on the client.

``forever`` under pressure, as client-go's reflector does it (``tools/cache/reflector.go``:
``Reflector.watch``, ``handleWatch``, ``isWatchErrorRetriable``, ``defaultMinWatchTimeout``
and the ``defaultBackoff*`` values) and as DESIGN.md's fleet rules ask:

- Each watch asks the server to end it after a random ``timeoutSeconds`` in [5, 10) minutes
  (``random_timeout``: the reflector's ``minWatchTimeout * (1 + rand)``), so that the watches
  of a fleet started together neither end nor come back together. A watch the server ends so
  is sent again at once, from its last resourceVersion (bookmarks keep that recent).
- A watch that breaks (its request answered 429 or 5xx, an ERROR event other than 410, the
  stream cut in the middle, the connection refused or timed out, or a watch that ended within
  a second without a single event: the reflector's "very short watch") is sent again **from
  its last resourceVersion**, after a back-off: 0.8 s, doubling up to 30 s, each delay up to
  as long again, reset once no delay was needed for 2 minutes (``BACKOFF``, ``BACKOFF_RESET``:
  the reflector's), and at least what the server asked for (``Retry-After``, or an ERROR
  event's ``details.retryAfterSeconds``). The reflector lists again after some of these (an
  ERROR event other than 429, a very short watch); we do not: a server that still has the
  resourceVersion replays everything after it, and one that no longer has it says 410.
- Only ``410 Gone`` (the request's status, or an ERROR event with code 410: the resourceVersion
  is older than the server keeps) lists again, after the same back-off: a fleet told 410 at
  once (an API server restart) does not list at once.
- A list that fails is tried again after the back-off; a paged one starts over from its first
  page (a ``continue`` token expires with the resourceVersion it holds).
- Below this loop each request already retried what ``retries`` says (a 429 or 5xx with
  ``Retry-After``); what reaches the loop is what those retries did not fix.

``forever(..., watch_list=True)`` lists by a watch-list instead (KEP 3157, served by default
since Kubernetes 1.34: ``sendInitialEvents=true``, ``resourceVersionMatch=NotOlderThan``, no
resourceVersion: the current state as ADDED events, then a bookmark annotated
``k8s.io/initial-events-end``), and sends the watch-list again after every end or break, with
the same back-off, instead of resuming: one request whatever the server still holds, never a
410 then a list. Meant for watches of a few objects (an agent's own node's pods and slices):
their state costs the server no more than the events since, and an API server that restarted
answers a resumed watch 410 once its watch cache is filled (it starts at the current revision),
so a fleet's restart costs each watch one request instead of three. A server that refuses the
parameter (422: the ``WatchList`` gate off) is listed and watched as above from then on.

Must not: build requests or read credentials (``Api``, the client, sends them), or know which
objects are watched.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Final, Protocol

from dra_gpu.kube import backoff, errors, retries, transport

log = logging.getLogger(__name__)

MIN_WATCH_TIMEOUT: Final = 300
"""Seconds: a watch's ``timeoutSeconds`` is drawn from [this, twice this) (client-go's
``defaultMinWatchTimeout``, 5 min)."""
BACKOFF: Final = backoff.Backoff(duration=0.8, factor=2.0, jitter=1.0, cap=30.0)
"""Between a broken watch (or a failed list) and the next try: client-go's reflector's."""
BACKOFF_RESET: Final = 120.0
"""Seconds without a delay after which the back-off starts again from its first delay."""
SHORT_WATCH: Final = 1.0
"""A watch that ends within this many seconds without an event broke (client-go's)."""
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
"""The annotation of the bookmark that ends a watch-list's initial events."""


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


def random_timeout(timing: backoff.Timing = backoff.REAL) -> int:
    """A watch's ``timeoutSeconds``, random in [5, 10) minutes, as the reflector draws it."""
    return int(MIN_WATCH_TIMEOUT * (1.0 + timing.random()))


async def once(
    api: Api,
    path: str,
    resource_version: str,
    *,
    timeout_seconds: int,
    on_open: Callable[[], None] | None = None,
    **query: Any,
) -> AsyncGenerator[errors.Body, None]:
    """One watch request from ``resource_version``; yields raw watch events. ``on_open`` is
    called once the server accepted it (its answer's head came, 200)."""
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
        if on_open is not None:
            on_open()
        async for line in response.lines():
            if line.strip():
                yield json.loads(line)
    finally:
        response.release()


async def forever(
    api: Api,
    path: str,
    *,
    policy: backoff.Backoff = BACKOFF,
    timing: backoff.Timing = backoff.REAL,
    on_break: Callable[[], None] | None = None,
    on_resume: Callable[[], None] | None = None,
    page_size: int | None = None,
    watch_list: bool = False,
    **query: Any,
) -> AsyncGenerator[tuple[str, errors.Body], None]:
    """List, then watch, forever. Yields ``("SYNC", list_body)`` after every (re)list, then
    ``(event_type, object)`` for ADDED/MODIFIED/DELETED. Survives API restarts: see the module.

    ``on_break`` is called each time the watch breaks: from then on events may come late, and
    when a relist follows (410), some were missed until its ``SYNC``. ``on_resume`` is called
    when a watch sent again after a break is answered: the server took the resourceVersion,
    nothing was missed, and the events of the gap follow in order.

    With ``page_size``, each (re)list comes in pages of that many objects (``limit`` and
    ``continue``), so that one page at a time is in memory, however many objects there
    are: ``("PAGE", page)`` for each, then ``("SYNC", ...)`` with no items. A list that
    fails half way (an expired ``continue``, the API server gone) starts again after
    ``on_break``.

    With ``watch_list``, every (re)list is a watch-list, sent again after every end or break
    (see the module): the same ``PAGE``/``SYNC`` items, ``on_resume`` never called."""
    delays = policy.delays(timing, reset_after=BACKOFF_RESET)
    if watch_list:
        listed = _watch_lists(api, path, page_size, delays, timing, on_break, query)
        async with contextlib.aclosing(listed) as items:
            async for item in items:
                yield item
        log.info("%s: the server refuses watch-lists; listing and watching instead", path)
    while True:
        listing: errors.Body = {}
        try:
            async for page in pages(api, path, page_size, **query):
                if page_size is None:
                    listing = page
                else:
                    listing = {"metadata": page.get("metadata", {}), "items": []}
                    yield "PAGE", page
        except (errors.ApiError, OSError, ValueError) as exc:
            if page_size is not None and on_break is not None:
                on_break()
            delay = max(delays.next(), _asked(exc))
            log.warning("list %s failed (%s); listing again in %.1f s", path, _words(exc), delay)
            await timing.sleep(delay)
            continue
        yield "SYNC", listing
        rv = str(listing.get("metadata", {}).get("resourceVersion", ""))
        watching = _watch_from(api, path, rv, delays, timing, on_break, on_resume, query)
        async with contextlib.aclosing(watching) as events:
            async for item in events:
                yield item
        delay = delays.next()  # 410: what we had is gone; list again, backing off
        log.info("watch %s: resourceVersion gone (410); listing again in %.1f s", path, delay)
        await timing.sleep(delay)


async def _watch_from(
    api: Api,
    path: str,
    rv: str,
    delays: backoff.Delays,
    timing: backoff.Timing,
    on_break: Callable[[], None] | None,
    on_resume: Callable[[], None] | None,
    query: Mapping[str, Any],
) -> AsyncGenerator[tuple[str, errors.Body], None]:
    """Watch from ``rv``, again and again, each time from the last resourceVersion seen, until
    the server says 410 (then it returns)."""
    broken = False

    def opened() -> None:
        nonlocal broken
        if broken:
            broken = False
            if on_resume is not None:
                on_resume()

    while True:
        started, seen = timing.clock(), 0
        timeout = random_timeout(timing)
        try:
            watching = once(api, path, rv, timeout_seconds=timeout, on_open=opened, **query)
            async with contextlib.aclosing(watching) as events:
                async for event in events:
                    seen += 1
                    kind, obj = str(event.get("type", "")), event.get("object") or {}
                    if kind == "ERROR":
                        raise _event_error(path, obj)
                    rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                    if kind != "BOOKMARK":
                        yield kind, obj
            if seen or timing.clock() - started >= SHORT_WATCH:
                continue  # the server's timeoutSeconds: watch on, from rv
            why, asked = "it ended within a second without an event", 0.0
        except errors.ApiError as exc:
            if exc.status == 410:
                if on_break is not None:
                    on_break()
                return
            why, asked = _words(exc), _asked(exc)
        except (OSError, ValueError) as exc:
            why, asked = _words(exc), 0.0
        broken = True
        again = f"watching again from resourceVersion {rv}"
        await _after_break(f"watch {path}", why, again, asked, delays, timing, on_break)


async def _watch_lists(
    api: Api,
    path: str,
    page_size: int | None,
    delays: backoff.Delays,
    timing: backoff.Timing,
    on_break: Callable[[], None] | None,
    query: Mapping[str, Any],
) -> AsyncGenerator[tuple[str, errors.Body], None]:
    """Watch-lists, one after the other (after a back-off where one broke), each yielding the
    state (``PAGE``s, ``SYNC``) and then its events; returns when the server refuses them."""
    while True:
        started, synced = timing.clock(), False
        initial: list[errors.Body] = []
        try:
            watching = once(
                api,
                path,
                "",
                timeout_seconds=random_timeout(timing),
                sendInitialEvents="true",
                resourceVersionMatch="NotOlderThan",
                **query,
            )
            async with contextlib.aclosing(watching) as events:
                async for event in events:
                    kind, obj = str(event.get("type", "")), event.get("object") or {}
                    if kind == "ERROR":
                        raise _event_error(path, obj)
                    if synced:
                        if kind != "BOOKMARK":
                            yield kind, obj
                    elif kind == "BOOKMARK" and _ends_initial_events(obj):
                        synced = True
                        at = {"resourceVersion": obj.get("metadata", {}).get("resourceVersion")}
                        if page_size is not None and initial:
                            yield "PAGE", {"metadata": {}, "items": initial}
                            initial = []
                        yield "SYNC", {"metadata": at, "items": initial}
                        initial = []
                    elif kind == "ADDED":
                        initial.append(obj)
                        if page_size is not None and len(initial) >= page_size:
                            yield "PAGE", {"metadata": {}, "items": initial}
                            initial = []
            if synced and timing.clock() - started >= SHORT_WATCH:
                continue  # the server's timeoutSeconds: the state again, and on
            why = "it ended within a second" if synced else "it ended before its state was sent"
            asked = 0.0
        except errors.ApiError as exc:
            if exc.status == 422 and "sendInitialEvents" in str(exc):
                return
            why, asked = _words(exc), _asked(exc)
        except (OSError, ValueError) as exc:
            why, asked = _words(exc), 0.0
        await _after_break(f"watch-list {path}", why, "sent again", asked, delays, timing, on_break)


async def _after_break(
    what: str,
    why: str,
    again: str,
    asked: float,
    delays: backoff.Delays,
    timing: backoff.Timing,
    on_break: Callable[[], None] | None,
) -> None:
    """A watch (or watch-list) broke: ``on_break`` is told, and the back-off waited, at least
    what the server asked for."""
    if on_break is not None:
        on_break()
    delay = max(delays.next(), asked)
    log.warning("%s broke (%s); %s in %.1f s", what, why, again, delay)
    await timing.sleep(delay)


def _ends_initial_events(bookmark: errors.Body) -> bool:
    annotations = bookmark.get("metadata", {}).get("annotations") or {}
    return bool(annotations.get(INITIAL_EVENTS_END) == "true")


def _event_error(path: str, status: errors.Body) -> errors.ApiError:
    """An ERROR event's Status as the ``ApiError`` it stands for."""
    code = status.get("code", 500)
    return errors.ApiError(
        "WATCH",
        path,
        code if isinstance(code, int) else 500,
        status,
        retry_after=retries.status_retry_after(status),
    )


def _asked(exc: BaseException) -> float:
    """The seconds the server asked to wait, if it did."""
    return (exc.retry_after or 0.0) if isinstance(exc, errors.ApiError) else 0.0


def _words(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, errors.ApiError) else errors.words(exc)


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

"""``Kube``: JSON requests against one API server, and how a component reaches it.

The DRA objects we read and write are easier to follow as the API's own JSON than as generated
model classes, so the client speaks plain dicts (``Body``), over ``transport`` (h11 on asyncio
streams: the node agent loads neither aiohttp nor kubernetes-asyncio, about 15 MiB less on
every node).

Owns: ``Kube`` and its verbs (``request``, ``get``, ``create``, ``replace``, ``patch``,
``delete``; ``send`` for an answer read by its caller), its ``Authorization`` header on every
request, telling a component's ``RequestObserver`` of every request (its verb, the answer's
status code, how long it took: the component's metrics), and reaching the server: ``probe``
and ``wait_until_ready`` (how a long-running component starts before its API server does),
with ``unreachable`` and ``refused`` saying in words why it does not answer or rejects us (a
401 is sent once more when refreshing the credentials changed them). ``Kube.watch_once`` and
``Kube.watch_forever`` are ``watch``'s loop on this client.

Must not: find or read credentials (``Kube.connect`` takes them from ``kubeconfig``) or parse a
kubeconfig (``auth``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, Unpack
from urllib.parse import urlencode

import dra_gpu
from dra_gpu.kube import errors, tokens, transport, watch

# ``connect``'s parameter is named ``kubeconfig``: the function, not the module.
from dra_gpu.kube.kubeconfig import load_config

log = logging.getLogger(__name__)

PatchType = Literal["merge", "strategic", "json", "apply"]
_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


class RequestOptions(TypedDict, total=False):
    """What a request may carry besides its method and path."""

    body: Any
    query: Mapping[str, Any] | None
    content_type: str


NO_ANSWER = "<error>"
"""The ``code`` a ``RequestObserver`` gets for a request that got no answer (client-go's)."""


class RequestObserver(Protocol):
    """Told of every request ``Kube`` sends, once its answer's status line is in (a watch: once
    it starts streaming) or it failed without one. ``verb``: the HTTP method, ``WATCH`` for a
    watch; ``code``: the status code (``"200"``), or ``NO_ANSWER``; ``seconds``: from sending
    to then. A component passes its metrics (``kube/`` knows nothing of them)."""

    def __call__(self, verb: str, code: str, seconds: float) -> None: ...


RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0)
"""``wait_until_ready``'s back-off: the last delay repeats."""
REQUEST_TIMEOUT = transport.Timeout(connect=None, total=30.0)
"""A plain request: 30 s for all of it, connecting included."""


class Kube:
    """JSON requests against one API server. Use as ``async with await Kube.connect(...)``."""

    def __init__(
        self,
        http: transport.Client,
        authorization: tokens.Authorization | None = None,
        origin: str = "",
        namespace: str = "default",
        proxy_source: str = "",
        observer: RequestObserver | None = None,
    ) -> None:
        self.http = http
        self.observer = observer
        """Told of every request (``RequestObserver``), when given."""
        self.authorization: tokens.Authorization = authorization or tokens.Static(None)
        self.origin = origin or "client configuration"
        """Where the server and credentials came from: ``kubeconfig FILE, context NAME``."""
        self.namespace = namespace
        """The context's namespace (in a pod, its own), else ``default``: what kubectl's
        ``-n`` defaults to."""
        self.proxy_source = proxy_source
        """Where ``http``'s proxy came from (``HTTPS_PROXY``), for messages."""

    @classmethod
    async def connect(
        cls,
        kubeconfig: Path | str | None = None,
        *,
        source: str | None = None,
        flag: str = "--kubeconfig",
        context: str | None = None,
        observer: RequestObserver | None = None,
    ) -> Kube:
        """From ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster service account (in a
        pod), else ``~/.kube/config``; its ``context`` (kubectl's ``--context``), else its
        current context. ``source`` says where ``kubeconfig`` came from and ``flag`` how to
        pass one (``"--kubeconfig, DRA_GPU_KUBECONFIG"``), both for the messages. Through the
        cluster's ``proxy-url``, else ``HTTPS_PROXY`` unless ``NO_PROXY`` says otherwise, as
        kubectl; ``observer`` is told of every request. Raises ``ConfigError``; sends
        nothing."""
        loaded = await load_config(kubeconfig, source=source or flag, flag=flag, context=context)
        http = transport.Client(
            loaded.credentials.server,
            ssl_context=loaded.ssl_context,
            server_hostname=loaded.credentials.tls_server_name,
            user_agent=f"dra-gpu/{dra_gpu.__version__}",
            proxy=loaded.proxy.url if loaded.proxy else None,
        )
        return cls(
            http,
            loaded.authorization,
            loaded.credentials.origin,
            loaded.namespace,
            loaded.proxy.source if loaded.proxy else "",
            observer,
        )

    @property
    def server(self) -> str:
        return self.http.url

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- plain requests ------------------------------------------------------------------

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeouts: transport.Timeout = REQUEST_TIMEOUT,
    ) -> transport.Response:
        """One request; its answer, for the caller to read and release (a watch streams it),
        or ``ApiError`` for a non-2xx status. A 401 refreshes the credentials (an ``exec``
        plugin runs again, a token file is read again) and, when that changed them, the
        request is sent once more: the server rejected it before doing anything. The observer,
        if any, is told of every request sent, answered or not."""
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        target = f"{path}?{urlencode(params)}" if params else path
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        retried = False
        while True:
            headers = [("Accept", "application/json"), ("Content-Type", content_type)]
            if (authorization := await self.authorization()) is not None:
                headers.append(("Authorization", authorization))
            started = time.monotonic()
            try:
                response = await self.http.request(
                    method, target, headers=headers, body=data, timeouts=timeouts
                )
            except Exception:
                self._observe(method, query, NO_ANSWER, started)
                raise
            self._observe(method, query, str(response.status), started)
            if 200 <= response.status <= 299:
                return response
            try:
                text = (await response.read()).decode("utf-8", "replace")
            finally:
                response.release()
            if response.status == 401 and not retried:
                retried = True
                if await self.authorization.refresh(authorization):
                    log.info(
                        "%s %s: 401 Unauthorized; sent again with fresh credentials", method, path
                    )
                    continue
            try:
                decoded: errors.Body | str = json.loads(text)
            except ValueError:
                decoded = text
            raise errors.ApiError(method, path, response.status, decoded)

    def _observe(
        self, method: str, query: Mapping[str, Any] | None, code: str, started: float
    ) -> None:
        if self.observer is not None:
            self.observer(verb_of(method, query), code, time.monotonic() - started)

    async def request(
        self, method: str, path: str, **options: Unpack[RequestOptions]
    ) -> errors.Body:
        """One request; its JSON answer, or ``ApiError``."""
        response = await self.send(method, path, **options)
        try:
            data = await response.read()
        finally:
            response.release()
        result: errors.Body = json.loads(data.strip() or b"null")  # an empty answer: None
        return result

    async def get(self, path: str, **query: Any) -> errors.Body:
        return await self.request("GET", path, query=query)

    async def create(self, path: str, body: errors.Body, **query: Any) -> errors.Body:
        return await self.request("POST", path, body=body, query=query)

    async def replace(self, path: str, body: errors.Body) -> errors.Body:
        return await self.request("PUT", path, body=body)

    async def patch(
        self, path: str, body: Any, patch_type: PatchType = "merge", **query: Any
    ) -> errors.Body:
        return await self.request(
            "PATCH", path, body=body, query=query, content_type=_PATCH_CONTENT_TYPES[patch_type]
        )

    async def delete(
        self,
        path: str,
        *,
        grace_period_seconds: int | None = None,
        missing_ok: bool = True,
        uid: str | None = None,
    ) -> errors.Body | None:
        body: errors.Body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", path, body=body)
        except errors.ApiError as exc:
            if missing_ok and exc.not_found:
                return None
            raise

    # ---- reaching the server --------------------------------------------------------------

    async def probe(self, answer_within: float = 10.0) -> None:
        """One ``GET /readyz``. Returns when the API server is ready to serve; raises
        ``Unreachable`` (no answer, TLS failure, timeout, not ready) or ``Refused`` (401)."""
        try:
            response = await self.send(
                "GET", "/readyz", timeouts=transport.Timeout(connect=None, total=answer_within)
            )
            response.release()
        except errors.ApiError as exc:
            if exc.status == 403:
                return  # it knows who we are; /readyz is just not ours to read
            if exc.status == 401:
                raise self.refused(exc) from exc
            raise errors.Unreachable(self.server, self.origin, _not_ready(exc)) from exc
        except errors.CONNECTION_ERRORS as exc:
            raise self.unreachable(exc, answer_within) from exc

    async def wait_until_ready(
        self,
        stopping: asyncio.Event,
        *,
        delays: Sequence[float] = RETRY_DELAYS,
        on_attempt: Callable[[str], None] = lambda reason: None,
    ) -> bool:
        """Probe until the API server answers, backing off along ``delays``; one warning per
        failed attempt, with the address and the reason, which ``on_attempt`` also gets (for
        a readiness probe). False when ``stopping`` is set first. ``Refused`` is raised:
        waiting does not fix auth."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.probe()
            except errors.Unreachable as exc:
                delay = delays[min(attempt, len(delays)) - 1]
                log.warning("%s; attempt %d, next in %g s", exc, attempt, delay)
                on_attempt(str(exc))
            else:
                if attempt > 1:
                    log.info("the API server at %s answers (attempt %d)", self.server, attempt)
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
                return False

    def unreachable(self, exc: BaseException, timeout: float | None = None) -> errors.Unreachable:
        """The ``Unreachable`` for a request that got no answer, in words."""
        reason = _no_answer(exc, timeout, self.http.origin.host)
        if self.http.proxy is not None and not isinstance(exc, transport.ProxyError):
            via = f" ({self.proxy_source})" if self.proxy_source else ""
            reason += f" (through the proxy {self.http.proxy}{via})"
        return errors.Unreachable(self.server, self.origin, reason)

    def refused(self, exc: errors.ApiError, needs: str = "") -> errors.Refused:
        """The ``Refused`` for a 401 or 403, saying whose credentials and what to do;
        ``needs`` says what the caller must be allowed to do (for a 403)."""
        if exc.status == 401:
            return errors.Refused(
                f"the API server at {self.server} rejected the credentials of {self.origin} "
                "(401 Unauthorized): the token or client certificate is wrong or expired; "
                "fix the user of that context, or use another kubeconfig",
                401,
            )
        message = exc.body.get("message", "") if isinstance(exc.body, dict) else ""
        message = message or f"{exc.method} {exc.path} is forbidden"
        return errors.Refused(
            f"the API server at {self.server} refused the user of {self.origin} "
            f"(403 Forbidden): {message}{'; ' + needs if needs else ''}: ask for that "
            "permission, or use another kubeconfig",
            exc.status,
        )

    # ---- watching ------------------------------------------------------------------------

    def watch_once(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300, **query: Any
    ) -> AsyncGenerator[errors.Body, None]:
        """One watch request from ``resource_version``; yields raw watch events
        (``watch.once``)."""
        return watch.once(self, path, resource_version, timeout_seconds=timeout_seconds, **query)

    def watch_forever(
        self,
        path: str,
        *,
        retry_delay: float = 1.0,
        on_break: Callable[[], None] | None = None,
        page_size: int | None = None,
        **query: Any,
    ) -> AsyncGenerator[tuple[str, errors.Body], None]:
        """List, then watch, forever: ``("SYNC", list_body)`` after every (re)list, then
        ``(event_type, object)``; with ``page_size``, ``("PAGE", page)`` first for each page.
        ``on_break`` is called each time the watch breaks. See ``watch.forever``."""
        return watch.forever(
            self, path, retry_delay=retry_delay, on_break=on_break, page_size=page_size, **query
        )


def verb_of(method: str, query: Mapping[str, Any] | None = None) -> str:
    """The ``verb`` a ``RequestObserver`` is told: the method, ``WATCH`` for a ``GET`` with
    ``watch=true`` (so watches, which stream for minutes, do not count as GETs)."""
    method = method.upper()
    if method == "GET" and _query_value((query or {}).get("watch", False)) == "true":
        return "WATCH"
    return method


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _no_answer(exc: BaseException, timeout: float | None, host: str = "") -> str:
    """Why a request got no answer, as a person would say it."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its TLS certificate is not trusted ({errors.words(exc)}): check the "
            "cluster's certificate-authority in the kubeconfig"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {errors.words(exc)}"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s" if timeout else "no answer in time"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host}: {exc.strerror}"
    if isinstance(exc, transport.ConnectionClosed):
        return "it closed the connection"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    return errors.words(exc)


def _not_ready(exc: errors.ApiError) -> str:
    """A ``/readyz`` answer other than 200: the status and the checks that failed."""
    body = exc.body if isinstance(exc.body, str) else json.dumps(exc.body)
    if exc.status < 500 and exc.status != 429:  # an API server says 200, 401, 403, 429 or 5xx
        return f"it answered {exc.status} to GET /readyz, which no Kubernetes API server does"
    failed = [line[3:].strip() for line in body.splitlines() if line.startswith("[-]")]
    detail = ", ".join(failed) if failed else " ".join(body.split())[:200]
    return f"it answered {exc.status} (not ready){': ' + detail if detail else ''}"

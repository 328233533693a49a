"""``Kube``: JSON requests against one API server, and how a component reaches it.

The DRA objects we read and write are easier to follow as the API's own JSON than as generated
model classes, so the client speaks plain dicts (``Body``), over ``transport`` (h11 on asyncio
streams: the node agent loads neither aiohttp nor kubernetes-asyncio, about 15 MiB less on
every node).

Owns: ``Kube`` and its verbs (``request``, ``get``, ``create``, ``replace``, ``patch``,
``delete``; ``send`` for an answer read by its caller; ``pages`` for a list, a page at a time),
its ``Authorization`` header on every request, telling a component's ``RequestObserver`` of
every request (its verb, the answer's status code, how long it took: the component's metrics),
and reaching the server: ``probe`` and ``wait_until_ready`` (how a long-running component
starts before its API server does), with ``unreachable`` and ``refused`` saying in words why it
does not answer or rejects us (a 401 is sent once more when refreshing the credentials changed
them). ``Kube.watch_once`` and ``Kube.watch_forever`` are ``watch``'s loop on this client.

Under pressure it behaves as client-go's ``rest.Request`` does: every request but a watch
first waits for the process's client-side rate limit (``throttling.TokenBucket``, ``qps`` and
``burst`` of ``connect``: client-go's ``rest.Config.QPS``/``Burst``), and a request answered
429 or 5xx with ``Retry-After``, or a read that got no answer, is sent again as ``retries``
says (client-go's ``WithRetry``, at most 10 times), each retry waiting for the rate limit too.
Time, sleeps and jitter come from ``timing`` (``backoff.Timing``), so tests never wait.

Must not: find or read credentials (``Kube.connect`` takes them from ``kubeconfig``) or parse a
kubeconfig (``auth``); decide which failures are retried (``retries``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, Unpack
from urllib.parse import urlencode

import dra_gpu
from dra_gpu.kube import backoff, errors, retries, throttling, tokens, transport, watch

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


READY_BACKOFF = backoff.Backoff(duration=1.0, factor=2.0, jitter=0.5, cap=15.0)
"""``wait_until_ready``'s back-off: 1 s, doubling up to 15 s, each delay up to half as long
again (so that the replicas of a Deployment, all started at once, do not probe in step)."""
LIST_PAGE = 500
"""Objects per page of ``pages`` (kubectl pages by 500 too)."""
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
        *,
        limiter: throttling.TokenBucket | None = None,
        timing: backoff.Timing = backoff.REAL,
    ) -> None:
        self.http = http
        self.observer = observer
        """Told of every request (``RequestObserver``), when given."""
        self.limiter = limiter
        """The client-side rate limit every request but a watch waits for; None: no limit."""
        self.timing = timing
        """The clock, sleep and jitter of the retries, the rate limit and the watch loop."""
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
        qps: float = 0.0,
        burst: int = 0,
    ) -> Kube:
        """From ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster service account (in a
        pod), else ``~/.kube/config``; its ``context`` (kubectl's ``--context``), else its
        current context. ``source`` says where ``kubeconfig`` came from and ``flag`` how to
        pass one (``"--kubeconfig, DRA_GPU_KUBECONFIG"``), both for the messages. Through the
        cluster's ``proxy-url``, else ``HTTPS_PROXY`` unless ``NO_PROXY`` says otherwise, as
        kubectl; ``observer`` is told of every request. With ``qps`` above 0, at most that
        many requests a second after a first ``burst`` (``throttling.TokenBucket``); 0: no
        client-side limit. Raises ``ConfigError``; sends nothing."""
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
            limiter=throttling.TokenBucket(qps, max(burst, 1)) if qps > 0 else None,
        )

    def limited(self, qps: float, burst: int, flags: str) -> Kube:
        """This client with a rate limit of its own (``qps`` 0: none; ``flags`` set it, for the
        log): the same connections, credentials and observer, as client-go's second clientset
        from one rest config (the one kube-scheduler keeps for its Events). Closing the
        original closes both."""
        limiter = (
            throttling.TokenBucket(qps, max(burst, 1), self.timing, flags) if qps > 0 else None
        )
        return Kube(
            self.http,
            self.authorization,
            self.origin,
            self.namespace,
            self.proxy_source,
            self.observer,
            limiter=limiter,
            timing=self.timing,
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
        max_retries: int = retries.MAX_RETRIES,
    ) -> transport.Response:
        """One request; its answer, for the caller to read and release (a watch streams it),
        or ``ApiError`` for a non-2xx status. A 401 refreshes the credentials (an ``exec``
        plugin runs again, a token file is read again) and, when that changed them, the
        request is sent once more: the server rejected it before doing anything. A 429 or 5xx
        with ``Retry-After``, or a read without an answer, is sent again after the wait
        ``retries`` says, at most ``max_retries`` times (0: never). Every try but a watch's waits
        for the rate limit first. The observer, if any, is told of every try, answered or
        not."""
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        target = f"{path}?{urlencode(params)}" if params else path
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        verb = verb_of(method, query)
        refreshed = False
        tries = 0
        while True:
            if self.limiter is not None and verb != "WATCH":
                await self.limiter.wait()
            tries += 1
            try:
                response, authorization = await self._try(
                    method, target, data, content_type, verb, timeouts
                )
            except Exception as exc:
                wait = retries.after_error(verb, exc)
                if wait is None or tries > max_retries:
                    raise
                await self._pause(method, path, wait, tries, errors.words(exc))
                continue
            if 200 <= response.status <= 299:
                return response
            failure = await _failure(method, path, response)
            if failure.status == 401 and not refreshed:
                refreshed = True
                if await self.authorization.refresh(authorization):
                    log.info(
                        "%s %s: 401 Unauthorized; sent again with fresh credentials", method, path
                    )
                    continue
            wait = failure.retry_after
            if wait is None or wait > retries.MAX_RETRY_AFTER or tries > max_retries:
                raise failure
            await self._pause(method, path, wait, tries, f"{failure.status} {failure.reason}")

    async def _try(
        self,
        method: str,
        target: str,
        data: bytes | None,
        content_type: str,
        verb: str,
        timeouts: transport.Timeout,
    ) -> tuple[transport.Response, str | None]:
        """One try: its answer's head, and the ``Authorization`` it was sent with."""
        headers = [("Accept", "application/json"), ("Content-Type", content_type)]
        if (authorization := await self.authorization()) is not None:
            headers.append(("Authorization", authorization))
        started = time.monotonic()
        try:
            response = await self.http.request(
                method, target, headers=headers, body=data, timeouts=timeouts
            )
        except Exception:
            self._observe(verb, NO_ANSWER, started)
            raise
        self._observe(verb, str(response.status), started)
        return response, authorization

    async def _pause(self, method: str, path: str, wait: float, tries: int, why: str) -> None:
        """Before sending a request again: say so, and wait as the server asked."""
        log.info("%s %s: %s; sending it again in %g s (retry %d)", method, path, why, wait, tries)
        await self.timing.sleep(wait)

    def _observe(self, verb: str, code: str, started: float) -> None:
        if self.observer is not None:
            self.observer(verb, code, time.monotonic() - started)

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

    def pages(
        self, path: str, *, page_size: int = LIST_PAGE, **query: Any
    ) -> AsyncIterator[errors.Body]:
        """A list, ``page_size`` objects a page (``limit`` and ``continue``), each page its own
        request with its own timeout: one page at a time is in memory, however long the list
        (``watch.pages``)."""
        return watch.pages(self, path, page_size, **query)

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
                "GET",
                "/readyz",
                timeouts=transport.Timeout(connect=None, total=answer_within),
                max_retries=0,  # wait_until_ready tries again, backing off
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
        policy: backoff.Backoff = READY_BACKOFF,
        on_attempt: Callable[[str], None] = lambda reason: None,
    ) -> bool:
        """Probe until the API server answers, backing off as ``policy`` says (at least as
        long as a ``Retry-After`` asks); one warning per failed attempt, with the address and
        the reason, which ``on_attempt`` also gets (for a readiness probe). False when
        ``stopping`` is set first. ``Refused`` is raised: waiting does not fix auth."""
        delays = policy.delays(self.timing)
        while True:
            try:
                await self.probe()
            except errors.Unreachable as exc:
                cause = exc.__cause__
                asked = cause.retry_after if isinstance(cause, errors.ApiError) else None
                delay = delays.next()
                if asked is not None and asked > delay:
                    delay, when = asked, f"{asked:g} s (its Retry-After)"
                else:
                    when = f"{delays.base:g} s (+{delay - delays.base:.1f} s jitter)"
                log.warning("%s; attempt %d, next in %s", exc, delays.taken, when)
                on_attempt(str(exc))
            else:
                if delays.taken:
                    log.info(
                        "the API server at %s answers (attempt %d)", self.server, delays.taken + 1
                    )
                return True
            if await _stopped_within(stopping, self.timing.sleep(delay)):
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
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int | None = None,
        **query: Any,
    ) -> AsyncGenerator[errors.Body, None]:
        """One watch request from ``resource_version``; yields raw watch events
        (``watch.once``; without ``timeout_seconds``, a random one as client-go draws it)."""
        return watch.once(
            self,
            path,
            resource_version,
            timeout_seconds=timeout_seconds or watch.random_timeout(self.timing),
            **query,
        )

    def watch_forever(
        self,
        path: str,
        *,
        policy: backoff.Backoff = watch.BACKOFF,
        on_break: Callable[[], None] | None = None,
        on_resume: Callable[[], None] | None = None,
        page_size: int | None = None,
        watch_list: bool = False,
        **query: Any,
    ) -> AsyncGenerator[tuple[str, errors.Body], None]:
        """List, then watch, forever: ``("SYNC", list_body)`` after every (re)list, then
        ``(event_type, object)``; with ``page_size``, ``("PAGE", page)`` first for each page.
        A broken watch is watched again from its last resourceVersion, after a back-off
        (``policy``); only a 410 Gone lists again. ``on_break`` is called each time the watch
        breaks, ``on_resume`` when one watched again after a break is answered. With
        ``watch_list``, each list is a watch-list, sent again after every break instead
        (for a few objects: one node's). See ``watch.forever``."""
        return watch.forever(
            self,
            path,
            policy=policy,
            timing=self.timing,
            on_break=on_break,
            on_resume=on_resume,
            page_size=page_size,
            watch_list=watch_list,
            **query,
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


async def _stopped_within(stopping: asyncio.Event, pause: Awaitable[None]) -> bool:
    """Whether ``stopping`` is set before ``pause`` is over (which is then cut short)."""
    stop, nap = asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(pause)
    try:
        await asyncio.wait({stop, nap}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        nap.cancel()
    return stopping.is_set()


async def _failure(method: str, path: str, response: transport.Response) -> errors.ApiError:
    """The ``ApiError`` of a non-2xx answer (read whole, its connection released), with the
    wait its ``Retry-After`` asks for when a retry may follow one (``retries.after_answer``)."""
    try:
        text = (await response.read()).decode("utf-8", "replace")
    finally:
        response.release()
    try:
        decoded: errors.Body | str = json.loads(text)
    except ValueError:
        decoded = text
    wait = retries.after_answer(response.status, response.header("Retry-After"))
    return errors.ApiError(method, path, response.status, decoded, retry_after=wait)


def _not_ready(exc: errors.ApiError) -> str:
    """A ``/readyz`` answer other than 200: the status and the checks that failed."""
    body = exc.body if isinstance(exc.body, str) else json.dumps(exc.body)
    if exc.status < 500 and exc.status != 429:  # an API server says 200, 401, 403, 429 or 5xx
        return f"it answered {exc.status} to GET /readyz, which no Kubernetes API server does"
    failed = [line[3:].strip() for line in body.splitlines() if line.startswith("[-]")]
    detail = ", ".join(failed) if failed else " ".join(body.split())[:200]
    return f"it answered {exc.status} (not ready){': ' + detail if detail else ''}"

"""A thin JSON client for the Kubernetes API on top of kubernetes-asyncio's transport.

kubernetes-asyncio loads kubeconfigs and in-cluster credentials and owns the HTTP session; this
module speaks plain dicts over it, because the DRA objects we read and write are easier to
follow as the API's own JSON than as generated model classes. ``watch_forever`` is the one list-
then-watch loop that every long-running component uses: it relists after ``410 Gone``, reconnects
after network errors and API server restarts, and never returns.

The edges fail in words, each its own exception: ``ConfigError`` (no usable kubeconfig or
service account: which file, from which flag or variable, how to fix it), ``Unreachable`` (the
API server gives no usable answer: which address, why) and ``Refused`` (it rejects our
credentials or permissions). ``wait_until_ready`` is how a long-running component starts
before its API server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

import aiohttp
import yaml
from kubernetes_asyncio import client, config

log = logging.getLogger(__name__)

Body = dict[str, Any]
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


class ApiError(Exception):
    """The API server answered with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, body: Body | str) -> None:
        self.method, self.path, self.status, self.body = method, path, status, body
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {self.reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class ConfigError(Exception):
    """No usable credentials: the kubeconfig is missing or invalid, or a pod's service account
    token is. The message names the file, where its name came from and the fix; nothing was
    sent to any server."""


class Unreachable(Exception):
    """The API server gave no usable answer: no connection, TLS failure, timeout, not ready."""

    def __init__(self, server: str, origin: str, reason: str) -> None:
        self.server, self.origin, self.reason = server, origin, reason
        super().__init__(f"the API server at {server} ({origin}) does not answer: {reason}")


class Refused(Exception):
    """The API server answered and rejected our credentials (401) or permissions (403)."""

    def __init__(self, message: str, status: int) -> None:
        self.status = status
        super().__init__(message)


CONNECTION_ERRORS = (aiohttp.ClientConnectionError, OSError)
"""What a request raises when no answer came (``TimeoutError`` is an ``OSError``)."""
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0)
"""``wait_until_ready``'s back-off: the last delay repeats."""
IN_CLUSTER = "in-cluster service account"


class Kube:
    """JSON requests against one API server. Use as ``async with await Kube.connect(...)``."""

    def __init__(self, api_client: client.ApiClient, origin: str = "") -> None:
        self.api_client = api_client
        self.origin = origin or "client configuration"
        """Where the server and credentials came from: ``kubeconfig FILE, context NAME``."""

    @classmethod
    async def connect(
        cls,
        kubeconfig: Path | str | None = None,
        *,
        source: str | None = None,
        flag: str = "--kubeconfig",
    ) -> Kube:
        """From ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster service account (in a
        pod), else ``~/.kube/config``. ``source`` says where ``kubeconfig`` came from and
        ``flag`` how to pass one (``"--kubeconfig, DRA_GPU_KUBECONFIG"``), both for the
        messages. Raises ``ConfigError``; sends nothing."""
        cfg = client.Configuration()
        origin = await _load_config(cfg, kubeconfig, source=source or flag, flag=flag)
        return cls(client.ApiClient(cfg), origin)

    @property
    def server(self) -> str:
        return str(self.api_client.configuration.host)

    async def close(self) -> None:
        await self.api_client.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- plain requests ------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        request_timeout: float | aiohttp.ClientTimeout | None = 30.0,
    ) -> aiohttp.ClientResponse:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        response: aiohttp.ClientResponse = await self.api_client.call_api(
            path,
            method,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        if not 200 <= response.status <= 299:
            text = await response.text()
            response.release()
            try:
                decoded: Body | str = json.loads(text)
            except ValueError:
                decoded = text
            raise ApiError(method, path, response.status, decoded)
        return response

    async def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> Body:
        """One request; its JSON answer, or ``ApiError``."""
        response = await self._send(method, path, **options)
        try:
            result: Body = await response.json(content_type=None)
        finally:
            response.release()
        return result

    async def get(self, path: str, **query: Any) -> Body:
        return await self.request("GET", path, query=query)

    async def create(self, path: str, body: Body, **query: Any) -> Body:
        return await self.request("POST", path, body=body, query=query)

    async def replace(self, path: str, body: Body) -> Body:
        return await self.request("PUT", path, body=body)

    async def patch(
        self, path: str, body: Any, patch_type: PatchType = "merge", **query: Any
    ) -> Body:
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
    ) -> Body | None:
        body: Body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", path, body=body)
        except ApiError as exc:
            if missing_ok and exc.not_found:
                return None
            raise

    # ---- reaching the server --------------------------------------------------------------

    async def probe(self, answer_within: float = 10.0) -> None:
        """One ``GET /readyz``. Returns when the API server is ready to serve; raises
        ``Unreachable`` (no answer, TLS failure, timeout, not ready) or ``Refused`` (401)."""
        try:
            response = await self._send("GET", "/readyz", request_timeout=answer_within)
            response.release()
        except ApiError as exc:
            if exc.status == 403:
                return  # it knows who we are; /readyz is just not ours to read
            if exc.status == 401:
                raise self.refused(exc) from exc
            raise Unreachable(self.server, self.origin, _not_ready(exc)) from exc
        except CONNECTION_ERRORS as exc:
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
        waiting does not fix credentials."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.probe()
            except Unreachable as exc:
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

    def unreachable(self, exc: BaseException, timeout: float | None = None) -> Unreachable:
        """The ``Unreachable`` for a request that got no answer, in words."""
        return Unreachable(self.server, self.origin, _no_answer(exc, timeout))

    def refused(self, exc: ApiError, needs: str = "") -> Refused:
        """The ``Refused`` for a 401 or 403, saying whose credentials and what to do;
        ``needs`` says what the caller must be allowed to do (for a 403)."""
        if exc.status == 401:
            return Refused(
                f"the API server at {self.server} rejected the credentials of {self.origin} "
                "(401 Unauthorized): the token or client certificate is wrong or expired; "
                "fix the user of that context, or use another kubeconfig",
                401,
            )
        message = exc.body.get("message", "") if isinstance(exc.body, dict) else ""
        message = message or f"{exc.method} {exc.path} is forbidden"
        return Refused(
            f"the API server at {self.server} refused the user of {self.origin} "
            f"(403 Forbidden): {message}{'; ' + needs if needs else ''}: ask for that "
            "permission, or use another kubeconfig",
            exc.status,
        )

    # ---- watching ------------------------------------------------------------------------

    async def watch_once(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300, **query: Any
    ) -> AsyncIterator[Body]:
        """One watch request from ``resource_version``; yields raw watch events."""
        response = await self._send(
            "GET",
            path,
            query={
                **query,
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout_seconds,
            },
            request_timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=10, sock_read=timeout_seconds + 30
            ),
        )
        try:
            while line := await response.content.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release()

    async def watch_forever(
        self, path: str, *, retry_delay: float = 1.0, **query: Any
    ) -> AsyncIterator[tuple[str, Body]]:
        """List, then watch, forever. Yields ``("SYNC", list_body)`` after every (re)list,
        then ``(event_type, object)`` for ADDED/MODIFIED/DELETED. Survives API restarts."""
        while True:
            try:
                listing = await self.get(path, **query)
            except (TimeoutError, ApiError, aiohttp.ClientError, OSError) as exc:
                log.warning("list %s failed, retrying: %s", path, exc)
                await asyncio.sleep(retry_delay)
                continue
            yield "SYNC", listing
            rv = listing.get("metadata", {}).get("resourceVersion", "")
            while True:
                try:
                    async for event in self.watch_once(path, rv, **query):
                        kind = str(event.get("type", ""))
                        obj = event.get("object", {})
                        if kind == "ERROR":
                            raise ApiError("WATCH", path, int(obj.get("code", 500)), obj)
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            yield kind, obj
                except ApiError as exc:
                    if exc.status == 410:
                        log.debug("watch %s expired, relisting", path)
                    else:
                        log.warning("watch %s failed, relisting: %s", path, exc)
                        await asyncio.sleep(retry_delay)
                    break
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                    log.warning("watch %s interrupted, relisting: %s", path, exc)
                    await asyncio.sleep(retry_delay)
                    break


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---- configuration -----------------------------------------------------------------------------


async def _load_config(
    cfg: client.Configuration, kubeconfig: Path | str | None, *, source: str, flag: str
) -> str:
    """Fill ``cfg``; returns where it came from. Every failure is a ``ConfigError`` in words."""
    found = _kubeconfig_files(kubeconfig, source=source, flag=flag)
    if found is None:
        try:
            # The one function of kubernetes-asyncio's config package left unannotated.
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise ConfigError(
                f"in a pod (KUBERNETES_SERVICE_HOST is set) but its {IN_CLUSTER} is not usable: "
                f"{_words(exc)}: mount the service account token "
                f"(automountServiceAccountToken), or pass a kubeconfig with {flag}"
            ) from None
        return IN_CLUSTER
    paths, source, files = found
    try:
        loader = await config.load_kube_config(
            config_file=os.pathsep.join(map(str, files)), client_configuration=cfg
        )
    except Exception as exc:  # local parsing only: all of it is "this file is not usable"
        text = _words(exc)
        if "current-context" in text:
            raise ConfigError(
                f"kubeconfig {paths} (from {source}) has no current-context: choose one with "
                f"`kubectl config use-context NAME --kubeconfig {files[0]}`"
            ) from None
        raise ConfigError(f"kubeconfig {paths} (from {source}) is not usable: {text}") from None
    context = (loader.current_context or {}).get("name", "")
    return f"kubeconfig {paths}" + (f", context {context}" if context else "")


def _kubeconfig_files(
    kubeconfig: Path | str | None, *, source: str, flag: str
) -> tuple[str, str, list[Path]] | None:
    """``(paths as given, where from, existing files)``, or None for the in-cluster account.
    Checks what kubernetes-asyncio would only warn about, or fail on with a traceback."""
    if kubeconfig:
        paths = str(kubeconfig)
    elif os.environ.get("KUBECONFIG"):
        paths, source = os.environ["KUBECONFIG"], "KUBECONFIG"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    elif (default := Path("~/.kube/config").expanduser()).is_file():
        paths, source = str(default), "the default location"
    else:
        raise ConfigError(
            f"no kubeconfig: pass one with {flag} or KUBECONFIG (in a pod, the service account "
            "is used, but KUBERNETES_SERVICE_HOST is not set here, and ~/.kube/config does "
            "not exist)"
        )
    files = [Path(p).expanduser() for p in paths.split(os.pathsep) if p]
    existing = [f for f in files if f.exists()]
    if not existing:
        raise ConfigError(
            f"kubeconfig {paths} (from {source}) does not exist: point {source} at your "
            "cluster's kubeconfig file"
        )
    for path in existing:
        _check_kubeconfig_file(path, source)
    return paths, source, existing


def _check_kubeconfig_file(path: Path, source: str) -> None:
    """What kubernetes-asyncio would fail on with a traceback: unreadable, not YAML, empty."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(
            f"kubeconfig {path} (from {source}) cannot be read: {exc.strerror or exc}"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or _words(exc)
        raise ConfigError(
            f"kubeconfig {path} (from {source}) is not valid YAML{where}: {problem}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"kubeconfig {path} (from {source}) is not a kubeconfig: expected a YAML mapping "
            "with clusters, users, contexts and current-context"
        )


def _words(exc: BaseException) -> str:
    """An exception's message on one line, without kubernetes-asyncio's boilerplate."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.removeprefix("Invalid kube-config file. ").removesuffix(".")


def _no_answer(exc: BaseException, timeout: float | None) -> str:
    """Why a request got no answer, as a person would say it."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return (
            f"its TLS certificate is not trusted ({_words(exc.certificate_error)}): check the "
            "cluster's certificate-authority in the kubeconfig"
        )
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS handshake failed: {_words(exc)}"
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one as well
        return f"no answer within {timeout:g} s" if timeout else "no answer in time"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, socket.gaierror):
            return f"cannot resolve {exc.host}: {os_error.strerror}"
        if os_error.errno:  # aiohappyeyeballs' strerror is "Connect call failed (...)"
            return os.strerror(os_error.errno).lower()
        return _words(os_error)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "it closed the connection"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    return _words(exc)


def _not_ready(exc: ApiError) -> str:
    """A ``/readyz`` answer other than 200: the status and the checks that failed."""
    body = exc.body if isinstance(exc.body, str) else json.dumps(exc.body)
    if exc.status < 500 and exc.status != 429:  # an API server says 200, 401, 403, 429 or 5xx
        return f"it answered {exc.status} to GET /readyz, which no Kubernetes API server does"
    failed = [line[3:].strip() for line in body.splitlines() if line.startswith("[-]")]
    detail = ", ".join(failed) if failed else " ".join(body.split())[:200]
    return f"it answered {exc.status} (not ready){': ' + detail if detail else ''}"

"""A thin JSON client for the Kubernetes API, over our own small HTTP/1.1 client.

The DRA objects we read and write are easier to follow as the API's own JSON than as generated
model classes, so this module speaks plain dicts, over ``httpclient`` (h11 on asyncio streams:
the node agent loads neither aiohttp nor kubernetes-asyncio, about 15 MiB less on every node).
Credentials come from ``credentials`` (kubeconfig files, the in-cluster service account); this
module reads the files it names, builds the TLS context and keeps a rotated token fresh. A user
whose token comes from a program or a provider (``exec``, ``auth-provider``) is the one case
left to kubernetes-asyncio's loader, imported only then (``dra-gpu explain`` on EKS or GKE).

``watch_forever`` is the one list-then-watch loop that every long-running component uses: it
relists after ``410 Gone``, reconnects after network errors and API server restarts, and never
returns.

The edges fail in words, each its own exception: ``ConfigError`` (no usable kubeconfig or
service account: which file, from which flag or variable, how to fix it), ``Unreachable`` (the
API server gives no usable answer: which address, why) and ``Refused`` (it rejects our
credentials or permissions). ``wait_until_ready`` is how a long-running component starts
before its API server does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import socket
import ssl
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, Unpack
from urllib.parse import urlencode

import yaml

import dra_gpu
from dra_gpu.kube import auth, transport

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


CONNECTION_ERRORS: tuple[type[OSError], ...] = (OSError,)
"""What a request raises when no answer came: every failure of ``httpclient`` to get one is an
``OSError`` (``TimeoutError``, ``ssl.SSLError``, ``transport.ConnectionClosed`` ...)."""
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0)
"""``wait_until_ready``'s back-off: the last delay repeats."""
IN_CLUSTER = auth.IN_CLUSTER
REQUEST_TIMEOUT = transport.Timeout(connect=None, total=30.0)
"""A plain request: 30 s for all of it, connecting included."""
TOKEN_PERIOD = 60.0
"""A token file is read again at most this often (seconds), as client-go does: the kubelet
rotates a service account's token in place."""


class Authorization(Protocol):
    """The ``Authorization`` header of the next request; None for none (anonymous)."""

    async def __call__(self) -> str | None: ...


class Kube:
    """JSON requests against one API server. Use as ``async with await Kube.connect(...)``."""

    def __init__(
        self,
        http: transport.Client,
        authorization: Authorization | None = None,
        origin: str = "",
    ) -> None:
        self.http = http
        self.authorization: Authorization = authorization or _Static(None)
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
        loaded = await _load_config(kubeconfig, source=source or flag, flag=flag)
        http = transport.Client(
            loaded.credentials.server,
            ssl_context=loaded.ssl_context,
            server_hostname=loaded.credentials.tls_server_name,
            user_agent=f"dra-gpu/{dra_gpu.__version__}",
        )
        return cls(http, loaded.authorization, loaded.credentials.origin)

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

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeouts: transport.Timeout = REQUEST_TIMEOUT,
    ) -> transport.Response:
        headers = [("Accept", "application/json"), ("Content-Type", content_type)]
        if (authorization := await self.authorization()) is not None:
            headers.append(("Authorization", authorization))
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        target = f"{path}?{urlencode(params)}" if params else path
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        response = await self.http.request(
            method, target, headers=headers, body=data, timeouts=timeouts
        )
        if not 200 <= response.status <= 299:
            try:
                text = (await response.read()).decode("utf-8", "replace")
            finally:
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
            data = await response.read()
        finally:
            response.release()
        result: Body = json.loads(data.strip() or b"null")  # an empty answer: None
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
            response = await self._send(
                "GET", "/readyz", timeouts=transport.Timeout(connect=None, total=answer_within)
            )
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
        waiting does not fix auth."""
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
        return Unreachable(
            self.server, self.origin, _no_answer(exc, timeout, self.http.origin.host)
        )

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
    ) -> AsyncGenerator[Body, None]:
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
            timeouts=transport.Timeout(connect=10, total=None, read=timeout_seconds + 30),
        )
        try:
            async for line in response.lines():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release()

    async def watch_forever(
        self,
        path: str,
        *,
        retry_delay: float = 1.0,
        on_break: Callable[[], None] | None = None,
        page_size: int | None = None,
        **query: Any,
    ) -> AsyncGenerator[tuple[str, Body], None]:
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
            listing: Body = {}
            try:
                async for page in self._pages(path, page_size, **query):
                    if page_size is None:
                        listing = page
                    else:
                        listing = {"metadata": page.get("metadata", {}), "items": []}
                        yield "PAGE", page
            except (ApiError, OSError) as exc:
                if page_size is not None and on_break is not None:
                    on_break()
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

    async def _pages(self, path: str, page_size: int | None, **query: Any) -> AsyncIterator[Body]:
        """A list, whole (``page_size`` None) or page by page; the last page's metadata has
        the list's resourceVersion."""
        more = ""
        while True:
            paging: dict[str, Any] = {} if page_size is None else {"limit": page_size}
            if more:
                paging["continue"] = more
            page = await self.get(path, **query, **paging)
            yield page
            more = str(page.get("metadata", {}).get("continue") or "")
            if page_size is None or not more:
                return


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---- credentials ---------------------------------------------------------------------------


class _Static:
    """The same header for every request (a static token, basic auth), or none."""

    def __init__(self, header: str | None) -> None:
        self.header = header

    async def __call__(self) -> str | None:
        return self.header


class _TokenFile:
    """A bearer token from a file, read again at most every ``period`` seconds: the kubelet
    writes a pod's new service account token into the same file before the old one expires.
    A file that cannot be read again keeps the token read last (the kubelet swaps the file
    with a rename, so that is a moment at most), with a warning."""

    def __init__(
        self,
        material: auth.Material,
        period: float = TOKEN_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert material.path is not None
        self.material, self.path, self.period, self._clock = material, material.path, period, clock
        self._token = self._read()  # auth.Invalid: ConfigError in words, at connect
        self._read_at = clock()

    def _read(self) -> str:
        # A small file on a tmpfs, at most once a minute: read on the loop, as client-go does
        # in its request path.
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            raise auth.Invalid(
                f"{self.material.what}: {self.path} cannot be read: {exc.strerror or exc}"
            ) from None
        if not token:
            raise auth.Invalid(f"{self.material.what}: {self.path} is empty")
        return token

    async def __call__(self) -> str | None:
        if self._clock() - self._read_at >= self.period:
            self._read_at = self._clock()
            try:
                self._token = self._read()
            except auth.Invalid as exc:
                log.warning("%s; the token read before is used", exc)
        return f"Bearer {self._token}"


class _Delegated:
    """The token kubernetes-asyncio's loader got from an ``exec`` plugin or an ``auth-provider``,
    renewed as its loader renews it: the plugin runs again once its token's expiry has passed
    (less five minutes), a GCP token is refreshed when expired; checked at most every
    ``period`` seconds."""

    def __init__(self, loader: Any, configuration: Any, period: float = TOKEN_PERIOD) -> None:
        self.loader, self.configuration, self.period = loader, configuration, period
        self._checked = time.monotonic()

    async def __call__(self) -> str | None:
        if time.monotonic() - self._checked >= self.period:
            self._checked = time.monotonic()
            try:
                await self._renew()
            except Exception as exc:  # the old token may still work; a 401 says it if not
                log.warning("renewing the token of %s failed: %s", self.loader.current_context, exc)
        token = self.configuration.api_key.get("BearerToken")
        return str(token) if token else None

    async def _renew(self) -> None:
        loader = self.loader
        if loader.provider == "gcp":
            self.configuration.api_key["BearerToken"] = await loader.load_gcp_token()
            return
        expiry = getattr(loader, "exec_plugin_expiry", None)
        soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
        if expiry is not None and expiry <= soon:
            await loader.load_from_exec_plugin()
            self.configuration.api_key["BearerToken"] = loader.token


@dataclasses.dataclass(frozen=True)
class _Loaded:
    credentials: auth.Credentials
    authorization: Authorization
    ssl_context: ssl.SSLContext | None


async def _load_config(kubeconfig: Path | str | None, *, source: str, flag: str) -> _Loaded:
    """The credentials, their ``Authorization`` and TLS context. Every failure is a
    ``ConfigError`` in words."""
    found = _kubeconfig_files(kubeconfig, source=source, flag=flag)
    if found is None:
        try:
            return _loaded(auth.in_cluster(os.environ))
        except auth.Invalid as exc:
            raise ConfigError(
                f"in a pod (KUBERNETES_SERVICE_HOST is set) but its {IN_CLUSTER} is not usable: "
                f"{exc}: mount the service account token (automountServiceAccountToken), or "
                f"pass a kubeconfig with {flag}"
            ) from None
    paths, source, files = found
    try:
        documents = [(path, _check_kubeconfig_file(path, source)) for path in files]
        loaded = auth.from_kubeconfig(documents, paths=paths)
        if loaded.delegated:
            return await _delegated(loaded, files)
        return _loaded(loaded)
    except auth.NoCurrentContext:
        raise ConfigError(
            f"kubeconfig {paths} (from {source}) has no current-context: choose one with "
            f"`kubectl config use-context NAME --kubeconfig {files[0]}`"
        ) from None
    except auth.Invalid as exc:
        raise ConfigError(f"kubeconfig {paths} (from {source}) is not usable: {exc}") from None


def _loaded(found: auth.Credentials) -> _Loaded:
    """Check the files ``found`` names, read its token file, build its TLS context."""
    for material in (found.certificate_authority, found.client_certificate, found.client_key):
        if material is not None and material.path is not None and not material.path.is_file():
            raise auth.Invalid(f"{material.what}: {material.path} does not exist")
    authorization: Authorization
    if found.token_file is not None:
        if found.token_file.path is None or not found.token_file.path.is_file():
            raise auth.Invalid(f"{found.token_file.what}: {found.token_file.path} does not exist")
        authorization = _TokenFile(found.token_file)
    elif found.token is not None:
        authorization = _Static(f"Bearer {found.token}")
    elif found.basic_auth is not None:
        pair = ":".join(found.basic_auth).encode()
        authorization = _Static(f"Basic {base64.b64encode(pair).decode()}")
    else:
        authorization = _Static(None)
    return _Loaded(found, authorization, _ssl_context(found))


def _ssl_context(found: auth.Credentials) -> ssl.SSLContext | None:
    """TLS as the credentials say: their CA (else the system's), client certificate, checks."""
    if not found.server.startswith("https://"):
        return None
    ca = found.certificate_authority
    try:
        if ca is None:
            context = ssl.create_default_context()
        elif ca.data is not None:
            pem = b"-----BEGIN" in ca.data
            context = ssl.create_default_context(cadata=ca.data.decode() if pem else ca.data)
        else:
            context = ssl.create_default_context(cafile=str(ca.path))
    except (ssl.SSLError, OSError, ValueError) as exc:
        what = ca.what if ca else "the system's CA certificates"
        raise auth.Invalid(f"{what}: no CA certificate in it ({_words(exc)})") from None
    cert, key = found.client_certificate, found.client_key
    if cert is not None and key is not None:
        try:
            _load_client_certificate(context, cert, key)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise auth.Invalid(
                f"{cert.what} and {key.what}: not a certificate and its key ({_words(exc)})"
            ) from None
    if found.insecure_skip_tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _load_client_certificate(
    context: ssl.SSLContext, cert: auth.Material, key: auth.Material
) -> None:
    """``ssl`` loads certificates from files only: inline ones go through a private temporary
    directory, gone once loaded."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-tls-") as directory:
        paths = []
        for name, material in (("client.crt", cert), ("client.key", key)):
            if material.path is not None:
                paths.append(str(material.path))
                continue
            path = Path(directory, name)
            path.touch(mode=0o600)
            path.write_bytes(material.data or b"")
            paths.append(str(path))
        context.load_cert_chain(paths[0], paths[1])


async def _delegated(found: auth.Credentials, files: Sequence[Path]) -> _Loaded:
    """An ``exec`` or ``auth-provider`` user, loaded by kubernetes-asyncio (its aiohttp and
    generated classes come with it: never in the node agent, which uses its service account);
    its configuration becomes our credentials, its token renewed as the loader renews it."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        loader = await config.load_kube_config(
            config_file=os.pathsep.join(map(str, files)),
            context=found.context,
            client_configuration=configuration,
        )
    except Exception as exc:  # local parsing and the plugin: "this user is not usable"
        raise auth.Invalid(f"{found.delegated}: {_words(exc)}") from None

    def material(value: Any, what: str) -> auth.Material | None:
        return auth.Material(what, path=Path(value)) if value else None

    of = f"the {found.delegated} user of context {found.context}"
    converted = dataclasses.replace(
        found,
        server=str(configuration.host).rstrip("/"),
        certificate_authority=material(configuration.ssl_ca_cert, f"the CA of {of}"),
        client_certificate=material(configuration.cert_file, f"the certificate of {of}"),
        client_key=material(configuration.key_file, f"the key of {of}"),
        insecure_skip_tls_verify=not configuration.verify_ssl,
        tls_server_name=configuration.tls_server_name or None,
        token=None,
        token_file=None,
        basic_auth=None,
    )
    return _Loaded(converted, _Delegated(loader, configuration), _ssl_context(converted))


def _kubeconfig_files(
    kubeconfig: Path | str | None, *, source: str, flag: str
) -> tuple[str, str, list[Path]] | None:
    """``(paths as given, where from, existing files)``, or None for the in-cluster account."""
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


def _check_kubeconfig_file(path: Path, source: str) -> dict[str, Any]:
    """The file's YAML mapping; ``ConfigError`` if it is unreadable, not YAML, or empty."""
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
    return data


def _words(exc: BaseException) -> str:
    """An exception's message on one line, without kubernetes-asyncio's boilerplate."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.removeprefix("Invalid kube-config file. ").removesuffix(".")


def _no_answer(exc: BaseException, timeout: float | None, host: str = "") -> str:
    """Why a request got no answer, as a person would say it."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its TLS certificate is not trusted ({_words(exc)}): check the "
            "cluster's certificate-authority in the kubeconfig"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {_words(exc)}"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s" if timeout else "no answer in time"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host}: {exc.strerror}"
    if isinstance(exc, transport.ConnectionClosed):
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

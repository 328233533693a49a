"""The ``Authorization`` header of each request, from one of three sources, kept fresh.

Owns: the ``Authorization`` protocol the client calls before every request (and ``refresh``
after a 401), and its three sources: ``Static`` (a token or basic auth given in the kubeconfig,
or none), ``TokenFile`` (a token file the kubelet rotates in place, read again at most every
``TOKEN_PERIOD`` seconds, as client-go does, and at once after a 401) and ``Delegated`` (the
token kubernetes-asyncio's loader got from an ``exec`` plugin or an ``auth-provider``).

An ``exec`` plugin's credential is kept as client-go's ``exec.go`` keeps it: reused until its
``expirationTimestamp`` (less ``EXPIRY_MARGIN``, so that no request leaves with a token about to
expire), or until a request with it gets 401, then the plugin runs again; one run at a time,
whoever asks. A credential without an expiry is reused until a 401.

Must not: choose the source (``kubeconfig`` does, from the ``auth.Credentials``), send a request
or import kubernetes-asyncio (``Delegated`` is handed its loader).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from dra_gpu.kube import auth

log = logging.getLogger(__name__)

TOKEN_PERIOD = 60.0
"""A token file is read again at most this often (seconds), as client-go does: the kubelet
rotates a service account's token in place."""
EXPIRY_MARGIN = datetime.timedelta(seconds=10)
"""An ``exec`` plugin runs again this long before its credential's ``expirationTimestamp``."""


class Authorization(Protocol):
    """The ``Authorization`` header of the next request; None for none (anonymous)."""

    async def __call__(self) -> str | None: ...

    async def refresh(self, rejected: str | None) -> bool:
        """A request with the header ``rejected`` got 401: get fresh credentials if the source
        can. True when the next header differs from ``rejected`` (the request is worth sending
        again), whoever refreshed it."""
        ...


class Static:
    """The same header for every request (a static token, basic auth), or none."""

    def __init__(self, header: str | None) -> None:
        self.header = header

    async def __call__(self) -> str | None:
        return self.header

    async def refresh(self, rejected: str | None) -> bool:
        return False  # nothing to refresh from


class TokenFile:
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

    async def refresh(self, rejected: str | None) -> bool:
        """Read the file now (the kubelet may have rotated it since): client-go resets its
        cache on a 401 too."""
        self._read_at = self._clock()
        try:
            self._token = self._read()
        except auth.Invalid as exc:
            log.warning("%s; the token read before is used", exc)
        return f"Bearer {self._token}" != rejected


class Delegated:
    """The token kubernetes-asyncio's loader got from an ``exec`` plugin or an ``auth-provider``.

    ``exec``: the plugin runs again once its credential's expiry is near (``EXPIRY_MARGIN``),
    checked before every request, and after a 401 with the current credential; a credential
    without an expiry is kept until a 401. ``auth-provider``: renewed as its loader renews it (a
    GCP token once expired), checked at most every ``period`` seconds; a 401 does not renew it.
    A plugin that fails keeps the credential it gave before, with a warning: the server says
    with a 401 whether it still works."""

    def __init__(
        self,
        loader: Any,
        configuration: Any,
        *,
        exec_plugin: bool,
        period: float = TOKEN_PERIOD,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.loader, self.configuration, self.period, self._now = loader, configuration, period, now
        self._checked = time.monotonic()
        self._running = asyncio.Lock()
        self.exec = exec_plugin
        """The token comes from an ``exec`` plugin (not an ``auth-provider``)."""

    def _header(self) -> str | None:
        token = self.configuration.api_key.get("BearerToken")
        return str(token) if token else None

    def _expiring(self) -> bool:
        expiry: datetime.datetime | None = getattr(self.loader, "exec_plugin_expiry", None)
        return expiry is not None and expiry - EXPIRY_MARGIN <= self._now()

    async def __call__(self) -> str | None:
        if self.exec:
            if self._expiring():
                await self._run_plugin(self._header())
        elif time.monotonic() - self._checked >= self.period:
            self._checked = time.monotonic()
            try:
                await self._renew_provider()
            except Exception as exc:  # the old token may still work; a 401 says it if not
                log.warning("renewing the token of %s failed: %s", self._name(), exc)
        return self._header()

    async def refresh(self, rejected: str | None) -> bool:
        if not self.exec:
            return False
        await self._run_plugin(rejected)
        return self._header() != rejected

    async def _run_plugin(self, stale: str | None) -> None:
        """Run the plugin again, unless another caller did since ``stale`` was current."""
        async with self._running:
            if self._header() != stale:
                return  # refreshed by whoever held the lock before us
            # The loader runs its plugin only without an unexpired credential: forget it.
            expiry = vars(self.loader).pop("exec_plugin_expiry", None)
            try:
                await self.loader.load_from_exec_plugin()
            except Exception as exc:
                if expiry is not None:
                    self.loader.exec_plugin_expiry = expiry
                log.warning(
                    "the exec plugin of %s failed: %s; the credential it gave before is used",
                    self._name(),
                    exc,
                )
                return
            token = getattr(self.loader, "token", None)
            if token:
                self.configuration.api_key["BearerToken"] = token

    async def _renew_provider(self) -> None:
        if self.loader.provider == "gcp":
            self.configuration.api_key["BearerToken"] = await self.loader.load_gcp_token()

    def _name(self) -> str:
        context = getattr(self.loader, "current_context", None)
        return str(context.get("name", "")) if isinstance(context, dict) else "the context"

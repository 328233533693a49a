"""The ``Authorization`` header of each request, from one of three sources, kept fresh.

Owns: the ``Authorization`` protocol the client calls before every request, and its three
sources: ``Static`` (a token or basic auth given in the kubeconfig, or none), ``TokenFile`` (a
token file the kubelet rotates in place, read again at most every ``TOKEN_PERIOD`` seconds, as
client-go does) and ``Delegated`` (the token kubernetes-asyncio's loader got from an ``exec``
plugin or an ``auth-provider``, renewed as that loader renews it).

Must not: choose the source (``kubeconfig`` does, from the ``auth.Credentials``), send a request
or import kubernetes-asyncio (``Delegated`` is handed its loader).
"""

from __future__ import annotations

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


class Authorization(Protocol):
    """The ``Authorization`` header of the next request; None for none (anonymous)."""

    async def __call__(self) -> str | None: ...


class Static:
    """The same header for every request (a static token, basic auth), or none."""

    def __init__(self, header: str | None) -> None:
        self.header = header

    async def __call__(self) -> str | None:
        return self.header


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


class Delegated:
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

"""The self-issued webhook certificates: kept in a Secret, copied to files, trusted by the API
server.

Every replica serves the webhook, so every replica reads the Secret ``webhook_secret`` (a
``kubernetes.io/tls`` Secret: ``tls.crt``, ``tls.key``, ``ca.crt`` the CA bundle, and
``ca.key``, the current CA's key) about every 30 s and copies ``tls.crt``, ``tls.key`` and
``ca.crt`` into ``cert_dir`` when their bytes change (atomically: Kopf's server, which re-reads
them, never sees half a file). The leader also keeps what the Secret holds: it creates it when
missing, stores what ``certificates.renew`` decides when something is due (an update with the
``resourceVersion`` read: two leaders for a moment cannot both win), and patches every webhook
of ``webhook_configuration`` so its ``clientConfig.caBundle`` is the bundle, before it changes
its own files (a new CA is trusted before a certificate it signed is served). A conflict (409)
is re-read and tried again; any other failure is logged and retried with back-off.

Owns: ``CertificateKeeper`` (``run_forever``, one pass ``run_once``, ``ready``/``wait_ready``)
and the Secret's layout (``SECRET_KEYS``).
Must not: issue or judge certificates (``certificates``), serve them (``server``), or write
anything to the API while not the leader; ``ca.key`` never leaves the Secret.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller.admission import certificates

log = logging.getLogger(__name__)

CERT_FILE, KEY_FILE, CA_FILE = "tls.crt", "tls.key", "ca.crt"
"""The files in ``cert_dir`` (and the Secret's keys of the same names)."""
CA_KEY = "ca.key"
SECRET_KEYS = {"cert": CERT_FILE, "key": KEY_FILE, "bundle": CA_FILE, "ca_key": CA_KEY}
"""``certificates.Stored``'s fields and the Secret's keys that hold them."""
FILES = ((CERT_FILE, "cert", 0o644), (KEY_FILE, "key", 0o600), (CA_FILE, "bundle", 0o644))
"""What is copied into ``cert_dir``: file name, ``Stored`` field, mode; the key is written
before the certificate, so a matching pair is complete once the certificate changes."""
PERIOD_SECONDS = 30.0
JITTER = 0.1
"""Each pause is the period give or take this share, so replicas do not ask all at once."""
FIRST_COPY_SECONDS = 1.0
"""The pause while this replica has no files yet: it is not ready (serves nothing) until then."""
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""After consecutive failures; the last repeats."""
CONFLICT_ATTEMPTS = 3
"""Conflicts (409) in one pass before it fails and backs off."""
VWC_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class CertificateKeeper:
    def __init__(
        self,
        api: kube.Kube,
        settings: ControllerSettings,
        is_leader: Callable[[], bool],
        cert_dir: Path,
        clock: Callable[[], datetime.datetime] = _now,
        *,
        leader_changed: asyncio.Event | None = None,
        period: float = PERIOD_SECONDS,
    ) -> None:
        self.api = api
        self.is_leader = is_leader
        self.cert_dir = cert_dir
        self.clock = clock
        self.leader_changed = leader_changed
        """Set when ``is_leader`` may have changed: the pause ends at once. Only waited on,
        never cleared (its owner clears it); ``is_leader`` is also checked every second."""
        self.period = period
        self.names = certificates.service_names(settings.webhook_service, settings.namespace)
        self.secrets = f"/api/v1/namespaces/{settings.namespace}/secrets"
        self.secret_name = settings.webhook_secret
        self.secret_path = f"{self.secrets}/{settings.webhook_secret}"
        self.vwc_name = settings.webhook_configuration
        self.vwc_path = f"{VWC_PATH}/{settings.webhook_configuration}"
        self.ready = asyncio.Event()
        """Set once ``tls.crt`` and ``tls.key`` are in ``cert_dir``, copied from the Secret."""
        self._vwc_missing = False
        """Whether the missing configuration was logged already (once until it appears)."""

    async def wait_ready(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Whether the files were written within ``timeout`` seconds (None: no limit)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.ready.wait()
        return self.ready.is_set()

    async def run_forever(self) -> NoReturn:
        failures = 0
        while True:
            leading = self.is_leader()
            try:
                await self.run_once(leading)
            except Exception as exc:  # the API restarting, RBAC, a bad object: retry
                failures += 1
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1]
                log.warning("webhook certificates: %s; again in %g s", exc, delay)
            else:
                failures = 0
                delay = self.period * random.uniform(1 - JITTER, 1 + JITTER)
                if not self.ready.is_set():  # a standby waits for the leader's first Secret
                    delay = min(delay, FIRST_COPY_SECONDS)
            await self._pause(delay, leading)

    async def run_once(self, leading: bool | None = None) -> None:
        """One pass: read the Secret; as the leader (``leading``, else ``is_leader()``) keep it
        and then the caBundle; then copy it into the files."""
        if leading is None:
            leading = self.is_leader()
        secret = await self._read_secret()
        if leading:
            secret = await self._keep_secret(secret)
        if secret is None:
            log.debug("webhook certificates: no Secret %s yet", self.secret_name)
            return
        stored = _stored(secret)
        try:
            if leading:  # first: a new CA is trusted before anyone serves what it signed
                await self._keep_ca_bundle(certificates.ca_bundle(stored))
        finally:  # and the files, even when the configuration could not be patched
            if await asyncio.to_thread(self._write_files, stored):
                self.ready.set()

    async def _pause(self, seconds: float, leading: bool) -> None:
        """``seconds``, or less when ``is_leader()`` is no longer ``leading``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0 and self.is_leader() == leading:
            event = self.leader_changed
            if event is not None and not event.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, 1.0)):
                        await event.wait()
            else:
                await asyncio.sleep(min(left, 1.0))

    # ---- the Secret (the leader writes) --------------------------------------------------

    async def _read_secret(self) -> kube.Body | None:
        try:
            return await self.api.get(self.secret_path)
        except kube.ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def _keep_secret(self, secret: kube.Body | None) -> kube.Body | None:
        """The Secret as it is once it holds what ``certificates.renew`` wants."""
        for _attempt in range(CONFLICT_ATTEMPTS):
            stored = None if secret is None else _stored(secret)
            wanted = certificates.renew(stored, self.names, self.clock())
            if wanted is stored:
                return secret
            try:
                if secret is None:
                    body = self._secret_body(wanted)
                    owners = await self._owner()
                    if owners:
                        body["metadata"]["ownerReferences"] = owners
                    created = await self.api.create(self.secrets, body)
                    log.info("webhook certificates: created the Secret %s", self.secret_name)
                    return created
                body = self._secret_body(wanted, secret)
                replaced = await self.api.replace(self.secret_path, body)
                log.info("webhook certificates: renewed in the Secret %s", self.secret_name)
                return replaced
            except kube.ApiError as exc:
                if not exc.conflict:
                    raise
                log.info(
                    "webhook certificates: the Secret %s changed meanwhile; read again",
                    self.secret_name,
                )
            secret = await self._read_secret()
        raise RuntimeError(
            f"the Secret {self.secret_name} kept changing under us ({CONFLICT_ATTEMPTS} "
            "conflicts in a row)"
        )

    async def _owner(self) -> list[kube.Body]:
        """The webhook configuration as the Secret's owner: deleting it (``helm uninstall``,
        admission turned off) deletes the Secret, which the chart does not own. None while
        the configuration does not exist."""
        try:
            configuration = await self.api.get(self.vwc_path)
        except kube.ApiError as exc:
            if exc.not_found:
                return []
            raise
        return [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "name": self.vwc_name,
                "uid": configuration["metadata"]["uid"],
            }
        ]

    def _secret_body(
        self, stored: certificates.Stored, current: kube.Body | None = None
    ) -> kube.Body:
        metadata: kube.Body = {"name": self.secret_name}
        kind = "kubernetes.io/tls"
        if current is not None:  # keep its labels, annotations and type; update that version
            metadata = dict(current.get("metadata") or {}) | metadata
            metadata.pop("managedFields", None)
            kind = current.get("type") or kind  # immutable: a Secret of another type stays so
        data = dict((current or {}).get("data") or {})
        for field, key in SECRET_KEYS.items():
            data[key] = base64.b64encode(getattr(stored, field)).decode("ascii")
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": kind,
            "data": data,
        }

    # ---- the caBundle (the leader patches) -----------------------------------------------

    async def _keep_ca_bundle(self, bundle: bytes) -> None:
        encoded = base64.b64encode(bundle).decode("ascii")
        try:
            configuration = await self.api.get(self.vwc_path)
        except kube.ApiError as exc:
            if not exc.not_found:
                raise
            if not self._vwc_missing:
                log.warning(
                    "webhook certificates: no ValidatingWebhookConfiguration %s to give the CA "
                    "bundle to; looking again every pass",
                    self.vwc_name,
                )
                self._vwc_missing = True
            return
        self._vwc_missing = False
        stale = [
            webhook["name"]
            for webhook in configuration.get("webhooks") or []
            if (webhook.get("clientConfig") or {}).get("caBundle") != encoded
        ]
        if not stale:
            return
        # The webhooks list merges by name: only the caBundles change, nothing else.
        patch = {"webhooks": [{"name": n, "clientConfig": {"caBundle": encoded}} for n in stale]}
        await self.api.patch(self.vwc_path, patch, "strategic")
        log.info("webhook certificates: CA bundle set in %s (%s)", self.vwc_name, ", ".join(stale))

    # ---- the files (every replica) -------------------------------------------------------

    def _write_files(self, stored: certificates.Stored) -> bool:
        """Copy what changed into ``cert_dir`` (in a thread); a pair whose key does not match
        is skipped (the server would fail to load it). Whether the pair is there now."""
        if not certificates.key_matches(stored.cert, stored.key):
            log.warning(
                "webhook certificates: the Secret %s holds no matching tls.crt and tls.key; "
                "the files are left as they are",
                self.secret_name,
            )
            return False
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for name, field, mode in FILES:
            data: bytes = getattr(stored, field)
            path = self.cert_dir / name
            if data and _read(path) != data:
                _atomic_write(path, data, mode)
                log.info("webhook certificates: wrote %s", path)
        return (self.cert_dir / CERT_FILE).exists() and (self.cert_dir / KEY_FILE).exists()


def _stored(secret: kube.Body) -> certificates.Stored:
    """The Secret's data (base64); what is missing or garbled is empty, so it is due."""
    data = secret.get("data") or {}

    def decoded(key: str) -> bytes:
        try:
            return base64.b64decode(data.get(key) or "", validate=True)
        except ValueError:
            return b""

    return certificates.Stored(**{field: decoded(key) for field, key in SECRET_KEYS.items()})


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the new one, whole; the
    temporary file has ``mode`` before it holds anything."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as stream:
            os.fchmod(stream.fileno(), mode)
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise

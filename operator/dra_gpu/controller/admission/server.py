"""The webhook's HTTPS listener: Kopf's ``WebhookServer``, started once the certificate is there.

Kopf's server loads ``certfile``/``pkeyfile`` into its TLS context when it starts and hashes
them (with ``cafile``) every ``file_check_interval``; when the bytes change it stops the
listener and starts it again with the new files (it opens them by path each time, so a file
replaced by ``os.replace`` or a Secret volume's symlink swap is seen). Two things it does not
do, which this subclass adds: wait for the files (the keeper writes them after its first read
of the Secret; cert-manager's volume may be late), and survive a restart that caught a pair in
the middle of being replaced (the key already new, the certificate not yet): the load fails,
and it tries again shortly instead of ending Kopf's webhook task.

``cafile`` (``ca.crt`` in the directory, when there) only feeds the client config Kopf yields;
the ValidatingWebhookConfiguration is the chart's, its caBundle kept by the keeper or by
cert-manager's CA injector.

Owns: ``webhook_server`` and the server class.
Must not: write the files or read the API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import kopf

from dra_gpu.config import ControllerSettings
from dra_gpu.kube import backoff

log = logging.getLogger(__name__)

CERT_FILE, KEY_FILE, CA_FILE = "tls.crt", "tls.key", "ca.crt"
"""The files read from the directory (those of a ``kubernetes.io/tls`` Secret)."""
FILE_WAIT_SECONDS = 0.5
"""How often a server without its files looks for them again."""
FILE_CHECK_SECONDS = 10.0
"""How often a serving server hashes its files for a change."""
RETRY = backoff.Backoff(duration=0.5, cap=30.0)
"""After consecutive failed starts (a half-replaced pair, a port taken): 0.5 s doubling up to
30 s, jittered (the package's back-off); a start that serves resets it."""


def webhook_server(
    settings: ControllerSettings,
    cert_dir: Path,
    *,
    file_check_interval: float = FILE_CHECK_SECONDS,
) -> Server:
    """The server for ``settings.webhook_port`` on ``settings.bind_address``, serving the pair
    in ``cert_dir`` (cert-manager's mount, ``settings.webhook_cert_dir``, or the keeper's
    directory); webhooks at ``/<id>``, reached as ``<service>.<namespace>.svc``."""
    return Server(
        cert_dir,
        addr=settings.bind_address,
        port=settings.webhook_port,
        host=f"{settings.webhook_service}.{settings.namespace}.svc",
        file_check_interval=file_check_interval,
    )


class Server(kopf.WebhookServer):
    """Kopf's server, once ``tls.crt`` and ``tls.key`` exist, started again when a start
    fails."""

    def __init__(
        self, cert_dir: Path, *, addr: str, port: int, host: str, file_check_interval: float
    ) -> None:
        super().__init__(
            addr=addr,
            port=port,
            path="/",
            host=host,
            certfile=cert_dir / CERT_FILE,
            pkeyfile=cert_dir / KEY_FILE,
            file_check_interval=file_check_interval,
        )
        self.cert_dir = cert_dir
        self.listening = asyncio.Event()
        """Set while the listener is up with a certificate (the replica's readiness)."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        certfile, pkeyfile = self.cert_dir / CERT_FILE, self.cert_dir / KEY_FILE
        waited = False
        while not (certfile.exists() and pkeyfile.exists()):  # another process writes them
            if not waited:
                log.info("webhook: waiting for %s and %s", certfile, pkeyfile)
                waited = True
            await asyncio.sleep(FILE_WAIT_SECONDS)
        delays = RETRY.delays()
        while True:
            # Set per start: a ca.crt that appeared is used, one that went is not hashed.
            cafile = self.cert_dir / CA_FILE
            self.cafile = cafile if cafile.exists() else None
            try:
                async for config in super().__call__(fn):
                    delays.reset()
                    self.listening.set()  # Kopf yields once its site has started
                    yield config
            except OSError as exc:  # ssl.SSLError: a key and a certificate that do not match
                self.listening.clear()
                delay = delays.next()
                log.warning(
                    "webhook: cannot serve with %s: %s; again in %.3g s", certfile, exc, delay
                )
                await asyncio.sleep(delay)
            else:  # Kopf's server never returns by itself; if it ever does, start it again
                await asyncio.sleep(FILE_WAIT_SECONDS)

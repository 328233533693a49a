"""The admission part of one controller replica: the validators Kopf serves, where the
certificate they are served with comes from, and whether this replica is serving.

Every replica serves (a standby's view is as warm as the leader's, and the Service spreads
reviews over the ready replicas). The certificate is either kept by someone else
(``webhook_cert_dir``: cert-manager's Secret, mounted) or issued by the leader into a Secret
that every replica copies into a private directory (``keeper``); Kopf's server re-reads the
files when they change.

Owns: ``Webhook`` (built by the controller, its registry filled, its job run, its readiness).
Must not: decide what is refused (``review``), issue certificates (``certificates``).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import kopf

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller.admission import handlers, keeper, server


class Webhook:
    def __init__(
        self,
        settings: ControllerSettings,
        api: kube.Kube,
        explain_now: handlers.Explain,
        warm: handlers.Warm,
        *,
        is_leader: Callable[[], bool],
        leader_changed: asyncio.Event,
    ) -> None:
        self.driver = settings.driver_name
        self.explain_now = explain_now
        self.warm = warm
        if settings.webhook_cert_dir is not None:
            self.cert_dir = settings.webhook_cert_dir
            self.keeper: keeper.CertificateKeeper | None = None
        else:
            self.cert_dir = Path(tempfile.mkdtemp(prefix="dra-gpu-webhook-"))
            self.keeper = keeper.CertificateKeeper(
                api, settings, is_leader, self.cert_dir, leader_changed=leader_changed
            )
        self.server = server.webhook_server(settings, self.cert_dir)

    def register(self, registry: kopf.OperatorRegistry) -> None:
        handlers.register(registry, self.driver, self.explain_now, self.warm)

    async def run_forever(self) -> NoReturn:
        """Keep the self-issued certificate (a job of the controller); with cert-manager's
        there is nothing to do."""
        if self.keeper is not None:
            await self.keeper.run_forever()
        await asyncio.get_running_loop().create_future()
        raise AssertionError("never set")

    def serving(self) -> tuple[bool, str]:
        """For ``/readyz``: a replica not serving yet must not be an endpoint of the Service
        (failing open, the API server would admit what it should refuse)."""
        if self.server.listening.is_set():
            return True, "ok"
        return False, f"the admission webhook has no certificate in {self.cert_dir} yet"

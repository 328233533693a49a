"""Writes our entries of ``ResourceClaim.status.devices`` in the background.

The kubelet waits for prepare, not for this: a prepared device's Ready entry is information for
users and the controller, so it must not add an API round trip to the critical path. Desired
state is kept per claim (the latest wins) and applied with server-side apply under a field
manager of our own, which owns exactly our driver's entries: other drivers' entries are never
touched, and applying an empty list removes ours. Writes wait ``delay_seconds`` so that
bursts coalesce (a claim prepared and unprepared within that time costs no write at all), one
at a time (they share the event loop and the API server with prepares, which come first).
Failed writes are retried with backoff; a claim that is gone needs no status. A desire is
forgotten once written: ``metrics.STATUS_WRITES_PENDING`` is how far behind the writes are.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

_Desire = tuple[ClaimRef, list[dict[str, Any]]]
"""A claim and our entries for its ``status.devices``; compared by identity (the latest wins)."""


class StatusWriter:
    """The agent's ``state.StatusSink``: desired entries in, server-side applies out."""

    def __init__(
        self,
        api: kube.Kube,
        node: str,
        *,
        delay_seconds: float = 0.5,
        retry_seconds: float = 2.0,
    ) -> None:
        self.api = api
        self.field_manager = f"dra-gpu-agent/{node}"
        self.delay_seconds = delay_seconds
        self.retry_seconds = retry_seconds
        self._written: set[str] = set()
        self._desired: dict[str, _Desire] = {}
        self._dirty: asyncio.Queue[str] = asyncio.Queue()
        metrics.STATUS_WRITES_PENDING.set_function(self.pending)

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        self._desired[ref.uid] = (ref, entries)
        asyncio.get_running_loop().call_later(self.delay_seconds, self._retry, ref.uid)

    def pending(self) -> int:
        return len(self._desired)

    async def run_forever(self) -> NoReturn:
        while True:
            uid = await self._dirty.get()
            desired = self._desired.get(uid)
            if desired is not None:  # else already written by an earlier wake-up
                await self._write(uid, desired)

    async def _write(self, uid: str, desired: _Desire) -> None:
        """Apply one desire; forget it once written (or once writing it cannot help), else
        retry it later."""
        ref, entries = desired
        if not entries and uid not in self._written:
            self._forget(uid, desired)  # nothing of ours was ever written there
            return
        try:
            await self._apply(ref, entries)
        except kube.ApiError as exc:
            if 400 <= exc.status < 500 and exc.status != 429:
                # Gone, another claim now (UID precondition), or refused: retrying cannot
                # help. A deleted claim needs no status; anything else is logged loudly.
                if not (exc.not_found or exc.conflict):
                    log.error("status of claim %s refused: %s", ref, exc)
                self._written.discard(uid)
                self._forget(uid, desired)
                return
            log.warning("status of claim %s: %s; retrying", ref, exc)
            asyncio.get_running_loop().call_later(self.retry_seconds, self._retry, uid)
            return
        except Exception as exc:  # API unreachable (restarting): retry later
            log.warning("status of claim %s: %s; retrying", ref, exc)
            asyncio.get_running_loop().call_later(self.retry_seconds, self._retry, uid)
            return
        if entries:
            self._written.add(uid)
        else:
            self._written.discard(uid)
        self._forget(uid, desired)

    def _retry(self, uid: str) -> None:
        if uid in self._desired:
            self._dirty.put_nowait(uid)

    def _forget(self, uid: str, written: _Desire) -> None:
        if self._desired.get(uid) is written:  # a newer desire arrived meanwhile: keep it
            del self._desired[uid]

    async def _apply(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": entries},
        }
        await self.api.patch(
            f"{ref.path}/status",
            body,
            "apply",
            fieldManager=self.field_manager,
            force=True,
        )

"""Writes our entries of ``ResourceClaim.status.devices`` in the background.

The kubelet waits for prepare, not for this: a prepared device's Ready entry is information for
users and the controller, so it must not add an API round trip to the critical path. Desired
state is kept per claim (the latest wins) and applied with server-side apply under a field
manager of our own, which owns exactly our driver's entries: other drivers' entries are never
touched, and applying an empty list removes ours. Writes wait ``delay_seconds`` so that
bursts coalesce (a claim prepared and unprepared within that time costs no write at all).
Failed writes are retried with backoff; a claim that is gone needs no status.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.agent.claims import ClaimRef

log = logging.getLogger(__name__)


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
        self._desired: dict[str, tuple[ClaimRef, list[dict[str, Any]]]] = {}
        self._dirty: asyncio.Queue[str] = asyncio.Queue()

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        self._desired[ref.uid] = (ref, entries)
        asyncio.get_running_loop().call_later(self.delay_seconds, self._retry, ref.uid)

    def pending(self) -> int:
        return len(self._desired)

    async def run_forever(self) -> NoReturn:
        while True:
            uid = await self._dirty.get()
            if uid not in self._desired:
                continue  # already written by an earlier wake-up
            ref, entries = self._desired[uid]
            if not entries and uid not in self._written:
                self._forget(uid, (ref, entries))  # nothing of ours was ever written there
                continue
            try:
                await self._apply(ref, entries)
            except kube.ApiError as exc:
                if 400 <= exc.status < 500 and exc.status != 429:
                    # Gone, another claim now (UID precondition), or refused: retrying cannot
                    # help. A deleted claim needs no status; anything else is logged loudly.
                    if not (exc.not_found or exc.conflict):
                        log.error("status of claim %s refused: %s", ref, exc)
                    self._forget(uid, (ref, entries))
                    continue
                log.warning("status of claim %s: %s; retrying", ref, exc)
                asyncio.get_running_loop().call_later(self.retry_seconds, self._retry, uid)
                continue
            except Exception as exc:  # API unreachable (restarting): retry later
                log.warning("status of claim %s: %s; retrying", ref, exc)
                asyncio.get_running_loop().call_later(self.retry_seconds, self._retry, uid)
                continue
            if entries:
                self._written.add(uid)
            else:
                self._written.discard(uid)
            self._forget(uid, (ref, entries))

    def _retry(self, uid: str) -> None:
        if uid in self._desired:
            self._dirty.put_nowait(uid)

    def _forget(self, uid: str, written: tuple[ClaimRef, list[dict[str, Any]]]) -> None:
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

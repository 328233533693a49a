"""Our entries of ``ResourceClaim.status.devices``: what they say, and their writing in the
background.

``ClaimEntries`` keeps the entries of the claims prepared since start and the health of this
node's devices: prepare sets a claim's entries (``uuid``, product, memory, sharing, the device's
health condition), unprepare empties them, and a health change rewrites the entries of the
claims that hold the device. Each change goes to a ``StatusSink``, in the agent the
``StatusWriter``.

The kubelet waits for prepare, not for this: a prepared device's Ready entry is information for
users and the controller, so it must not add an API round trip to the critical path. Desired
state is kept per claim (the latest wins) and applied with server-side apply under a field
manager of our own, which owns exactly our driver's entries: other drivers' entries are never
touched, and applying an empty list removes ours. Writes wait ``delay_seconds`` so that
bursts coalesce (a claim prepared and unprepared within that time costs no write at all), one
at a time (they share the event loop and the API server with prepares, which come first).
Failed writes are retried with a jittered back-off (``RETRY``); a claim that is gone needs no
status. A desire is forgotten once written: ``metrics.STATUS_WRITES_PENDING`` is how far behind
the writes are.

Owns our entries and their writes; must not delay a prepare, nor touch other drivers' entries.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

from dra_gpu import kube
from dra_gpu.agent import claims
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.devices import model
from dra_gpu.kube import backoff
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

RETRY = backoff.Backoff(duration=1.0, cap=30.0)
"""After a failed write: 1 s doubling up to 30 s while writes keep failing (an API server
restarting), jittered; the first write that succeeds starts it over."""

_Desire = tuple[ClaimRef, list[dict[str, Any]]]
"""A claim and our entries for its ``status.devices``; compared by identity (the latest wins)."""


class StatusSink(Protocol):
    """Where prepared devices' ``status.devices`` entries go (see ``StatusWriter``)."""

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Desired entries of our driver for the claim; an empty list removes ours."""


class ClaimEntries:
    """Our ``status.devices`` entries of the claims prepared since start, and the devices'
    health conditions: a health change rewrites the entries of the claims that hold the
    device. Every change goes to ``sink``."""

    def __init__(self, sink: StatusSink, driver: str, node: str) -> None:
        self.sink = sink
        self.driver = driver
        self.node = node
        self._entries: dict[str, tuple[ClaimRef, list[dict[str, Any]]]] = {}
        self._health: dict[str, dict[str, Any]] = {}

    def entries(
        self, allocated: Sequence[claims.AllocatedDevice], devices: dict[str, model.Device]
    ) -> list[dict[str, Any]]:
        """The entries of a claim prepared with ``allocated``, as ``devices`` are now."""
        now = datetime.datetime.now(datetime.UTC)
        entries = []
        for alloc in allocated:
            device = devices[alloc.device]
            data: dict[str, Any] = {
                "uuid": device.uuid,
                "productName": device.product_name or "",
                "memory": device.memory or "",
            }
            if alloc.admin_access:
                data["adminAccess"] = True
            if alloc.share_id is not None and device.sharing is not None:
                data["sharing"] = device.sharing.mode
                data["memoryShare"] = alloc.consumed.get("memory", device.sharing.memory.default)
            health = self._health.get(alloc.device) if alloc.pool == self.node else None
            entries.append(
                claims.device_status(
                    self.driver, alloc.pool, alloc.device, data, now, health, alloc.share_id
                )
            )
        return entries

    def set(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """The claim's entries are ``entries`` now (an empty list: it holds nothing here)."""
        if entries:
            self._entries[ref.uid] = (ref, entries)
        else:
            self._entries.pop(ref.uid, None)
        self.sink.set_devices(ref, entries)

    def device_health(self, device: str, condition: dict[str, Any]) -> None:
        """``device`` of this node's pool is now as ``condition`` (``claims.health_condition``)
        says: the ``status.devices`` entries of the claims holding it say so too."""
        self._health[device] = condition
        for ref, entries in list(self._entries.values()):
            if any(e["device"] == device and e["pool"] == self.node for e in entries):
                updated = [
                    claims.with_health(e, condition)
                    if e["device"] == device and e["pool"] == self.node
                    else e
                    for e in entries
                ]
                self.set(ref, updated)


class StatusWriter:
    """The agent's ``StatusSink``: desired entries in, server-side applies out."""

    def __init__(
        self,
        api: kube.Kube,
        node: str,
        *,
        delay_seconds: float = 0.5,
        retry: backoff.Backoff = RETRY,
    ) -> None:
        self.api = api
        self.field_manager = f"dra-gpu-agent/{node}"
        self.delay_seconds = delay_seconds
        self.retries = retry.delays()
        """One back-off for the writer: consecutive failures, whichever claims they were."""
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
            self._again(uid, ref, exc)
            return
        except Exception as exc:  # API unreachable (restarting): retry later
            self._again(uid, ref, exc)
            return
        self.retries.reset()
        if entries:
            self._written.add(uid)
        else:
            self._written.discard(uid)
        self._forget(uid, desired)

    def _again(self, uid: str, ref: ClaimRef, exc: Exception) -> None:
        delay = self.retries.next()
        log.warning("status of claim %s: %s; again in %.1f s", ref, exc, delay)
        asyncio.get_running_loop().call_later(delay, self._retry, uid)

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

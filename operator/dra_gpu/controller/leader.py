"""Leader election with a coordination.k8s.io Lease: one controller replica acts at a time.

Every replica watches and keeps its view warm, so a standby takes over in one lease period, or
at once when the holder releases the lease on a clean stop (a standby watches the Lease);
only the holder of the lease writes (Events, claim status repairs, stale slice deletions). The
protocol is client-go's: the holder renews ``renewTime`` every ``renew_seconds``; another replica
takes the lease over only when ``renewTime + leaseDurationSeconds`` has passed, with an
optimistic-concurrency update (``resourceVersion``), so two replicas never both believe they lead
for longer than a renew period. A Lease needs no CRD (Kopf's peering would), and it is what
platform teams already know from kube-controller-manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from typing import Any, NoReturn

from dra_gpu import kube

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _micro(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def released(spec: dict[str, Any]) -> bool:
    """Whether nobody holds the lease (its holder gave it up on a clean stop)."""
    return not spec.get("holderIdentity")


def expired(spec: dict[str, Any], now: datetime.datetime) -> bool:
    """Whether the lease's holder missed its renewal (or nobody holds it)."""
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    if released(spec) or renewed is None:
        return True
    return now > renewed + datetime.timedelta(seconds=int(spec.get("leaseDurationSeconds", 15)))


class LeaderElector:
    def __init__(
        self,
        api: kube.Kube,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
    ) -> None:
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.is_leader = False
        self.changed = asyncio.Event()
        self._seen: str | None = None
        """The Lease's resourceVersion when another replica last held it (a standby watches
        from there)."""

    def _set(self, leading: bool) -> None:
        if leading != self.is_leader:
            self.is_leader = leading
            self.changed.set()
            log.info(
                "%s %s the lease %s", self.identity, "acquired" if leading else "lost", self.name
            )

    async def run_forever(self) -> NoReturn:
        while True:
            try:
                self._set(await self.try_acquire_or_renew())
            except Exception as exc:  # API restarting: we cannot prove we still lead
                log.warning("lease %s: %s", self.name, exc)
                self._set(False)
            if self.is_leader or self._seen is None:
                await asyncio.sleep(self.renew_seconds)
            else:  # a standby: try again at once when the holder lets go
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._released(self._seen), self.renew_seconds)

    async def _released(self, resource_version: str) -> None:
        """Returns when the Lease, as seen at ``resource_version``, is released or deleted (a
        watch of the one Lease); on a watch error, after the usual period."""
        try:
            async for event in self.api.watch_once(
                self.collection,
                resource_version,
                timeout_seconds=max(1, int(self.renew_seconds)),
                fieldSelector=f"metadata.name={self.name}",
            ):
                lease = event.get("object") or {}
                if event.get("type") == "DELETED" or released(lease.get("spec") or {}):
                    return
        except Exception as exc:  # the next try says what is wrong, if anything is
            log.debug("watching lease %s: %s", self.name, exc)
        await asyncio.sleep(self.renew_seconds)

    async def try_acquire_or_renew(self) -> bool:
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _micro(now),
        }
        self._seen = None
        try:
            lease = await self.api.get(self.path)
        except kube.ApiError as exc:
            if not exc.not_found:
                raise
            try:
                await self.api.create(
                    self.collection,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name},
                        "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0},
                    },
                )
            except kube.ApiError as create_exc:
                if create_exc.conflict:
                    return False  # another replica created it first
                raise
            return True
        current = lease.get("spec") or {}
        mine = current.get("holderIdentity") == self.identity
        if not mine and not expired(current, now):
            self._seen = lease["metadata"].get("resourceVersion")
            return False
        if not mine:
            spec["acquireTime"] = _micro(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions", 0)) + 1
        lease["spec"] = {**current, **spec}
        try:
            await self.api.replace(self.path, lease)  # carries resourceVersion: optimistic
        except kube.ApiError as exc:
            if exc.conflict:
                return False
            raise
        return True

    async def release(self) -> None:
        """Give the lease up on a clean stop so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = await self.api.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                await self.api.replace(self.path, lease)
        except Exception as exc:
            log.warning("releasing lease %s: %s", self.name, exc)
        self._set(False)

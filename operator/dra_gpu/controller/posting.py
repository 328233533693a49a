"""Posts the controller's Events: a claim's explanation once per message, and single Warnings.

Owns: the ``Reporter``. A claim's explanation is one Warning Event on the claim and one on each
pod waiting for it, with the same message and the same log line (a Normal one for an
all-clear: a claim the driver was not ready for runs). It is posted again only when its
message changes; after a controller restart (or a new leader) the last Event already on the
claim is read first, so an unchanged situation is not announced twice. ``warn`` posts one
Event on any object (the class checks' Warnings on DeviceClasses).
Must not: work out what to say (``explainer`` and ``explain`` do).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from dra_gpu import kube
from dra_gpu.kube import events
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
COMPONENT = "dra-gpu-controller"


class Reporter:
    def __init__(
        self, api: kube.Kube, host: str, leading: Callable[[], bool] = lambda: True
    ) -> None:
        self.api = api
        self.host = host
        self.leading = leading
        """Whether this replica may write now (the elector's renew deadline, read at each
        post): an Event queued by a leader that has since stopped leading is not posted."""
        self.recorder = events.Recorder(api, COMPONENT, host)
        self._posted: dict[bodies.ClaimUID, str] = {}  # -> the message last posted

    def keep_only(self, claim_uids: set[bodies.ClaimUID]) -> None:
        """Forget claims no longer pending: if one is pending again, it is explained anew."""
        for uid in set(self._posted) - claim_uids:
            del self._posted[uid]

    async def report(
        self,
        claim: kube.Body,
        pods: Sequence[kube.Body],
        reason: str,
        message: str,
        *,
        type_: str = "Warning",
    ) -> bool:
        """Post ``message`` unless it is what was last posted for this claim (``type_``
        Normal: an all-clear, e.g. the claim was prepared after all)."""
        uid = bodies.claim_uid(claim)
        if self._posted.get(uid) == message or not self.leading():
            return False
        if uid not in self._posted and await self._last_message(claim) == message:
            self._posted[uid] = message
            return False
        level = logging.WARNING if type_ == "Warning" else logging.INFO
        log.log(level, "ResourceClaim %s: %s", events.object_ref(claim)["name"], message)
        await self.warn(claim, "ResourceClaim", reason, message, type_=type_)
        for pod in pods:
            await self.warn(pod, "Pod", reason, message, type_=type_)
        metrics.EXPLAIN_EVENTS.labels(reason).inc()
        self._posted[uid] = message
        return True

    async def warn(
        self, body: kube.Body, kind: str, reason: str, message: str, *, type_: str = "Warning"
    ) -> None:
        """One Event of ours (Warning unless told) on ``body`` (a core or resource.k8s.io
        object)."""
        if not self.leading():
            return
        api_version = "v1" if kind in ("Pod", "Node") else "resource.k8s.io/v1"
        ref = events.object_ref({**body, "apiVersion": api_version, "kind": kind})
        await self.recorder.post(ref, type_=type_, reason=reason, message=message)

    async def _last_message(self, claim: kube.Body) -> str | None:
        meta = claim["metadata"]
        try:
            listing = await self.api.get(
                f"/api/v1/namespaces/{meta['namespace']}/events",
                fieldSelector=f"involvedObject.uid={meta['uid']}",
            )
        except kube.ApiError:
            return None
        ours = [e for e in listing.get("items", []) if e.get("reportingComponent") == COMPONENT]
        ours.sort(key=lambda e: e.get("eventTime") or e.get("lastTimestamp") or "")
        return str(ours[-1].get("message")) if ours else None

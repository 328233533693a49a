"""Posts the controller's Events: a claim's explanation once per meaning, and single Warnings.

Owns: the ``Reporter``. A claim's explanation is one Warning Event on the claim and one on each
pod waiting for it, with the same message and the same log line (a Normal one for an
all-clear: a claim the driver was not ready for runs). It is posted again only when its
``meanings.Meaning`` changes — the reason, the piece, what blocks — not when a count or a list
of holders in its words moves (``meanings.is_news``); the Event keeps the words as they were
when it was posted, and says what it meant in an annotation (``meanings.ANNOTATION``). After a
controller restart (or a new leader: ``forget``) the last Event already on each claim is read
first, so an unchanged situation is not announced twice: all of them with one paged list of the
controller's Events on claims (``recall``), which the first post after ``forget`` waits for —
not one request per claim before its post, which at a thousand waiting claims was a third of
a new leader's requests; a claim's own Events are read when that list could not be. ``warn``
posts one Event on any object (the class checks' Warnings on DeviceClasses).
Must not: work out what to say (``explainer`` and ``explain`` do) or what it means
(``meanings``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_gpu import kube
from dra_gpu.controller import meanings
from dra_gpu.kube import events, watch
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
COMPONENT = "dra-gpu-controller"
RECALL_PAGE = 500
"""Events per page of ``recall``'s list."""
Heard = dict[str, dict[str, Any]]
"""Claim UID -> the last Event of ours on it, cut to what ``meanings.heard`` reads."""


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
        self._posted: dict[bodies.ClaimUID, meanings.Said] = {}  # -> what was last posted
        self._recall: asyncio.Future[Heard | None] | None = None
        self.recalls = 0
        """Lists of our Events on claims so far (``recall``)."""

    def keep_only(self, claim_uids: set[bodies.ClaimUID]) -> None:
        """Forget claims no longer pending: if one is pending again, it is explained anew."""
        for uid in set(self._posted) - claim_uids:
            del self._posted[uid]
        recall = self._recall
        if recall is not None and recall.done() and not recall.cancelled():
            heard = recall.result() if recall.exception() is None else None
            for gone in set(heard or ()) - claim_uids:
                assert heard is not None
                del heard[gone]

    def forget(self) -> None:
        """Forget what was posted (this replica leads again, or for the first time): the next
        post reads first what the last Event on each claim says, as it is now (``recall``)."""
        self._posted.clear()
        self._recall = None  # one under way still answers those that wait for it

    def is_news(
        self, claim_uid: bodies.ClaimUID, reason: str, message: str, meaning: meanings.Meaning
    ) -> bool:
        """Whether ``report`` may post this: False when this replica knows it would not (what
        it last posted on the claim means the same, or says the same words)."""
        return meanings.is_news(self._posted.get(claim_uid), reason, message, meaning)

    async def report(
        self,
        claim: kube.Body,
        pods: Sequence[kube.Body],
        reason: str,
        message: str,
        *,
        meaning: meanings.Meaning,
        type_: str = "Warning",
    ) -> bool:
        """Post ``message`` unless it is no news against what was last posted for this claim
        (``meanings.is_news``; ``type_`` Normal: an all-clear, e.g. the claim was prepared after
        all). Returns whether it posted."""
        uid = bodies.claim_uid(claim)
        if not self.leading():
            return False
        last = self._posted.get(uid)
        if last is None:  # new to this replica: what did the last Event on the claim say?
            last = meanings.heard(await self._last_said(claim), meaning)
            if last is not None:
                self._posted[uid] = last
            if not self.leading():
                return False
        if not meanings.is_news(last, reason, message, meaning):
            return False
        level = logging.WARNING if type_ == "Warning" else logging.INFO
        log.log(level, "ResourceClaim %s: %s", events.object_ref(claim)["name"], message)
        said = meanings.event_annotations(meaning)
        # The claim's Event and its pods' at once (none raises: a failed post is logged).
        await asyncio.gather(
            self._post(claim, "ResourceClaim", reason, message, type_, said),
            *(self._post(pod, "Pod", reason, message, type_, said) for pod in pods),
        )
        metrics.EXPLAIN_EVENTS.labels(reason).inc()
        self._posted[uid] = meanings.Said(reason, message, meaning)
        return True

    async def warn(
        self, body: kube.Body, kind: str, reason: str, message: str, *, type_: str = "Warning"
    ) -> None:
        """One Event of ours (Warning unless told) on ``body`` (a core or resource.k8s.io
        object)."""
        if not self.leading():
            return
        await self.recorder.post(_ref(body, kind), type_=type_, reason=reason, message=message)

    async def _post(
        self,
        body: kube.Body,
        kind: str,
        reason: str,
        message: str,
        type_: str,
        annotations: Mapping[str, str],
    ) -> None:
        """``warn``, with ``annotations`` on the Event."""
        if not self.leading():
            return
        await self.recorder.post(
            _ref(body, kind), type_=type_, reason=reason, message=message, annotations=annotations
        )

    async def recall(self) -> Heard | None:
        """The last Event of ours on each claim, read with one paged list (once after each
        ``forget``; concurrent callers share it); None when it could not be read."""
        if self._recall is None:
            self._recall = asyncio.ensure_future(self._list_heard())
        return await asyncio.shield(self._recall)

    async def _list_heard(self) -> Heard | None:
        self.recalls += 1
        heard: Heard = {}
        newest: dict[str, str] = {}
        selector = f"reportingComponent={COMPONENT},involvedObject.kind=ResourceClaim"
        try:
            async for page in watch.pages(
                self.api, "/api/v1/events", RECALL_PAGE, fieldSelector=selector
            ):
                for event in page.get("items") or []:
                    uid = str((event.get("involvedObject") or {}).get("uid") or "")
                    when = str(event.get("eventTime") or event.get("lastTimestamp") or "")
                    if uid and when >= newest.get(uid, ""):
                        newest[uid] = when
                        heard[uid] = _cut_event(event)
        except kube.ApiError as exc:
            failure: Exception = exc
        except kube.CONNECTION_ERRORS as exc:
            failure = exc
        else:
            return heard
        log.warning("cannot list our Events on claims (%s): reading them claim by claim", failure)
        return None

    async def _last_said(self, claim: kube.Body) -> dict[str, Any] | None:
        """The last Event of ours on ``claim``: from ``recall``'s list, else read alone."""
        heard = await self.recall()
        if heard is None:
            return await self._last_event(claim)
        return heard.pop(str(claim["metadata"].get("uid", "")), None)

    async def _last_event(self, claim: kube.Body) -> dict[str, Any] | None:
        """The last Event of ours on the claim (core/v1 shape), None when there is none or the
        Events cannot be read."""
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
        return dict(ours[-1]) if ours else None


def _cut_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """What ``meanings.heard`` reads of an Event (its annotations, reason and words)."""
    annotations = (event.get("metadata") or {}).get("annotations") or {}
    return {
        "metadata": {"annotations": dict(annotations)},
        "reason": event.get("reason", ""),
        "message": event.get("message", event.get("note", "")),
    }


def _ref(body: kube.Body, kind: str) -> dict[str, str]:
    api_version = "v1" if kind in ("Pod", "Node") else "resource.k8s.io/v1"
    return events.object_ref({**body, "apiVersion": api_version, "kind": kind})

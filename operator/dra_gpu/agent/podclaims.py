"""The pods bound to this node and the ResourceClaims they use (pure: pod bodies in, names out).

The claim cache (``claimcache``) reads a claim when a pod bound here needs it, and keeps its
copy only while a pod of this node holds it. This module says which claims a pod uses
(``claim_keys``), whether its reservations still hold (``PodClaims.active``) and whether the
kubelet is still to prepare them (``PodClaims.starting``), and keeps, claim by claim, which
active pods of the node use it (``NodePods``).

A pod names its claims in ``spec.resourceClaims``: ``resourceClaimName`` for a claim that exists
on its own (any pods that name it share it), ``resourceClaimTemplateName`` for one the
resourceclaim controller makes for the pod, whose name ``status.resourceClaimStatuses`` gives
once it exists (absent until then; an entry without a name: none was needed). A claim is in
its pod's namespace.

Why "active": the resourceclaim controller takes a bound pod's reservation away only once the
pod has finished (phase Succeeded or Failed) or is gone, and only then may the claim be
deallocated and allocated again. A pod being deleted (``deletionTimestamp``) is not counted
either: it will not start, and its end may come at any moment.

Must not: read the API, or know what a claim holds (``claimcache``'s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from dra_gpu.resource import names

FINISHED = frozenset({"Succeeded", "Failed"})
"""Pod phases after which the kubelet runs nothing more, and the pod's reservations go."""


class ClaimKey(NamedTuple):
    """A claim by namespace and name: how a pod names it (the UID is the claim's to say)."""

    namespace: str
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodClaims:
    """What is kept of a pod: its UID, the claims it uses, and where it is in its life."""

    uid: str
    claims: frozenset[ClaimKey]
    active: bool
    """Neither finished nor being deleted: the reservations it holds stay."""
    starting: bool
    """Active and not running yet (phase Pending): the kubelet has its claims still to prepare
    (it prepares them before it starts a container, so never once the phase is Running)."""


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceClaims ``pod`` uses, as far as it says now: named claims, and
    generated ones once ``status.resourceClaimStatuses`` names them; in the pod's order,
    each once."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    found = [c.get("resourceClaimName") for c in spec.get("resourceClaims") or []]
    found += [c.get("resourceClaimName") for c in status.get("resourceClaimStatuses") or []]
    return list(dict.fromkeys(n for n in found if isinstance(n, str) and n))


def claim_keys(pod: Mapping[str, Any]) -> frozenset[ClaimKey]:
    """``claim_names`` with the pod's namespace; a name the API server would not have taken
    (which must never become part of a URL) is left out."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    if not names.is_dns_label(namespace):
        return frozenset()
    return frozenset(ClaimKey(namespace, n) for n in claim_names(pod) if names.is_dns_subdomain(n))


def pod_claims(pod: Mapping[str, Any]) -> PodClaims:
    meta = pod.get("metadata") or {}
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    active = phase not in FINISHED and not meta.get("deletionTimestamp")
    return PodClaims(
        uid=str(meta.get("uid") or ""),
        claims=claim_keys(pod),
        active=active,
        starting=active and phase == "Pending",
    )


class NodePods:
    """The active pods of this node that use claims (the others are not kept), and for each
    claim the pods that use it."""

    def __init__(self, pods: Iterable[PodClaims] = ()) -> None:
        self._pods: dict[str, PodClaims] = {}
        self._users: dict[ClaimKey, set[str]] = {}
        for pod in pods:
            self.put(pod)

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        """Whether the pod of this UID is an active pod of this node that uses claims."""
        return uid in self._pods

    def put(self, pod: PodClaims) -> set[ClaimKey]:
        """The pod as it is now (added, changed, finished or being deleted); the claims that
        no active pod of the node uses any more because of it."""
        released = self.remove(pod.uid)
        if pod.active and pod.claims and pod.uid:
            self._pods[pod.uid] = pod
            for key in pod.claims:
                self._users.setdefault(key, set()).add(pod.uid)
            released -= pod.claims
        return released

    def remove(self, uid: str) -> set[ClaimKey]:
        """The pod is gone from the node; the claims that no active pod uses any more."""
        pod = self._pods.pop(uid, None)
        if pod is None:
            return set()
        released = set()
        for key in pod.claims:
            users = self._users[key]
            users.discard(uid)
            if not users:
                del self._users[key]
                released.add(key)
        return released

    def used(self, key: ClaimKey) -> bool:
        """Whether an active pod of this node uses the claim."""
        return key in self._users

    def claims(self) -> set[ClaimKey]:
        """Every claim an active pod of this node uses."""
        return set(self._users)

    def starting(self) -> set[ClaimKey]:
        """The claims of the pods whose claims the kubelet is still to prepare."""
        return {key for pod in self._pods.values() if pod.starting for key in pod.claims}

    def starting_use(self, key: ClaimKey) -> bool:
        """Whether a pod whose claims the kubelet is still to prepare uses the claim."""
        return any(self._pods[uid].starting for uid in self._users.get(key, ()))

"""Which pod a claim was made for, and which pending claims' pods the view does not know yet.

A claim made from a pod's ResourceClaimTemplate names that pod as its controller owner
(``ownerReferences``: kind Pod, ``controller: true``), and the pod names the claim back in
``status.resourceClaimStatuses`` once the resourceclaim controller has written it (a moment
after it made the claim). A claim referenced by name (``spec.resourceClaims[].resourceClaimName``)
has no such owner: nothing on it says which pods will use it.

Owns: ``owner_pod`` (a claim's controller Pod, as a ``PodRef``) and ``unseen`` (whether a
pending claim's pod is one the view does not know as using it: the start-up reads it,
``startup``). Must not: read the API, or decide when to read (``startup`` does both).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dra_gpu.controller.view import ClusterView
from dra_gpu.resource import bodies


class PodRef(NamedTuple):
    """The pod a claim was made for."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        """``namespace/name``, as the view keys pods."""
        return f"{self.namespace}/{self.name}"


def owner_pod(claim: Mapping[str, Any]) -> PodRef | None:
    """The Pod that controls ``claim`` (a template claim's pod, in the claim's namespace);
    None for a claim without one (referenced by name, or made by something else)."""
    meta = bodies.metadata(claim)
    namespace = meta.get("namespace")
    refs = claim.get("metadata", {}).get("ownerReferences") or []
    for ref in refs:
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == "Pod"
            and ref.get("controller") is True
            and (ref.get("apiVersion") or "v1") == "v1"
            and ref.get("name")
            and namespace
        ):
            return PodRef(str(namespace), str(ref["name"]), str(ref.get("uid") or ""))
    return None


def unseen(view: ClusterView, claim_key: str) -> PodRef | None:
    """The pod ``claim_key`` was made for, when the claim is pending and no pod in the view uses
    it (the pod not handed over yet, or handed over before it named the claim); else None."""
    claim = view.claims.get(claim_key)
    if claim is None or not view.is_pending(claim_key):
        return None
    if view.pod_keys_of(claim_key):
        return None
    return owner_pod(claim)

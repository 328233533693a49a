"""Whether a pod can run on a node, in plain words: the simple part of the scheduler's filters.

Owns: ``node_exclusion``: nodeName, existence, Ready, cordon, NoSchedule/NoExecute taints the
pod does not tolerate, nodeSelector and required node affinity, each said the way a message
names it ("node node-02 is not Ready").
Must not: read anything but the Node and the pod it is given (no preferences, no other pods,
no resources but devices are modelled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Body = Mapping[str, Any]


def node_exclusion(name: str, node: Body | None, pod: Body | None) -> str | None:
    """Why the pod cannot run on node ``name``, in plain words; None if nothing stops it.

    The simple part of the scheduler's node filters: nodeName, existence, Ready, cordon,
    NoSchedule/NoExecute taints, nodeSelector, required node affinity. Without a pod, only
    what holds for any pod is checked (the node exists, is Ready and not cordoned).
    """
    pod_spec = (pod or {}).get("spec") or {}
    bound = pod_spec.get("nodeName")
    if bound and bound != name:
        return f"the pod is bound to {bound}"
    if node is None:
        return f"node {name} does not exist"
    if not _node_ready(node):
        return f"node {name} is not Ready"
    node_spec = node.get("spec") or {}
    tolerations = pod_spec.get("tolerations") or []
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    if node_spec.get("unschedulable") and not _tolerated(cordon, tolerations):
        return f"node {name} is cordoned (unschedulable)"
    if pod is None:
        return None
    for taint in node_spec.get("taints") or []:
        effect = taint.get("effect")
        if effect in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return f"node {name} has taint {_taint_text(taint)}, which the pod does not tolerate"
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    wrong = sorted(f"{k}={v}" for k, v in selector.items() if labels.get(k) != v)
    if wrong:
        return f"node {name} does not match the pod's nodeSelector {','.join(wrong)}"
    if not _affinity_allows(pod_spec, name, labels):
        return f"node {name} does not match the pod's required node affinity"
    return None


def _node_ready(node: Body) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tolerated(taint: Body, tolerations: Iterable[Body]) -> bool:
    """Kubernetes' ToleratesTaint: effect, key (an empty key with Exists matches any), value."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
            continue
        key = toleration.get("key")
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            return True
        if (
            key
            and operator == "Equal"
            and (toleration.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _taint_text(taint: Body) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _affinity_allows(pod_spec: Body, name: str, labels: Mapping[str, str]) -> bool:
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    # Terms are ORed; within a term, every expression and field must hold.
    return any(_term_matches(term, name, labels) for term in terms)


def _term_matches(term: Body, name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_requirement_holds(e, labels.get(e.get("key", ""))) for e in expressions) and all(
        f.get("key") == "metadata.name" and _requirement_holds(f, name) for f in fields
    )


def _requirement_holds(requirement: Body, value: str | None) -> bool:
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False

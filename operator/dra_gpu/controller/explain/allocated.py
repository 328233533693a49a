"""An allocated claim: the scheduler's part is done, only the kubelet's may be missing.

Owns: the explanation of an allocated claim (which devices, on which node, whether its drivers
published devices there), the driver piece when the kubelet could not prepare it
(``driver_not_ready``: which driver, on which node, since when, what the kubelet said, and
where to look), and the all-clear once its pod runs (``prepared``).
Must not: do any I/O; the ``PrepareFailure`` comes from the caller, who sees the Events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.controller import kubelet, published
from dra_gpu.controller.explain import requests, wording
from dra_gpu.controller.explain.results import Explanation, Piece, Reason
from dra_gpu.controller.published import DeviceKey
from dra_gpu.resource import bodies, names

Body = Mapping[str, Any]


def driver_not_ready(
    failure: kubelet.PrepareFailure, drivers: Sequence[str], node: str | None
) -> str:
    """The driver piece in words: which driver, on which node, since when, what the kubelet
    said, and for "not registered" where to look."""
    who = f"driver {', '.join(drivers)}" if drivers else "the driver"
    where = failure.node or node
    text = f"{who}{f' on {where}' if where else ''} has not prepared the claim"
    if failure.since:
        text += f" since {failure.since}"
    text += f"; the kubelet says: {failure.message}"
    on = f" on {where}" if where else ""
    if failure.driver is not None:
        text += (
            f" (the node agent of {failure.driver} is not running{on}, or has not registered "
            "with its kubelet yet)"
        )
    elif failure.unanswered:  # registered, but its socket does not answer
        agents = ", ".join(drivers) or "the driver"
        text += f" (the node agent of {agents}{on} does not answer: stopped, or restarting)"
    return wording.bounded(text)


def explain_allocated(
    name: str,
    claim: Body,
    pod: Body | None,
    classes: Mapping[str, Body],
    slices: Sequence[Body],
    prepare_failure: kubelet.PrepareFailure | None,
) -> Explanation:
    """An allocated claim: the scheduler's part is done; only the kubelet's may be missing."""
    allocation: Body = bodies.allocation(claim) or {}
    results = bodies.allocation_results(claim)
    node = ((pod or {}).get("spec") or {}).get("nodeName") or _allocation_node(allocation)
    attached = _attached_nodes(slices)
    labels = [
        f"{attached.get(published.result_key(r)) or r.get('pool')}/{r.get('device')}"
        for r in sorted(
            results, key=lambda r: (names.natural(str(r.get("pool"))), published.result_key(r))
        )
    ]
    allocated = f"allocated {', '.join(labels)}" if labels else "allocated"
    named = requests.class_names(claim)
    class_reason = (
        f"device class {', '.join(named)} exists"
        if all(c in classes for c in named)
        else f"allocated with device class {', '.join(named)}"
    )
    if ((pod or {}).get("spec") or {}).get("nodeName"):
        node_reason = f"the pod is bound to {node}"
    else:
        node_reason = f"allocated for {node}" if node else "allocated for any node"
    drivers = sorted({str(r.get("driver")) for r in results})
    publishing = set(_slice_nodes(slices))
    not_ready = driver_not_ready(prepare_failure, drivers, node) if prepare_failure else None
    if not_ready is not None:
        driver = Piece("driver", False, not_ready)
    elif node and drivers and all((d, node) in publishing for d in drivers):
        driver = Piece("driver", True, f"{', '.join(drivers)} published devices for {node}")
    else:
        driver = Piece("driver", True, "no prepare error reported")
    pieces = (
        Piece("class", True, class_reason),
        Piece("devices", True, allocated),
        Piece("node", True, node_reason),
        driver,
    )
    if not_ready is not None:
        return Explanation(name, Reason.DRIVER_NOT_READY, not_ready, pieces)
    return Explanation(name, Reason.ALLOCATED, allocated + (f" on {node}" if node else ""), pieces)


def prepared(claim: Body, pod: Body, classes: Mapping[str, Body]) -> Explanation:
    """The all-clear for a claim once explained as ``DRIVER_NOT_READY``: its pod left Pending,
    so the driver prepared it."""
    meta = claim.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    base = explain_allocated(name, claim, pod, classes, (), None)
    drivers = sorted({str(r.get("driver")) for r in bodies.allocation_results(claim)})
    pod_meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    message = (
        f"driver {', '.join(drivers) or '?'}{f' on {node}' if node else ''} prepared the claim: "
        f"pod {pod_meta.get('namespace')}/{pod_meta.get('name')} is "
        f"{(pod.get('status') or {}).get('phase', 'Pending')}"
    )
    return dataclasses.replace(base, reason=Reason.PREPARED, message=message)


def _allocation_node(allocation: Body) -> str | None:
    """The node of a node-local allocation: ``matchFields metadata.name In [node]``."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    found = {
        str(value)
        for term in terms
        for field in term.get("matchFields") or []
        if field.get("key") == "metadata.name" and field.get("operator") == "In"
        for value in field.get("values") or []
    }
    return found.pop() if len(found) == 1 else None


def _attached_nodes(slices: Sequence[Body]) -> dict[DeviceKey, str]:
    """Device -> the node it is attached to, from the slices."""
    attached: dict[DeviceKey, str] = {}
    for body in slices:
        spec = body.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name"))
        for device in spec.get("devices") or []:
            node = device.get("nodeName") or spec.get("nodeName")
            if node:
                attached[(str(spec.get("driver")), pool, str(device.get("name")))] = str(node)
    return attached


def _slice_nodes(slices: Sequence[Body]) -> Iterable[tuple[str, str]]:
    """(driver, node) of every node-local slice."""
    for body in slices:
        spec = body.get("spec") or {}
        if spec.get("nodeName"):
            yield str(spec.get("driver")), str(spec["nodeName"])

"""The entry points: a claim explained as a whole, from its requests' explanations.

Owns: ``explain_claim`` (a claim against lists of bodies), ``explain`` (against a World built
beforehand, shared by many claims), how the requests' results sum up to the claim's reason,
message and pieces (the most important missing piece first; a node that satisfies every
request; the kubelet's prepare failure), and ``format_pieces``, the CLI's text.
Must not: do any I/O or change its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.controller import claimed, kubelet
from dra_gpu.controller.explain import allocated, requests, results, wording
from dra_gpu.controller.explain.results import Explanation, Piece, Reason, RequestExplanation
from dra_gpu.controller.explain.world import Layout, World, build_world
from dra_gpu.resource import bodies

Body = Mapping[str, Any]


def explain_claim(
    claim: Body,
    *,
    pod: Body | None = None,
    classes: Mapping[str, Body],
    slices: Sequence[Body],
    claims: Sequence[Body],
    nodes: Mapping[str, Body],
    prepare_failure: kubelet.PrepareFailure | None = None,
) -> Explanation:
    """Explain ``claim`` against the cluster as the caller's caches show it.

    ``classes`` and ``nodes`` map names to bodies; ``slices`` are all ResourceSlices (every
    driver); ``claims`` may include ``claim`` itself (it never counts as holding a device).
    ``pod`` is the pod that uses the claim, if known: without it, tolerations, nodeSelector,
    node affinity and ``nodeName`` are not checked. ``prepare_failure`` is the kubelet's
    latest FailedPrepareDynamicResources on the pod (e.g. "DRA driver gpu.example.com is not
    registered"), which only the caller can see, in Events: the driver piece.
    """
    if bodies.allocation(claim) or (claim.get("metadata") or {}).get("deletionTimestamp"):
        found = World(Layout(()), claimed.HolderIndex(), nodes, slices)  # not read
    else:
        found = build_world(slices, claims, nodes)
    return explain(claim, found, classes=classes, pod=pod, prepare_failure=prepare_failure)


def explain(
    claim: Body,
    world: World,
    *,
    classes: Mapping[str, Body],
    pod: Body | None = None,
    prepare_failure: kubelet.PrepareFailure | None = None,
    detail: bool = True,
) -> Explanation:
    """``explain_claim`` against a World built beforehand, shared by many claims.

    ``detail=False`` leaves out each request's ``devices`` (every published device, with its
    verdict): the reason, message and pieces are the same, at a fraction of the cost.
    """
    meta = claim.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    if bodies.allocation(claim):
        return allocated.explain_allocated(
            name, claim, pod, classes, world.slice_list(), prepare_failure
        )
    if meta.get("deletionTimestamp"):
        return Explanation(
            name,
            Reason.CLAIM_DELETING,
            f"resourceclaim {name} is being deleted",
            results.unchecked(),
        )
    scope = world.scope(claim, pod, detail=detail)
    devices_spec = (claim.get("spec") or {}).get("devices") or {}
    explained = tuple(
        requests.explain_request(r, scope, classes) for r in devices_spec.get("requests") or []
    )
    return _summarize(name, explained, bool(devices_spec.get("constraints")), prepare_failure, pod)


def format_pieces(explanation: Explanation) -> str:
    """The CLI's text: one line per piece, each ending in a newline, e.g.
    ``class    OK   device class gpu-inferencia exists``."""
    return "".join(f"{p.name:<8} {p.status:<4} {p.reason}\n" for p in explanation.pieces)


def _summarize(
    name: str,
    explained: tuple[RequestExplanation, ...],
    has_constraints: bool,
    prepare_failure: kubelet.PrepareFailure | None,
    pod: Body | None,
) -> Explanation:
    """The claim from its requests' explanations (``explained``, in the claim's order)."""
    pieces = results.combine_pieces([r.pieces for r in explained], any_of=False)
    not_ready = None
    if prepare_failure is not None:
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        not_ready = allocated.driver_not_ready(prepare_failure, (), node)
        pieces = results.with_piece(pieces, Piece("driver", False, not_ready))
    failing = sorted(
        (r for r in explained if not r.satisfied), key=lambda r: results.SEVERITY[r.reason]
    )
    if failing:
        message = wording.join_messages([r.message for r in failing])
        return Explanation(name, failing[0].reason, message, pieces, explained)
    common = sorted(set.intersection(*(set(r.nodes) for r in explained))) if explained else []
    if explained and not common:
        where = "; ".join(
            f"request {r.request} fits on {wording.node_list(r.nodes)}" for r in explained
        )
        message = wording.bounded(f"no node satisfies every request: {where}")
        pieces = results.with_piece(pieces, Piece("node", False, message))
        return Explanation(name, Reason.NO_COMMON_NODE, message, pieces, explained)
    if not_ready is not None:
        return Explanation(name, Reason.DRIVER_NOT_READY, not_ready, pieces, explained)
    if not explained:
        return Explanation(name, Reason.SATISFIABLE, "the claim explained no devices", pieces)
    message = (
        f"no missing piece found: every request can be satisfied on {wording.node_list(common)}"
    )
    if has_constraints:
        message += " (constraints are not checked)"
    return Explanation(name, Reason.SATISFIABLE, message, pieces, explained)

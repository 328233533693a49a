"""``dra-gpu explain``: the controller's reasoning, on demand, by kubectl's habits.

``explain pod/NAME | resourceclaim/NAME`` prints the tutorial's four pieces — class, devices,
node, driver — of each of its claims, satisfied or not, with the reason; without a target (in
``-n``'s namespace, every namespace with ``-A``, the pods matching ``-l``) a ``kubectl get``
table of the waiting claims and their missing pieces. ``-o wide`` adds each request's devices
(or the message column), ``-o json|yaml`` prints ``explain.to_dict`` of each claim. The
cluster is read once (``snapshot``) and explained by the same ``explain`` logic the controller
runs; ``Answer.satisfied`` is whether nothing explained misses a piece (``cli``'s exit code).
The counts and holders it prints ("and 170 more are allocated", "held by ns/a") are the
cluster's now: the controller's Event on a claim keeps them as they were when it was posted,
since it posts again only when the explanation's meaning changes (``meanings``).

Whatever stops it is one ``ExplainError``, ``kube.ConfigError``, ``kube.Unreachable`` or
``kube.Refused`` whose message says what to do; ``cli`` turns each into its exit code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu import kube
from dra_gpu.controller import explain, kubelet, output, snapshot
from dra_gpu.controller.view import ClusterView
from dra_gpu.resource import bodies

READS = (
    "DeviceClasses, ResourceClaims, ResourceSlices and Nodes, and the namespace's Pods and Events"
)
KINDS = ("DeviceClass", "ResourceClaim", "ResourceSlice", "Node", "DeviceTaintRule")
POD_KINDS = ("pod", "pods", "po")
CLAIM_KINDS = ("resourceclaim", "resourceclaims", "resourceclaim.resource.k8s.io")


class ExplainError(snapshot.CommandError):
    """The target cannot be explained (not found, the API server answered with an error)."""


class BadTarget(ExplainError):
    """Not ``pod/NAME`` or ``resourceclaim/NAME``, or a target with ``-A`` or ``-l``: a usage
    error."""


@dataclasses.dataclass(frozen=True)
class Query:
    """What to explain, as the flags say."""

    target: str | None = None
    namespace: str | None = None
    """``-n``; None: the kubeconfig context's namespace, else ``default``."""
    all_namespaces: bool = False
    selector: str | None = None
    output: str = ""
    """``""`` (text or table), ``wide``, ``json`` or ``yaml``."""

    def checked(self) -> tuple[str, str] | None:
        """The target's (kind, name), None without one; ``BadTarget`` as kubectl words it."""
        if self.target is None:
            return None
        if self.all_namespaces:
            raise BadTarget(f"{self.target}: a target cannot be explained across all namespaces")
        if self.selector is not None:
            raise BadTarget(f"{self.target}: a target cannot be given with a selector (-l)")
        kind, _, name = self.target.partition("/")
        kind = kind.lower()
        if not name or kind not in POD_KINDS + CLAIM_KINDS:
            raise BadTarget(f"{self.target!r}: expected pod/NAME or resourceclaim/NAME")
        return ("pod" if kind in POD_KINDS else "resourceclaim"), name


@dataclasses.dataclass(frozen=True)
class Row:
    """One claim explained, and the pods that use it (``ns/name``)."""

    explanation: explain.Explanation
    pods: tuple[str, ...] = ()

    @property
    def namespace(self) -> str:
        return self.explanation.claim.partition("/")[0]

    @property
    def name(self) -> str:
        return self.explanation.claim.partition("/")[2]


@dataclasses.dataclass(frozen=True)
class Answer:
    """What to print on stdout, a note for stderr, and the claims explained."""

    text: str
    rows: tuple[Row, ...] = ()
    note: str = ""

    @property
    def satisfied(self) -> bool:
        return not any(row.explanation.missing for row in self.rows)


async def explain_command(
    kubeconfig: Path | None, query: Query, *, source: str | None = None, context: str | None = None
) -> Answer:
    """``source``: where ``kubeconfig`` came from, for the messages (``--kubeconfig``)."""
    target = query.checked()
    async with snapshot.session(kubeconfig, source=source, context=context, needs=READS) as api:
        namespace = (
            None if query.all_namespaces else (query.namespace or api.namespace or "default")
        )
        if target is not None:
            assert namespace is not None
            rows = await explain_one(api, target[0], target[1], namespace)
            if isinstance(rows, str):
                return Answer(rows)
            return Answer(render_target(rows, query.output), rows)
        rows = await explain_waiting(api, namespace, query.selector, detail=bool(query.output))
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        note = "" if rows else f"No waiting ResourceClaims found in {where}."
        text = ""
        if rows or query.output in ("json", "yaml"):
            text = render_list(rows, query.output, all_namespaces=namespace is None)
        return Answer(text, rows, note)


async def explain_target(
    kubeconfig: Path | None, target: str, namespace: str, *, source: str | None = None
) -> str:
    """The text ``dra-gpu explain TARGET -n NAMESPACE`` prints."""
    return (await explain_command(kubeconfig, Query(target, namespace), source=source)).text


# ---- reading and explaining ------------------------------------------------------------------


async def explain_one(
    api: kube.Kube, kind: str, name: str, namespace: str
) -> tuple[Row, ...] | str:
    """The rows of a target, or the text for a pod that uses no claim."""
    view = await snapshot.load_view(api, KINDS, pods_in=namespace)
    if kind == "pod":
        pod = view.pods.get(f"{namespace}/{name}")
        if pod is None:
            raise ExplainError(f"pod {namespace}/{name} not found: check the name and -n")
        claims = [c for c in view.claims.values() if pod in view.pods_of(c)]
        if not claims:
            return f"pod {namespace}/{name} uses no ResourceClaim (yet)\n"
    else:
        claim = view.claims.get(f"{namespace}/{name}")
        if claim is None:
            raise ExplainError(f"resourceclaim {namespace}/{name} not found: check the name and -n")
        claims = [claim]
        pods = view.pods_of(claim)
        pod = pods[0] if pods else None
    failures = await prepare_failures(api, namespace, [pod] if pod else [])
    failure = failures.get(bodies.key(pod)) if pod else None
    return tuple(
        Row(
            explain.explain_claim(
                claim,
                pod=pod,
                classes=view.classes,
                slices=view.tainted_slices(),
                claims=list(view.claims.values()),
                nodes=view.nodes,
                prepare_failure=failure,
            ),
            tuple(bodies.key(p) for p in view.pods_of(claim)),
        )
        for claim in sorted(claims, key=lambda c: c["metadata"]["name"])
    )


async def explain_waiting(
    api: kube.Kube, namespace: str | None, selector: str | None, *, detail: bool
) -> tuple[Row, ...]:
    """The waiting claims of ``namespace`` (None: all): not allocated, or allocated to a pod
    still Pending after the kubelet failed to prepare them; with ``selector``, every claim of
    the matching pods."""
    view = await snapshot.load_view(
        api,
        KINDS,
        pods_in=namespace,
        all_pods=namespace is None,
        selector=selector,
        pods_without_claims=False,
    )
    failures = await prepare_failures(api, namespace, list(view.pods.values()))
    world = explain.build_world(view.tainted_slices(), list(view.claims.values()), view.nodes)
    rows = []
    for key in sorted(chosen_claims(view, namespace, selector is not None, failures)):
        claim = view.claims[key]
        pods = view.pods_of(claim)
        pod = pods[0] if pods else None
        explained = explain.explain(
            claim,
            world,
            classes=view.classes,
            pod=pod,
            prepare_failure=failures.get(bodies.key(pod)) if pod else None,
            detail=detail,
        )
        rows.append(Row(explained, tuple(bodies.key(p) for p in pods)))
    return tuple(rows)


def chosen_claims(
    view: ClusterView,
    namespace: str | None,
    selected: bool,
    failures: Mapping[str, kubelet.PrepareFailure],
) -> set[str]:
    """Keys of the claims a listing explains: those of the view's pods when they were
    selected (``-l``), else the pending claims and those whose pod the kubelet failed to
    prepare, in ``namespace`` (None: all)."""
    if selected:
        return {c for pod in view.pods for c in view.claim_keys_of_pod(pod) if c in view.claims}
    found = {
        key for key in view.pending_keys() if namespace is None or key.startswith(f"{namespace}/")
    }
    found |= {c for pod in failures for c in view.claim_keys_of_pod(pod) if c in view.claims}
    return found


async def prepare_failures(
    api: kube.Kube, namespace: str | None, pods: Sequence[kube.Body]
) -> dict[str, kubelet.PrepareFailure]:
    """Pod key -> the kubelet's latest FailedPrepareDynamicResources on it, for the ``pods``
    still Pending (once a pod left Pending its claims were prepared, and the event is
    history): one list of such Events, of one pod when there is one."""
    pending = {
        str(p["metadata"].get("uid")): bodies.key(p)
        for p in pods
        if (p.get("status") or {}).get("phase", "Pending") == "Pending"
    }
    if not pending:
        return {}
    selector = f"reason={kubelet.PREPARE_FAILED}"
    if len(pending) == 1:
        selector = f"involvedObject.uid={next(iter(pending))},{selector}"
    path = snapshot.namespaced("/api/v1/events", namespace)
    events = await snapshot.list_items(api, path, fieldSelector=selector)
    latest: dict[str, kube.Body] = {}
    for event in sorted(events, key=lambda e: e.get("lastTimestamp") or ""):
        uid = str((event.get("involvedObject") or {}).get("uid"))
        if uid in pending:
            latest[pending[uid]] = event
    return {
        pod: failure
        for pod, event in latest.items()
        if (failure := kubelet.prepare_failure(event)) is not None
    }


# ---- printing (pure) ---------------------------------------------------------------------------


def document(rows: Sequence[Row]) -> dict[str, Any]:
    """``-o json|yaml``: ``{"explanations": [explain.to_dict + "pods"]}``."""
    return {
        "explanations": [{**explain.to_dict(r.explanation), "pods": list(r.pods)} for r in rows]
    }


def missing(explanation: explain.Explanation) -> str:
    """The pieces missing, ``devices`` or ``node,driver``; empty when none."""
    return ",".join(p.name for p in explanation.pieces if p.satisfied is False)


def render_target(rows: Sequence[Row], out: str) -> str:
    """A target's claims: the four pieces each (``wide``: and each request's devices)."""
    if out in ("json", "yaml"):
        return output.dump(document(rows), out)
    text = []
    for row in rows:
        text.append(f"ResourceClaim {row.explanation.claim}:\n")
        text.append(explain.format_pieces(row.explanation))
        if out == "wide":
            text.extend(_request_lines(row.explanation.requests, ""))
    return "".join(text)


def _request_lines(requests: Sequence[explain.RequestExplanation], indent: str) -> list[str]:
    lines = []
    for r in requests:
        lines.append(f"{indent}request {r.request} ({r.device_class}): {r.reason}: {r.message}\n")
        lines.extend(f"{indent}  {d.verdict:<12} {d.text}\n" for d in r.devices)
        lines.extend(f"{indent}  note         {note}\n" for note in r.notes)
        lines.extend(_request_lines(r.subrequests, indent + "  "))
    return lines


def render_list(rows: Sequence[Row], out: str, *, all_namespaces: bool) -> str:
    """The claims as ``kubectl get`` prints them: NAMESPACE (with ``-A``), CLAIM, POD,
    MISSING, REASON, and with ``wide`` MESSAGE."""
    if out in ("json", "yaml"):
        return output.dump(document(rows), out)
    headers = ["namespace"] * all_namespaces + ["claim", "pod", "missing", "reason"]
    headers += ["message"] * (out == "wide")
    table = []
    for row in rows:
        pods = ",".join(p.partition("/")[2] for p in row.pods)
        cells = [row.namespace] * all_namespaces + [row.name, pods]
        cells += [missing(row.explanation), str(row.explanation.reason)]
        cells += [row.explanation.message] * (out == "wide")
        table.append(cells)
    return output.table(headers, table)

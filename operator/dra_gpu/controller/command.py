"""``dra-gpu explain pod/NAME | resourceclaim/NAME``: the controller's reasoning, on demand.

Reads what the controller watches (classes, claims, slices, nodes, the pod) once, runs the same
``explain`` logic, and prints the tutorial's four pieces — class, devices, node, driver — each
satisfied or not, with the reason.

Whatever stops it is one ``ExplainError``, ``kube.ConfigError``, ``kube.Unreachable`` or
``kube.Refused`` whose message says what to do; ``cli`` turns each into its exit code.
"""

from __future__ import annotations

from pathlib import Path

from dra_gpu import kube
from dra_gpu.controller import explain, kubelet
from dra_gpu.controller.view import ClusterView

RESOURCE = "/apis/resource.k8s.io/v1"


class ExplainError(Exception):
    """The target cannot be explained (bad name, not found, the API server answered with an
    error); the message says why."""


class BadTarget(ExplainError):
    """Not ``pod/NAME`` or ``resourceclaim/NAME``: a usage error."""


READS = (
    "DeviceClasses, ResourceClaims, ResourceSlices and Nodes, and the namespace's Pods and Events"
)


async def load_view(api: kube.Kube, namespace: str) -> ClusterView:
    view = ClusterView()
    for kind, path in (
        ("DeviceClass", f"{RESOURCE}/deviceclasses"),
        ("ResourceClaim", f"{RESOURCE}/resourceclaims"),
        ("ResourceSlice", f"{RESOURCE}/resourceslices"),
        ("Node", "/api/v1/nodes"),
        ("Pod", f"/api/v1/namespaces/{namespace}/pods"),
    ):
        for item in (await api.get(path)).get("items", []):
            view.apply(kind, "ADDED", item)
    return view


async def prepare_failure(api: kube.Kube, pod: kube.Body) -> kubelet.PrepareFailure | None:
    """The kubelet's latest FailedPrepareDynamicResources on the pod, if any, while it
    matters: once the pod left Pending its claims were prepared, and the event is history."""
    if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
        return None
    meta = pod["metadata"]
    listing = await api.get(
        f"/api/v1/namespaces/{meta['namespace']}/events",
        fieldSelector=f"involvedObject.uid={meta['uid']},reason={kubelet.PREPARE_FAILED}",
    )
    items = sorted(listing.get("items", []), key=lambda e: e.get("lastTimestamp") or "")
    return kubelet.prepare_failure(items[-1]) if items else None


async def explain_target(
    kubeconfig: Path | None, target: str, namespace: str, *, source: str | None = None
) -> str:
    """``source``: where ``kubeconfig`` came from, for the messages (``--kubeconfig``)."""
    kind, _, name = target.partition("/")
    kind = kind.lower()
    if not name or kind not in ("pod", "pods", "resourceclaim", "resourceclaims"):
        raise BadTarget(f"{target!r}: expected pod/NAME or resourceclaim/NAME")
    async with await kube.Kube.connect(kubeconfig, source=source) as api:
        try:
            await api.probe()
            return await _explain(api, kind, name, namespace)
        except kube.ApiError as exc:
            if exc.status in (401, 403):
                raise api.refused(exc, needs=f"explain reads {READS}") from exc
            raise ExplainError(f"the API server at {api.server} answered: {exc}") from exc
        except kube.CONNECTION_ERRORS as exc:
            raise api.unreachable(exc) from exc


async def _explain(api: kube.Kube, kind: str, name: str, namespace: str) -> str:
    view = await load_view(api, namespace)
    if kind.startswith("pod"):
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
    failure = await prepare_failure(api, pod) if pod else None
    out = []
    for claim in sorted(claims, key=lambda c: c["metadata"]["name"]):
        result = explain.explain_claim(
            claim,
            pod=pod,
            classes=view.classes,
            slices=list(view.slices.values()),
            claims=list(view.claims.values()),
            nodes=view.nodes,
            prepare_failure=failure,
        )
        out.append(f"ResourceClaim {namespace}/{claim['metadata']['name']}:\n")
        out.append(explain.format_pieces(result))
    return "".join(out)

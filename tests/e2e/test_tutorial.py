"""The user's tutorial, all four steps, replayed against the real control plane.

It applies the manifests in crds-examples/ exactly as shipped, with the built kubectl, and checks
what the tutorial tells its reader to look at: the claim generated from the template, the
scheduler's two FailedScheduling messages, the allocation of gpu-0 (never the 8Gi gpu-1) on
node-01, the kubelet's `DRA driver gpu.example.com is not registered` (no driver runs here),
and the four events in order as ``kubectl get events --sort-by=.lastTimestamp`` prints them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import KubeletStandIn, eventually
from tests.e2e.helpers import EXAMPLES, Kubectl, events_of

DRA_KINDS = {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"}
# Served besides the tutorial's four where the feature is on by default (GA in 1.37).
LATER_KINDS = {"DeviceTaintRule"}


@pytest_asyncio.fixture
async def tutorial_cluster_objects(api: kube.Kube) -> AsyncIterator[None]:
    """The tutorial's DeviceClass and hand-made slice are cluster-scoped: remove them after."""
    yield
    await api.delete("/apis/resource.k8s.io/v1/deviceclasses/gpu-inferencia")
    await api.delete("/apis/resource.k8s.io/v1/resourceslices/nodo-simulado-gpu")


async def test_resource_api_group_has_the_four_dra_kinds(kubectl: Kubectl) -> None:
    out = await kubectl("api-resources", "--api-group=resource.k8s.io", "--no-headers")
    kinds = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert kinds >= DRA_KINDS
    assert kinds - DRA_KINDS <= LATER_KINDS


async def _pod(api: kube.Kube, ns: str) -> kube.Body | None:
    pods = await api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=recomendador")
    items = pods["items"]
    return items[0] if len(items) == 1 else None


async def _claims(api: kube.Kube, ns: str) -> list[kube.Body]:
    listing = await api.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
    claims: list[kube.Body] = listing["items"]
    return claims


async def _event_with(api: kube.Kube, ns: str, reason: str, text: str) -> kube.Body | None:
    for event in await events_of(api, ns):
        if event.get("reason") == reason and text in event.get("message", ""):
            return event
    return None


def _when(event: kube.Body) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime"))


async def test_tutorial_without_a_driver_ends_with_driver_not_registered(
    api: kube.Kube,
    kubectl: Kubectl,
    kubelet: KubeletStandIn,
    namespace: str,
    tutorial_cluster_objects: None,
) -> None:
    ns = namespace

    # Step 1: apply recomendador.yaml. The pod is Pending; its claim exists, owned by the Pod.
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
    pod = await eventually(lambda: _pod(api, ns), what="the recomendador pod")
    pod_name, pod_uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    claims = await eventually(lambda: _claims(api, ns), what="a ResourceClaim from the template")
    assert len(claims) == 1
    claim = claims[0]
    assert claim["metadata"]["name"].startswith(f"{pod_name}-gpu-")
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", pod_name, pod_uid)
    jsonpath = await kubectl(
        "get",
        "resourceclaim",
        "-n",
        ns,
        "-o",
        "jsonpath={.items[0].metadata.ownerReferences[0].kind}",
    )
    assert jsonpath == "Pod"

    # Step 2: the first message names the missing class.
    missing_class = await eventually(
        lambda: _event_with(
            api, ns, "FailedScheduling", "device class gpu-inferencia does not exist"
        ),
        what="FailedScheduling: device class gpu-inferencia does not exist",
    )
    assert missing_class["message"].startswith("0/3 nodes are available")
    pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod_name}")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")

    # The operator's hat: create the class, leave the pod alone. The scheduler retries.
    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    no_devices = await eventually(
        lambda: _event_with(api, ns, "FailedScheduling", "cannot allocate all claims"),
        what="FailedScheduling: cannot allocate all claims",
    )
    assert "0/3 nodes are available: 3 cannot allocate all claims" in no_devices["message"]

    # Step 3: publish two devices by hand. The selector rules out the 8Gi one.
    await kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))

    async def allocated() -> kube.Body | None:
        claim = (await _claims(api, ns))[0]
        status = claim.get("status", {})
        return claim if status.get("allocation") and status.get("reservedFor") else None

    claim = await eventually(allocated, what="the claim allocated and reserved")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["device"], r["request"]) for r in results] == [
        ("gpu.example.com", "node-01", "gpu-0", "gpu")
    ]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod_name, "uid": pod_uid}
    ]
    devices = await kubectl(
        "get",
        "resourceclaim",
        "-n",
        ns,
        "-o",
        "jsonpath={range .items[*]}{.status.allocation.devices.results[0].device}{end}",
    )
    assert devices == "gpu-0"

    async def bound() -> kube.Body | None:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod_name}")
        return pod if pod["spec"].get("nodeName") else None

    pod = await eventually(bound, what="the pod bound to a node")
    assert pod["spec"]["nodeName"] == "node-01"
    assert pod["metadata"]["uid"] == pod_uid, "the pod was never touched, only retried"
    scheduled = await eventually(
        lambda: _event_with(
            api, ns, "Scheduled", f"Successfully assigned {ns}/{pod_name} to node-01"
        ),
        what="Scheduled event",
    )
    # The scheduler records through events.k8s.io: eventTime is set, lastTimestamp is not.
    times = [_when(e) for e in (missing_class, no_devices, scheduled)]
    assert times == sorted(times), times

    # Step 4: no driver runs on node-01, so the kubelet cannot prepare gpu-0.
    not_registered = await eventually(
        lambda: _event_with(
            api, ns, "FailedPrepareDynamicResources", "DRA driver gpu.example.com is not registered"
        ),
        what="FailedPrepareDynamicResources: DRA driver gpu.example.com is not registered",
    )
    assert not_registered["message"] == (
        "Failed to prepare dynamic resources: prepare dynamic resources: "
        "DRA driver gpu.example.com is not registered"
    )
    assert not_registered["source"] == {"component": "kubelet", "host": "node-01"}
    pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod_name}")
    assert pod["status"]["phase"] == "Pending"

    # The four events in a row, read as the tutorial reads them.
    table = await kubectl(
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "involvedObject.kind=Pod",
        "--sort-by=.lastTimestamp",
        "--no-headers",
    )
    rows = [line for line in table.splitlines() if line.strip()]
    order = [
        next(i for i, row in enumerate(rows) if needle in row)
        for needle in (
            "device class gpu-inferencia does not exist",
            "cannot allocate all claims",
            f"Successfully assigned {ns}/{pod_name} to node-01",
            "DRA driver gpu.example.com is not registered",
        )
    ]
    assert order == sorted(order), f"events out of order:\n{table}"
    assert all("FailedScheduling" in rows[i] for i in order[:2]), table
    assert "Scheduled" in rows[order[2]], table
    assert "FailedPrepareDynamicResources" in rows[order[3]], table

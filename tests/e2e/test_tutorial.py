"""The user's tutorial on real nodes, then the driver installed with ``helm install``.

Three real kubelets on containerd. The manifests of crds-examples/ are applied as shipped and
the cluster answers the tutorial's four messages, the fourth — ``DRA driver gpu.example.com is
not registered`` — from the real kubelet. Then the tutorial's hand-made slice is removed and the
chart is installed (its images imported into each node's containerd, no registry): the agents'
DaemonSet pods publish the GPUs, the kubelet's next retry prepares gpu-0 through the
containerized agent, containerd injects the claim's CDI edits, and the pod runs with the GPU in
its environment, as read with ``kubectl exec``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.controller.command import explain_target
from dra_gpu.testing import ControlPlane, RealNode, eventually
from tests.e2e.helpers import EXAMPLES, REPO, Helm, Kubectl, event_with, server_minor

RESOURCE = "/apis/resource.k8s.io/v1"
RELEASE, RELEASE_NS = "dra-gpu", "dra-gpu"
DRA_KINDS = {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"}
# Served besides the tutorial's four where the feature is on by default (GA in 1.37).
LATER_KINDS = {"DeviceTaintRule"}
ACT_TWO_CLASSES = ("gpu-compartida", "gpu-mig-2g")


@pytest_asyncio.fixture
async def tutorial_cluster_objects(api: kube.Kube, helm: Helm) -> AsyncIterator[None]:
    yield
    await helm.run("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", "--timeout=120s")
    for name in ("gpu-inferencia", *ACT_TWO_CLASSES):
        await api.delete(f"{RESOURCE}/deviceclasses/{name}")
    await api.delete(f"{RESOURCE}/resourceslices/nodo-simulado-gpu")


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
    claims: list[kube.Body] = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
    return claims


async def test_tutorial_on_real_nodes_then_helm_install_runs_the_pod_with_gpu_0(
    api: kube.Kube,
    kubectl: Kubectl,
    helm: Helm,
    nodes: list[RealNode],
    control_plane: ControlPlane,
    tutorial_cluster_objects: None,
    namespace: str,  # after the release: removed before it, while the driver can unprepare
) -> None:
    ns = namespace
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
    pod = await eventually(lambda: _pod(api, ns), what="the recomendador pod")
    pod_name, pod_uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    claims = await eventually(
        lambda: _claims(api, ns), what="the ResourceClaim generated from the template"
    )
    assert len(claims) == 1
    claim = claims[0]
    assert claim["metadata"]["name"].startswith(f"{pod_name}-gpu-")
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", pod_name, pod_uid)

    # The four messages, in order, as the tutorial shows them.
    missing_class = await eventually(
        lambda: event_with(
            api, ns, "FailedScheduling", "device class gpu-inferencia does not exist"
        ),
        what="FailedScheduling: device class gpu-inferencia does not exist",
    )
    assert missing_class["message"].startswith("0/3 nodes are available")
    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    no_devices = await eventually(
        lambda: event_with(api, ns, "FailedScheduling", "cannot allocate all claims"),
        what="FailedScheduling: cannot allocate all claims",
    )
    assert "0/3 nodes are available: 3 cannot allocate all claims" in no_devices["message"]
    await kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))
    await eventually(
        lambda: event_with(
            api, ns, "Scheduled", f"Successfully assigned {ns}/{pod_name} to node-01"
        ),
        what="Scheduled on node-01",
    )
    not_registered = await eventually(
        lambda: event_with(
            api, ns, "FailedPrepareDynamicResources", "DRA driver gpu.example.com is not registered"
        ),
        what="the real kubelet: DRA driver gpu.example.com is not registered",
    )
    assert not_registered["source"] == {"component": "kubelet", "host": "node-01"}
    assert not_registered["message"] == (
        "Failed to prepare dynamic resources: prepare dynamic resources: "
        "DRA driver gpu.example.com is not registered"
    )
    claim = (await _claims(api, ns))[0]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["device"], r["request"]) for r in results] == [
        ("gpu.example.com", "node-01", "gpu-0", "gpu")
    ]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod_name, "uid": pod_uid}
    ]
    table = await kubectl(
        *("get", "events", "-n", ns, "--field-selector", "involvedObject.kind=Pod"),
        *("--sort-by=.lastTimestamp", "--no-headers"),
    )
    rows = [line for line in table.splitlines() if line.strip()]
    # The tutorial's four messages, as the scheduler and the kubelet say them (the controller's
    # own explanations of the same states sit between them).
    order = [
        next(i for i, row in enumerate(rows) if reason in row.split() and needle in row)
        for reason, needle in (
            ("FailedScheduling", "device class gpu-inferencia does not exist"),
            ("FailedScheduling", "cannot allocate all claims"),
            ("Scheduled", f"Successfully assigned {ns}/{pod_name} to node-01"),
            ("FailedPrepareDynamicResources", "DRA driver gpu.example.com is not registered"),
        )
    ]
    assert order == sorted(order), f"events out of order:\n{table}"

    # The driver takes the hand-made slice's place: installed as a platform team installs it.
    await api.delete(f"{RESOURCE}/resourceslices/nodo-simulado-gpu")
    await helm(
        *("install", RELEASE, str(REPO / "charts" / "dra-gpu")),
        *("-n", RELEASE_NS, "--create-namespace", "--wait", "--timeout=180s"),
    )

    async def agents_ready() -> bool:
        path = f"/apis/apps/v1/namespaces/{RELEASE_NS}/daemonsets/dra-gpu-agent"
        return bool((await api.get(path))["status"].get("numberReady") == len(nodes))

    # helm's --wait accepts a DaemonSet with maxUnavailable (1) of its pods not yet ready.
    await eventually(agents_ready, what="an agent pod Ready on every node")

    async def running() -> kube.Body | None:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod_name}")
        return pod if pod["status"].get("phase") == "Running" else None

    # The real kubelet retries a failed prepare at the pod's next sync (syncFrequency: 10 s).
    await eventually(running, timeout=120, what="the recomendador pod Running")
    env = await kubectl("exec", "-n", ns, pod_name, "--", "env")
    assert "GPU_DEVICE_0=gpu-0" in env.splitlines(), env

    async def claim_with_device_status() -> kube.Body | None:
        claim = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"][0]
        return claim if claim["status"].get("devices") else None

    # The agent writes status.devices off the critical path: after the pod could start.
    claim = await eventually(claim_with_device_status, what="status.devices of the claim")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [("node-01", "gpu-0")]
    devices = claim["status"]["devices"]
    assert [(d["driver"], d["pool"], d["device"]) for d in devices] == [
        ("gpu.example.com", "node-01", "gpu-0")
    ]
    logs = await kubectl("logs", "-n", ns, pod_name)
    assert "GPU_DEVICE_0=gpu-0" in logs.splitlines(), logs

    # The kubelet's "not registered" is history once the pod runs: explain says so.
    explained = await explain_target(control_plane.kubeconfig, f"pod/{pod_name}", ns)
    driver = next(line for line in explained.splitlines() if line.startswith("driver"))
    assert "NO" not in driver.split(), explained

    await _act_two(api, kubectl, helm, control_plane, ns)


async def _pods(api: kube.Kube, ns: str, app: str) -> list[kube.Body]:
    pods = await api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")
    items: list[kube.Body] = pods["items"]
    return items


async def _running(api: kube.Kube, ns: str, app: str, count: int) -> list[kube.Body] | None:
    up = [p for p in await _pods(api, ns, app) if p["status"].get("phase") == "Running"]
    return up if len(up) == count else None


async def _act_two(
    api: kube.Kube, kubectl: Kubectl, helm: Helm, control_plane: ControlPlane, ns: str
) -> None:
    """``make run``'s second act: node configuration in the chart's values (node-02's GPU
    shared by memory shares, node-03's A100 in MIG partitions; the agents roll), then two pods
    on shares, three on partitions, and a third share that no longer fits, explained."""
    await helm(
        *("upgrade", RELEASE, str(REPO / "charts" / "dra-gpu"), "-n", RELEASE_NS),
        *("--reuse-values", "-f", str(REPO / "hack" / "act-two-values.yaml")),
        *("--wait", "--timeout=180s"),
    )
    await kubectl("rollout", "status", "-n", RELEASE_NS, "daemonset/dra-gpu-agent")
    for manifest in ("compartido.yaml", "particionado.yaml"):
        await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / manifest))
    if await server_minor(api) < 36:
        # Consumable capacity and partitionable devices are off: the agents publish both GPUs
        # whole and exclusive, so neither class finds a device.
        await eventually(
            lambda: event_with(api, ns, "FailedScheduling", "cannot allocate all claims"),
            what="the act-two pods unschedulable (1.35: no shares, no partitions)",
        )
        return
    shared = await eventually(
        lambda: _running(api, ns, "compartido", 2), timeout=120, what="two pods on shares"
    )
    partitioned = await eventually(
        lambda: _running(api, ns, "particionado", 3), timeout=120, what="three on partitions"
    )
    for pod in shared:
        env = (await kubectl("exec", "-n", ns, pod["metadata"]["name"], "--", "env")).split()
        assert {"DRA_GPU_MEMORY_LIMIT=32Gi", "DRA_GPU_SHARING_STRATEGY=MPS"} <= set(env), env
    allocated = {
        (r["pool"], r["device"], r.get("consumedCapacity", {}).get("memory"))
        for claim in await _claims(api, ns)
        for r in (claim["status"].get("allocation") or {}).get("devices", {}).get("results", [])
    }
    assert {
        ("node-02", "gpu-0", "32Gi"),
        ("node-03", "gpu-0-mig-2g-10gb-0", None),
        ("node-03", "gpu-0-mig-2g-10gb-2", None),
        ("node-03", "gpu-0-mig-2g-10gb-4", None),
    } <= allocated, allocated
    assert len(partitioned) == 3
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "compartido-grande.yaml"))
    [pod] = await eventually(lambda: _pods(api, ns, "compartido-grande"), what="its pod")

    async def explained() -> str | None:
        text = await explain_target(control_plane.kubeconfig, f"pod/{pod['metadata']['name']}", ns)
        return text if "shared:" in text else None

    text = await eventually(explained, what="the third share explained")
    assert pod["status"].get("phase") == "Pending"
    assert "node-02/gpu-0 shared: 16Gi of 80Gi memory free, the request asks 24Gi" in text, text

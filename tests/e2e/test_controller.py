"""The controller explains pending claims on the claim itself, once per reason, from one replica.

The session's controller (``controller`` fixture in conftest) runs during the whole e2e suite;
these tests replay the tutorial's states with hand-made slices and read what it posted.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.controller.posting import COMPONENT
from dra_gpu.exits import ExitCode
from dra_gpu.testing import ControllerProcess, ControlPlane, eventually
from tests.e2e.helpers import EXAMPLES, Kubectl, workload

RESOURCE = "/apis/resource.k8s.io/v1"


async def controller_events(
    api: kube.Kube, ns: str, kind: str = "ResourceClaim"
) -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{ns}/events", fieldSelector=f"involvedObject.kind={kind}"
    )
    found = [e for e in listing["items"] if e.get("reportingComponent") == COMPONENT]
    return sorted(found, key=lambda e: e["metadata"]["creationTimestamp"] + e["metadata"]["name"])


async def explained(api: kube.Kube, ns: str, text: str) -> kube.Body | None:
    for event in await controller_events(api, ns):
        if text in event["message"]:
            return event
    return None


@pytest_asyncio.fixture
async def tutorial_objects(api: kube.Kube) -> AsyncIterator[None]:
    yield
    await api.delete(f"{RESOURCE}/deviceclasses/gpu-inferencia")
    await api.delete(f"{RESOURCE}/resourceslices/nodo-simulado-gpu")


async def blocker(api: kube.Kube, ns: str, name: str, selector: str | None = None) -> None:
    """A pod whose claim takes a device on node-01 (no driver runs: the pod stays Pending)."""
    await claim_with_pod(api, ns, name, selector)

    async def allocated() -> bool:
        claim = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        return bool(claim.get("status", {}).get("allocation"))

    await eventually(allocated, what=f"claim {name} allocated")


async def claim_with_pod(api: kube.Kube, ns: str, name: str, selector: str | None = None) -> None:
    """A claim for one gpu-inferencia device and a pod that uses it."""
    request: kube.Body = {"deviceClassName": "gpu-inferencia"}
    if selector:
        request["selectors"] = [{"cel": {"expression": selector}}]
    await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        },
    )
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [workload(claims=["gpu"])],
            },
        },
    )


BIG = 'device.capacity["gpu.example.com"].memory.compareTo(quantity("24Gi")) >= 0'


async def test_each_tutorial_state_is_explained_on_the_claim_once(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    controller: ControllerProcess,
    tutorial_objects: None,
) -> None:
    ns = namespace
    failures_before = controller.metric_value("dra_gpu_prepare_failures_total")
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
    missing = await eventually(
        lambda: explained(api, ns, "request gpu: device class gpu-inferencia does not exist"),
        what="class-missing explanation",
    )
    assert missing["type"] == "Warning"
    pod_events = await eventually(
        lambda: controller_events(api, ns, "Pod"), what="the same explanation on the pod"
    )
    assert pod_events[0]["message"] == missing["message"]

    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    await eventually(lambda: explained(api, ns, "no devices published"), what="no devices")

    await kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))

    async def allocated() -> bool:
        claims = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
        return bool(claims and claims[0].get("status", {}).get("allocation"))

    await eventually(allocated, what="claim allocated")
    # Step 4: no driver registered on node-01: the real kubelet's prepare fails, the failure
    # is counted and explained on the claim as the driver piece, naming the node.
    await eventually(
        lambda: controller.metric_value("dra_gpu_prepare_failures_total") > failures_before,
        what="the kubelet's FailedPrepareDynamicResources counted",
    )
    driver = await eventually(
        lambda: explained(api, ns, "DRA driver gpu.example.com is not registered"),
        what="the driver piece explained",
    )
    assert "gpu.example.com on node-01" in driver["message"]
    await asyncio.sleep(3)  # a few more of the controller's passes (resync every 2 s)
    posted = await controller_events(api, ns)
    assert all(e.get("count", 1) == 1 for e in posted), "once each"
    told = [(e["reason"], e["message"]) for e in posted]
    assert len(told) == len(set(told)), f"the same thing said twice: {told}"
    assert {reason for reason, _ in told} == {
        missing["reason"],
        "NoDevicesPublished",
        driver["reason"],
    }, told
    # Once per thing to say: the driver piece once per thing the kubelet said (an agent that
    # stopped a moment ago is "not answering" before it is "not registered"), not per retry.
    assert sum(reason == driver["reason"] for reason, _ in told) <= 2, told


async def test_a_taken_gpu_0_and_a_too_small_gpu_1_are_both_named(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    controller: ControllerProcess,
    tutorial_objects: None,
) -> None:
    ns = namespace
    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    await kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))
    await blocker(api, ns, "other-0", BIG)
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
    event = await eventually(lambda: explained(api, ns, "no device fits"), what="no-fit reason")
    assert event["message"] == (
        "request gpu: no device fits: node-01/gpu-1 has memory 8Gi, needs >= 24Gi; "
        f"node-01/gpu-0 is allocated to {ns}/other-0"
    )

    # Metrics over HTTP match the cluster: node-01 has one device taken, one free.
    async def scraped() -> dict[str, float]:
        text = controller.metrics()
        series = {}
        for line in text.splitlines():
            match = re.match(
                r'dra_gpu_(devices|memory_bytes)\{node="node-01",state="(\w+)"\} (\S+)', line
            )
            if match:
                series[f"{match[1]}/{match[2]}"] = float(match[3])
        return series if series.get("devices/allocated") == 1 else {}

    series = await eventually(scraped, what="metrics of node-01")
    assert series["devices/published"] == 2
    assert series["devices/free"] == 1
    assert series["memory_bytes/allocated"] == 24 * 2**30
    assert series["memory_bytes/free"] == 8 * 2**30
    text = controller.metrics()
    assert 'dra_gpu_claims{state="pending"}' in text
    assert re.search(r'dra_gpu_explain_events_total\{reason="\w+"\} [1-9]', text)


async def test_both_gpus_taken_names_their_holders(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    controller: ControllerProcess,
    tutorial_objects: None,
) -> None:
    ns = namespace
    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    await kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))
    await blocker(api, ns, "other-0", BIG)
    await blocker(api, ns, "other-1")
    await claim_with_pod(api, ns, "late")
    event = await eventually(lambda: explained(api, ns, "is allocated to"), what="allocated-to")
    assert f"node-01/gpu-0 is allocated to {ns}/other-0" in event["message"]
    assert f"node-01/gpu-1 is allocated to {ns}/other-1" in event["message"]


async def test_a_device_class_that_no_published_device_satisfies_gets_a_warning(
    api: kube.Kube, kubectl: Kubectl, controller: ControllerProcess, tutorial_objects: None
) -> None:
    # (A selector that does not compile never gets this far: the API server refuses it.)
    await kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))
    name = "dra-gpu-test-h100"
    selector = 'device.attributes["gpu.example.com"].productName == "H100"'
    await api.create(
        f"{RESOURCE}/deviceclasses",
        {
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        },
    )
    try:

        async def warned() -> kube.Body | None:
            listing = await api.get(
                "/api/v1/namespaces/default/events",
                fieldSelector=f"involvedObject.kind=DeviceClass,involvedObject.name={name}",
            )
            return listing["items"][0] if listing["items"] else None

        event = await eventually(warned, what="a Warning on the DeviceClass")
        assert event["type"] == "Warning"
        assert event["message"].startswith(
            f"DeviceClass {name}: none of the 2 published devices satisfies its selectors"
        )
        assert "productName" in event["message"]  # the runtime error says why
    finally:
        await api.delete(f"{RESOURCE}/deviceclasses/{name}")


async def test_two_replicas_one_speaks_and_a_failover_repeats_nothing(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    control_plane: ControlPlane,
    controller: ControllerProcess,
    tmp_path: Path,
    tutorial_objects: None,
) -> None:
    ns = namespace
    second = ControllerProcess(
        "controller-b", control_plane.kubeconfig, tmp_path / "b", lease_seconds=4, resync_seconds=2
    )
    await second.astart()
    try:
        await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
        await eventually(lambda: explained(api, ns, "does not exist"), what="explanation")
        start = second.reconciles()
        await eventually(lambda: second.reconciles() >= start + 2, what="standby reconciled")
        posted = await controller_events(api, ns)
        assert len(posted) == 1
        assert posted[0]["reportingInstance"] == controller.identity

        controller.stop()  # releases the lease: the standby takes over
        try:
            await eventually(second.leads, what="controller-b leads")
            start = second.reconciles()
            await eventually(lambda: second.reconciles() >= start + 2, what="b reconciled")
            assert len(await controller_events(api, ns)) == 1, "unchanged reason: no new event"
        finally:
            await controller.astart()
    finally:
        second.stop()


async def test_dra_gpu_explain_prints_the_four_pieces(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    control_plane: ControlPlane,
    tutorial_objects: None,
) -> None:
    ns = namespace
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))

    async def pod_name() -> str | None:
        pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        return pods[0]["metadata"]["name"] if pods else None

    pod = await eventually(pod_name, what="the pod")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dra_gpu",
        "explain",
        f"pod/{pod}",
        "-n",
        ns,
        "--kubeconfig",
        str(control_plane.kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    # A piece is missing (no devices published yet): exit 6, as docs/troubleshooting.md says.
    assert proc.returncode == ExitCode.NOT_SATISFIED, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].startswith(f"ResourceClaim {ns}/{pod}-gpu-")
    assert lines[1].split()[:3] == ["class", "OK", "device"]
    assert lines[2].split(None, 2) == ["devices", "NO", "request gpu: no devices published"]
    assert [line.split()[0] for line in lines[1:]] == ["class", "devices", "node", "driver"]

    missing = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dra_gpu",
        "explain",
        "pod/nope",
        "-n",
        ns,
        "--kubeconfig",
        str(control_plane.kubeconfig),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await missing.communicate()
    assert missing.returncode == 1
    assert f"pod {ns}/nope not found" in err.decode()


async def test_our_slices_of_a_vanished_node_are_deleted_and_hand_made_ones_kept(
    api: kube.Kube, controller: ControllerProcess
) -> None:
    def body(name: str, labels: dict[str, str]) -> kube.Body:
        return {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": "node-vanished",
                "pool": {"name": "node-vanished", "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }

    ours = body("node-vanished-ours", {"app.kubernetes.io/managed-by": "dra-gpu"})
    await api.create(f"{RESOURCE}/resourceslices", ours)
    await api.create(f"{RESOURCE}/resourceslices", body("node-vanished-by-hand", {}))
    try:

        async def deleted() -> bool:
            names = {
                s["metadata"]["name"]
                for s in (await api.get(f"{RESOURCE}/resourceslices"))["items"]
            }
            return "node-vanished-ours" not in names and "node-vanished-by-hand" in names

        await eventually(deleted, what="our slice of node-vanished deleted")
        assert "dra_gpu_stale_slices_deleted_total 1.0" in controller.metrics()
    finally:
        await api.delete(f"{RESOURCE}/resourceslices/node-vanished-by-hand")
        await api.delete(f"{RESOURCE}/resourceslices/node-vanished-ours")

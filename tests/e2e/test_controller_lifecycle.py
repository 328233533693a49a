"""The controller as a process, and the tutorial's fourth message explained on the claim.

- A clean stop: SIGTERM ends a leading replica with exit code 0 before it would be killed, its
  Lease is released, and the standby leads well before the lease would have expired.
- The fourth piece, the driver, on a real kubelet: the node agent stopped cleanly (its slice
  stays published), a pod is scheduled onto its node, and the real kubelet answers "DRA driver
  gpu.example.com is not registered" at every retry; the controller explains it on the claim
  once, naming the driver, the node, since when and what the kubelet said. The agent comes
  back, the kubelet's next retry prepares the claim, the pod runs, and the controller says so
  once (a Normal Event).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.controller.posting import COMPONENT
from dra_gpu.testing import (
    AgentProcess,
    ControllerProcess,
    ControlPlane,
    RealNode,
    eventually,
)
from tests.e2e.helpers import delete_our_slices, driver_class, workload

RESOURCE = "/apis/resource.k8s.io/v1"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
STOP_WITHIN = 10.0
"""Seconds a stopped controller gets before SIGKILL (then its exit code is -9, not 0)."""


def controller(
    control_plane: ControlPlane, identity: str, state: Path, lease: str, lease_seconds: int = 30
) -> ControllerProcess:
    return ControllerProcess(
        identity,
        control_plane.kubeconfig,
        state,
        lease_seconds=lease_seconds,
        resync_seconds=30,
        extra_args=(f"--lease-name={lease}",),
    )


async def test_sigterm_exits_0_releases_the_lease_and_the_standby_leads_at_once(
    control_plane: ControlPlane, api: kube.Kube, tmp_path: Path
) -> None:
    lease = f"lifecycle-{secrets.token_hex(3)}"
    # A lease of 60 s: a standby that only waited for it to expire would need a minute.
    first = controller(control_plane, "lifecycle-a", tmp_path / "a", lease, lease_seconds=60)
    second = controller(control_plane, "lifecycle-b", tmp_path / "b", lease, lease_seconds=60)
    await first.astart()
    try:
        await eventually(first.leads, what="lifecycle-a leads")
        await second.astart()
        await eventually(lambda: second.reconciles() >= 1, what="lifecycle-b's first pass")
        assert not second.leads()

        code = await asyncio.to_thread(first.stop, STOP_WITHIN)
        log = first.log_file.read_text()
        assert code == 0, f"exit code {code}; log:\n{log[-3000:]}"
        assert "Traceback" not in log, log[-3000:]
        holder = (await api.get(f"{LEASES}/{lease}"))["spec"].get("holderIdentity")
        assert holder in ("", "lifecycle-b"), f"the lease still names {holder!r}"
        # Released, not expired, and seen at once: the standby watches the Lease (its own
        # retries come every lease/3 = 20 s, the lease would expire after 60 s).
        await eventually(second.leads, timeout=8, what="lifecycle-b leads")
        holder = (await api.get(f"{LEASES}/{lease}"))["spec"].get("holderIdentity")
        assert holder == "lifecycle-b"
    finally:
        first.stop()
        assert second.stop(STOP_WITHIN) == 0, second.log_file.read_text()[-3000:]
        await api.delete(f"{LEASES}/{lease}")


# ---- the fourth message ------------------------------------------------------------------------


@pytest_asyncio.fixture
async def device_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, f"lifecycle-{secrets.token_hex(3)}") as name:
        yield name


async def controller_events(api: kube.Kube, ns: str, uid: str) -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{ns}/events", fieldSelector=f"involvedObject.uid={uid}"
    )
    ours = [e for e in listing["items"] if e.get("reportingComponent") == COMPONENT]
    return sorted(ours, key=lambda e: e.get("eventTime") or "")


async def kubelet_failures(api: kube.Kube, ns: str, pod: str) -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{ns}/events",
        fieldSelector=f"involvedObject.name={pod},reason=FailedPrepareDynamicResources",
    )
    items: list[kube.Body] = listing["items"]
    return items


async def test_the_kubelets_not_registered_is_explained_on_the_claim_once_and_cleared(
    control_plane: ControlPlane,
    api: kube.Kube,
    nodes: list[RealNode],
    controller: ControllerProcess,
    namespace: str,
    device_class: str,
    tmp_path: Path,
) -> None:
    ns, node = namespace, nodes[0]
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        f"nodes:\n  {node.name}:\n    devices:\n    - count: 1\n      memory: 16Gi\n"
    )
    agent = AgentProcess.on(node, control_plane.kubeconfig, tmp_path / "agent", profile=profile)
    await agent.astart(120)
    try:
        await _explained_then_cleared(api, ns, node, agent, device_class)
    finally:
        if agent.pid is None:
            await agent.astart(120)
        await _remove_pods(api, ns)  # while the agent can unprepare
        agent.stop()
        await delete_our_slices(api, [node.name])


async def _explained_then_cleared(
    api: kube.Kube, ns: str, node: RealNode, agent: AgentProcess, device_class: str
) -> None:
    async def published() -> bool:
        listing = await api.get(f"{RESOURCE}/resourceslices")
        return any(s["spec"].get("nodeName") == node.name for s in listing["items"])

    await eventually(published, what=f"the agent's slice of {node.name}")
    assert agent.stop() == 0  # cleanly: its slice stays, the kubelet has no driver

    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    claim = await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {"metadata": {"name": "gpu"}, "spec": {"devices": {"requests": [request]}}},
    )
    pod = await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [workload(claims=["gpu"])],
            },
        },
    )
    claim_uid, pod_uid = claim["metadata"]["uid"], pod["metadata"]["uid"]

    async def not_ready() -> kube.Body | None:
        found = [
            e
            for e in await controller_events(api, ns, claim_uid)
            if e["reason"] == "DriverNotReady"
        ]
        return found[0] if found else None

    event = await eventually(not_ready, timeout=90, what="DriverNotReady on the claim")
    assert event["type"] == "Warning"
    message = event["message"]
    # Within 30 s of the agent's stop the kubelet keeps it registered and cannot dial it; after
    # that it has forgotten the driver ("not registered"). The explanation names it either way.
    assert message.startswith(
        f"driver gpu.example.com on {node.name} has not prepared the claim since "
    ), message
    said = message.split("; the kubelet says: ", 1)[1]
    failures = await kubelet_failures(api, ns, "trainer")
    assert any(said.startswith(_said(f)) for f in failures), (message, failures)
    assert "(the node agent of gpu.example.com " in said, said
    on_pod = [e["message"] for e in await controller_events(api, ns, pod_uid)]
    assert message in on_pod

    # The kubelet retries at every sync (10 s); each thing it says is explained once.
    async def retried() -> list[kube.Body] | None:
        failures = await kubelet_failures(api, ns, "trainer")
        return failures if sum(int(e.get("count") or 1) for e in failures) >= 4 else None

    failures = await eventually(retried, timeout=120, what="the kubelet's fourth try")
    await asyncio.sleep(2)  # time enough to post what the last try changed (tests of "once")
    failures = await kubelet_failures(api, ns, "trainer")
    told = [e for e in await controller_events(api, ns, claim_uid) if e["reason"] != "Prepared"]
    assert all(e["reason"] == "DriverNotReady" for e in told), told
    assert len(told) == len({_said(f) for f in failures}), (told, failures)

    await agent.astart(120)  # back: the kubelet's next retry prepares the claim

    async def running() -> bool:
        current = await api.get(f"/api/v1/namespaces/{ns}/pods/trainer")
        return bool(current["status"].get("phase") == "Running")

    await eventually(running, timeout=120, what="the pod Running")

    async def prepared() -> kube.Body | None:
        found = [
            e for e in await controller_events(api, ns, claim_uid) if e["reason"] == "Prepared"
        ]
        return found[0] if found else None

    cleared = await eventually(prepared, what="the all-clear on the claim")
    assert cleared["type"] == "Normal"
    assert cleared["message"] == (
        f"driver gpu.example.com on {node.name} prepared the claim: pod {ns}/trainer is Running"
    )
    reasons = [e["reason"] for e in await controller_events(api, ns, claim_uid)]
    assert reasons == ["DriverNotReady"] * len(told) + ["Prepared"], reasons


def _said(kubelet_event: kube.Body) -> str:
    """What the kubelet said, without its preamble (as the controller quotes it)."""
    return str(kubelet_event["message"]).rsplit("prepare dynamic resources: ", 1)[-1]


async def _remove_pods(api: kube.Kube, ns: str) -> None:
    listing = await api.get(f"/api/v1/namespaces/{ns}/pods")
    for item in listing["items"]:
        await api.delete(f"/api/v1/namespaces/{ns}/pods/{item['metadata']['name']}")

    async def gone() -> bool:
        return not (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]

    await eventually(gone, timeout=90, what=f"the pods of {ns} gone")

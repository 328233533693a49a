"""A driver that is gone is marked, on real nodes: the chart installed with a 10 s grace, the
agent DaemonSet's pod taken off node-02 (a node affinity that excludes it) — node-02's GPUs get a
DeviceTaintRule, a new pod that needs node-02 waits (its explanation names the taint), a new pod
that may go anywhere goes elsewhere, the pod already running there keeps running — then the
agent comes back and the taint goes. The delays (taint after the agent went, lift after it is
Ready again) are measured and printed, not asserted (the goals: grace + 5 s, and 5 s)."""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

import yaml

from dra_gpu import kube
from dra_gpu.controller.command import explain_target
from dra_gpu.testing import ControlPlane, RealNode, eventually
from tests.e2e import helpers
from tests.e2e.test_chart import install, remove

RESOURCE = "/apis/resource.k8s.io/v1"
GRACE = 10
NODES = ("node-01", "node-02", "node-03")
PROFILE = {
    "nodes": {
        node: {
            "devices": [{"name": "gpu-0", "memory": "24Gi"}, {"name": "gpu-1", "memory": "24Gi"}]
        }
        for node in NODES
    }
}
NOT_ON_NODE_02 = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/hostname",
                            "operator": "NotIn",
                            "values": ["node-02"],
                        }
                    ]
                }
            ]
        }
    }
}


def _ready(pod: kube.Body) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


async def _agents_on(api: kube.Kube, namespace: str, node: str) -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/pods",
        labelSelector="app.kubernetes.io/component=agent",
        fieldSelector=f"spec.nodeName={node}",
    )
    return list(listing.get("items") or [])


async def _wait(check: Any, within: float, what: str, every: float = 0.2) -> float:
    """Poll ``check`` (async, truthy when done) every ``every`` s; the monotonic time it was."""
    await eventually(check, timeout=within, interval=every, what=what)
    return time.monotonic()


async def _pod(api: kube.Kube, ns: str, name: str) -> kube.Body:
    return await api.get(f"/api/v1/namespaces/{ns}/pods/{name}")


async def _pod_anywhere(api: kube.Kube, ns: str, name: str, device_class: str) -> None:
    await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            },
        },
    )
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [helpers.workload("main", claims=["gpu"])],
                "terminationGracePeriodSeconds": 1,
            },
        },
    )


async def test_an_agent_gone_taints_its_nodes_gpus_until_it_is_back(
    control_plane: ControlPlane,
    api: kube.Kube,
    helm: helpers.Helm,
    nodes: list[RealNode],
    tmp_path: Path,
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "agent": {"profile": PROFILE},
                "controller": {
                    "replicas": 1,
                    "driverGone": {"graceSeconds": GRACE},
                    "admission": {"enabled": False},
                },
            }
        )
    )
    release = await install(helm, api, "-f", str(values), "--wait", "--timeout=180s")
    ns = f"gone-{secrets.token_hex(3)}"
    daemonset = (
        f"/apis/apps/v1/namespaces/{release.namespace}/daemonsets/{release.name}-dra-gpu-agent"
    )
    rule = f"{RESOURCE}/devicetaintrules/{release.driver}-node-02-agent-gone"
    try:

        async def agents_ready() -> bool:
            status = (await api.get(daemonset)).get("status") or {}
            return bool(
                status.get("numberReady") == len(NODES) == status.get("updatedNumberScheduled")
            )

        await eventually(agents_ready, timeout=180, what="an agent Ready on every node")

        async def controller_ready() -> bool:
            path = (
                f"/apis/apps/v1/namespaces/{release.namespace}/deployments/"
                f"{release.name}-dra-gpu-controller"
            )
            return bool(((await api.get(path)).get("status") or {}).get("readyReplicas") == 1)

        await eventually(controller_ready, timeout=120, what="the controller ready")
        await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        await eventually(
            lambda: helpers.exists(api, f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            what=f"ServiceAccount {ns}/default",
        )
        await helpers.claim_and_pod(api, ns, "before", release.device_class, node="node-02")

        async def before_running() -> bool:
            return _ready(await _pod(api, ns, "before"))

        await eventually(before_running, timeout=120, what="pod before Running on node-02")
        assert not await helpers.exists(api, rule)

        # The agent leaves node-02 (the other nodes' agents roll, each new pod beside the old).
        await api.patch(daemonset, {"spec": {"template": {"spec": {"affinity": NOT_ON_NODE_02}}}})

        async def agent_gone() -> bool:
            return not await _agents_on(api, release.namespace, "node-02")

        gone_at = await _wait(agent_gone, 120, "the agent pod gone from node-02")
        tainted_at = await _wait(
            lambda: helpers.exists(api, rule), GRACE + 60, "node-02's GPUs tainted"
        )
        taint = (await api.get(rule))["spec"]
        assert taint["deviceSelector"] == {"driver": release.driver, "pool": "node-02"}
        assert taint["taint"]["key"] == f"{release.driver}/agent-gone"
        assert taint["taint"]["effect"] == "NoSchedule"

        # After the taint: a pod that needs node-02 waits, and says why; one free to go
        # anywhere goes elsewhere; the one running there keeps running.
        await helpers.claim_and_pod(api, ns, "pinned", release.device_class, node="node-02")
        await _pod_anywhere(api, ns, "anywhere", release.device_class)

        seen: list[str] = []

        async def explained() -> str | None:
            text = await explain_target(control_plane.kubeconfig, "pod/pinned", ns)
            seen.append(text)
            return text if f"{release.driver}/agent-gone:NoSchedule" in text else None

        try:
            explanation = await eventually(explained, timeout=60, what="pinned explained")
        except TimeoutError:
            pinned = await _pod(api, ns, "pinned")
            raise AssertionError(
                f"pinned on {pinned['spec'].get('nodeName')!r}; explained:\n{seen[-1]}"
            ) from None
        assert "has not been ready since" in explanation, explanation

        async def anywhere_scheduled() -> str | None:
            return ((await _pod(api, ns, "anywhere")).get("spec") or {}).get("nodeName")

        placed = await eventually(anywhere_scheduled, timeout=60, what="anywhere scheduled")
        assert placed in ("node-01", "node-03"), placed
        pinned = await _pod(api, ns, "pinned")
        assert not pinned["spec"].get("nodeName"), "a pod was placed on node-02's tainted GPUs"
        claim = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/pinned")
        assert not (claim.get("status") or {}).get("allocation"), claim
        before = await _pod(api, ns, "before")
        assert before["status"]["phase"] == "Running"
        assert _ready(before)
        assert [c.get("restartCount") for c in before["status"]["containerStatuses"]] == [0]

        # The agent comes back: the taint goes, and the waiting pod gets node-02's GPU.
        await api.patch(
            daemonset,
            [{"op": "remove", "path": "/spec/template/spec/affinity"}],
            patch_type="json",
        )

        async def agent_ready() -> bool:
            return any(_ready(p) for p in await _agents_on(api, release.namespace, "node-02"))

        ready_at = await _wait(agent_ready, 180, "the agent Ready on node-02 again")
        lifted_at = await _wait(lambda: helpers.gone(api, rule), 60, "node-02's GPUs untainted")

        async def pinned_running() -> bool:
            return _ready(await _pod(api, ns, "pinned"))

        await eventually(pinned_running, timeout=120, what="pinned Running on node-02")
        before = await _pod(api, ns, "before")
        assert [c.get("restartCount") for c in before["status"]["containerStatuses"]] == [0]
        print(
            f"\nDRIVER GONE grace {GRACE}s: tainted {tainted_at - gone_at:.2f}s after the agent "
            f"pod was gone (goal <= {GRACE + 5}s); untainted {lifted_at - ready_at:.2f}s after "
            "it was Ready again (goal <= 5s); the pod pinned to node-02 waited, "
            f"the free one went to {placed}, the running one kept running"
        )
    finally:
        # The agent back first: the kubelet needs it to unprepare the pods' claims.
        with contextlib.suppress(kube.ApiError):
            await api.patch(
                daemonset,
                [{"op": "remove", "path": "/spec/template/spec/affinity"}],
                patch_type="json",
            )
        if await helpers.exists(api, f"/api/v1/namespaces/{ns}"):
            await api.delete(f"/api/v1/namespaces/{ns}")
            await eventually(
                lambda: helpers.gone(api, f"/api/v1/namespaces/{ns}"),
                timeout=120,
                what=f"namespace {ns} gone",
            )
        await remove(helm, api, release)
        # A rule left by the release (its controller gone before the agent was back).
        await api.delete(rule)

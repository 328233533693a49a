"""Prepare reads claims from the agent's claim cache (``agent.claimcache``), with the real
control plane, scheduler and a real node: a pod bound to the node has its claim read as it
appears there, and the kubelet's prepare is answered from that copy; a claim whose pod is not
bound there is a GET; a claim unprepared, released and allocated another device is prepared
with the new one; ``DRA_GPU_CLAIM_READS=get`` opens no watch and reads every claim with a GET.
"""

from __future__ import annotations

import asyncio
import re

from dra_gpu import kube
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.testing import AgentProcess, RealNode, eventually
from tests.e2e.helpers import (
    RESOURCE,
    TUTORIAL_PROFILE,
    AgentStarter,
    allocated_claim,
    allocation,
    claim_and_pod,
    driver_class,
    gone,
    holder,
    plugin_call,
)

NODE = "node-01"


def reads(agent: AgentProcess) -> dict[str, float]:
    text = agent.metrics("dra_gpu_claim_reads_total")
    found = re.findall(r'^dra_gpu_claim_reads_total\{source="(\w+)"\} (\S+)$', text, re.M)
    return {source: float(value) for source, value in found}


async def prepared_device(node: RealNode, claim: v1.Claim) -> str:
    answer = await plugin_call(node, "prepare", claim)
    assert isinstance(answer, v1.NodePrepareResourceResponse)
    (device,) = answer.devices
    return device.device_name


async def test_a_pod_bound_here_has_its_claim_read_ahead_and_a_reallocated_one_gets_its_new_device(
    api: kube.Kube,
    agent_with: AgentStarter,
    node_named: dict[str, RealNode],
    namespace: str,
) -> None:
    node = node_named[NODE]
    async with (
        driver_class(api, "reads-any") as device_class,
        agent_with(TUTORIAL_PROFILE) as agent,
    ):
        # The real flow: the scheduler allocates and reserves the claim, then binds the pod;
        # the agent's watch of this node's pods sees it bound and reads its claim, so the
        # kubelet's prepare is answered from that copy (or waits for the read in flight).
        for attempt in range(5):  # a prepare that comes before the read starts is a GET
            name = f"ahead-{attempt}"
            await claim_and_pod(api, namespace, name, device_class, node=NODE)
            await eventually(
                lambda name=name: pod_running(api, namespace, name),  # type: ignore[misc]
                timeout=60,
                what=f"{name} running",
            )
            await api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
            await eventually(
                lambda name=name: gone(api, f"/api/v1/namespaces/{namespace}/pods/{name}"),  # type: ignore[misc]
                timeout=60,
                what=f"{name} gone (its claim unprepared)",
            )
            if reads(agent)["cache"] >= 1:
                break
        print(f"\nreads after {attempt + 1} pod(s): {reads(agent)}")
        assert reads(agent)["cache"] >= 1, reads(agent)
        before = reads(agent)["api"]

        # A claim whose pod is not bound here is read with a GET; unprepared, released,
        # deallocated and allocated gpu-1 for a new pod: prepared with the new device (no copy
        # made before an unprepare is used after it).
        claim = await allocated_claim(api, namespace, NODE, "gpu-0", name="moved", reserved=True)
        assert await prepared_device(node, claim) == "gpu-0"
        await plugin_call(node, "unprepare", claim)
        path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim.name}/status"
        pod = await holder(api, namespace, claim.name)
        for status in (allocation(NODE, "gpu-0"), {}, allocation(NODE, "gpu-1", pod)):
            body = await api.get(path)
            body["status"] = status
            await api.replace(path, body)
        assert await prepared_device(node, claim) == "gpu-1"
        await plugin_call(node, "unprepare", claim)
        assert reads(agent)["api"] == before + 2, reads(agent)


async def pod_running(api: kube.Kube, namespace: str, name: str) -> bool:
    pod = await api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return bool(pod["status"].get("phase") == "Running")


async def test_with_claim_reads_get_there_is_no_watch_and_every_claim_is_a_get(
    api: kube.Kube,
    agent_with: AgentStarter,
    node_named: dict[str, RealNode],
    namespace: str,
) -> None:
    async with agent_with(TUTORIAL_PROFILE, env={"DRA_GPU_CLAIM_READS": "get"}) as agent:
        claim = await allocated_claim(api, namespace, NODE, "gpu-1", reserved=True)
        await asyncio.sleep(1)
        assert await prepared_device(node_named[NODE], claim) == "gpu-1"
        await plugin_call(node_named[NODE], "unprepare", claim)
        assert reads(agent) == {"cache": 0.0, "api": 1.0}
        assert "claim cache" not in agent.log_file.read_text()

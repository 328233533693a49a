"""Prepare reads claims from the agent's watch (``agent.claimcache``), with the real control
plane and a real node: a claim reserved for a pod is read from the watch's copy, not with a
GET; a claim unprepared, released and allocated another device is prepared with the new one;
``DRA_GPU_CLAIM_READS=get`` opens no watch and reads every claim with a GET.
"""

from __future__ import annotations

import asyncio
import re

from dra_gpu import kube
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.testing import AgentProcess, RealNode
from tests.e2e.helpers import (
    RESOURCE,
    TUTORIAL_PROFILE,
    AgentStarter,
    allocated_claim,
    allocation,
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


async def test_a_reserved_claim_is_read_from_the_watch_and_a_reallocated_one_gets_its_new_device(
    api: kube.Kube,
    agent_with: AgentStarter,
    node_named: dict[str, RealNode],
    namespace: str,
) -> None:
    node = node_named[NODE]
    async with agent_with(TUTORIAL_PROFILE) as agent:
        # Fresh claims until one is read from the copy: the watch is milliseconds behind the
        # API server, a second is a wide margin; a claim the watch has not seen is a GET.
        for attempt in range(10):
            claim = await allocated_claim(
                api, namespace, NODE, "gpu-0", name=f"gpu-{attempt}", reserved=True
            )
            await asyncio.sleep(1)
            assert await prepared_device(node, claim) == "gpu-0"
            await plugin_call(node, "unprepare", claim)
            if reads(agent)["cache"] >= 1:
                break
        assert reads(agent)["cache"] == 1, reads(agent)

        # The claim's pod is gone: released, deallocated, allocated gpu-1 for a new pod on
        # this node, prepared at once (no copy of the unprepared claim is trusted until the
        # watch has shown it released).
        path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim.name}/status"
        pod = await holder(api, namespace, claim.name)
        for status in (allocation(NODE, "gpu-0"), {}, allocation(NODE, "gpu-1", pod)):
            body = await api.get(path)
            body["status"] = status
            await api.replace(path, body)
        assert await prepared_device(node, claim) == "gpu-1"
        await plugin_call(node, "unprepare", claim)


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

"""A claim for two GPUs on a real node under the real scheduler: the container of the pod that
uses it sees both GPUs, in the claim-wide ``NVIDIA_VISIBLE_DEVICES`` (one variable per device
left the container the last device's) and one ``GPU_DEVICE_<n>`` each."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import AgentProcess, eventually
from tests.e2e.helpers import (
    AgentStarter,
    Kubectl,
    container_env,
    driver_class,
    pod_with_claim,
)

RESOURCE = "/apis/resource.k8s.io/v1"
PROFILE = """\
nodes:
  node-01:
    devices:
    - {memory: 24Gi, uuid: GPU-11111111-0000-4000-8000-000000000000}
    - {memory: 24Gi, uuid: GPU-22222222-0000-4000-8000-000000000000}
"""


@pytest_asyncio.fixture
async def agent(agent_with: AgentStarter) -> AsyncIterator[AgentProcess]:
    async with agent_with(PROFILE) as started:
        yield started


async def test_a_two_gpu_claims_container_sees_both_gpus(
    api: kube.Kube, kubectl: Kubectl, namespace: str, agent: AgentProcess
) -> None:
    async with driver_class(api, "dra-gpu-test-multi") as device_class:
        await api.create(
            f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
            {
                "metadata": {"name": "two"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {"deviceClassName": device_class, "count": 2},
                            }
                        ]
                    }
                },
            },
        )
        await pod_with_claim(api, namespace, "two")

        async def env() -> dict[str, str] | None:
            return await container_env(kubectl, namespace, "two", "main")

        seen = await eventually(env, timeout=120, what="pod two running")
        claim = await api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/two")
        devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        uuids = {
            "gpu-0": "GPU-11111111-0000-4000-8000-000000000000",
            "gpu-1": "GPU-22222222-0000-4000-8000-000000000000",
        }
        assert sorted(devices) == ["gpu-0", "gpu-1"]
        assert seen["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[d] for d in devices)
        assert {seen["GPU_DEVICE_0"], seen["GPU_DEVICE_1"]} == {"gpu-0", "gpu-1"}
        assert [seen["GPU_DEVICE_0"], seen["GPU_DEVICE_1"]] == devices

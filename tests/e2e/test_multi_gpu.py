"""A claim for two GPUs on a real node under the real scheduler: the container of the pod that
uses it sees both GPUs, in the claim-wide ``NVIDIA_VISIBLE_DEVICES`` (one variable per device
left the container the last device's) and one ``GPU_DEVICE_<n>`` each. On a node set up for CDI
only (``--toolkit-cdi-kind``), containerd applies the toolkit's spec (a stand-in written into
the node's CDI directory, as ``nvidia-ctk cdi generate`` would) and ours to that container."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import AgentProcess, RealNode, eventually
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


UUIDS = {
    "gpu-0": "GPU-11111111-0000-4000-8000-000000000000",
    "gpu-1": "GPU-22222222-0000-4000-8000-000000000000",
}


async def two_gpu_pod(
    api: kube.Kube, kubectl: Kubectl, namespace: str, device_class: str
) -> tuple[dict[str, str], list[str]]:
    """Claim ``two`` for two GPUs and pod ``two`` using it: the running container's env, and
    the allocated devices in the claim's order."""
    await api.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {
            "metadata": {"name": "two"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 2}}
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
    return seen, devices


async def test_a_two_gpu_claims_container_sees_both_gpus(
    api: kube.Kube, kubectl: Kubectl, namespace: str, agent: AgentProcess
) -> None:
    async with driver_class(api, "dra-gpu-test-multi") as device_class:
        seen, devices = await two_gpu_pod(api, kubectl, namespace, device_class)
        assert sorted(devices) == ["gpu-0", "gpu-1"]
        assert seen["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS[d] for d in devices)
        assert {seen["GPU_DEVICE_0"], seen["GPU_DEVICE_1"]} == {"gpu-0", "gpu-1"}
        assert [seen["GPU_DEVICE_0"], seen["GPU_DEVICE_1"]] == devices


def stand_in_toolkit_spec() -> dict[str, object]:
    """What ``nvidia-ctk cdi generate --device-name-strategy=uuid`` writes, with variables for
    what it mounts: the driver (top-level, with its NVIDIA_VISIBLE_DEVICES=void) and per GPU."""
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void", "TOOLKIT_DRIVER=stand-in"]},
        "devices": [
            {
                "name": uuid,
                "containerEdits": {"env": [f"TOOLKIT_{name.upper().replace('-', '_')}={uuid}"]},
            }
            for name, uuid in UUIDS.items()
        ],
    }


async def test_on_a_cdi_only_node_the_container_gets_the_toolkits_spec_and_ours(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    agent_with: AgentStarter,
    node_named: dict[str, RealNode],
) -> None:
    toolkit_spec = node_named["node-01"].cdi_dir / "nvidia.json"
    toolkit_spec.parent.mkdir(parents=True, exist_ok=True)
    toolkit_spec.write_text(json.dumps(stand_in_toolkit_spec()))
    try:
        async with (
            agent_with(PROFILE, env={"DRA_GPU_TOOLKIT_CDI_KIND": "nvidia.com/gpu"}) as started,
            driver_class(api, "dra-gpu-test-multi-cdi") as device_class,
        ):
            seen, devices = await two_gpu_pod(api, kubectl, namespace, device_class)
            # The agent found the toolkit's device of every GPU: no warning at start.
            log = started.log_file.read_text()
            assert "toolkit CDI spec: nvidia.com/gpu declares the devices" in log
    finally:
        toolkit_spec.unlink()
    assert sorted(devices) == ["gpu-0", "gpu-1"]
    # The toolkit's spec: its driver, and each allocated GPU's device.
    assert seen["TOOLKIT_DRIVER"] == "stand-in"
    assert (seen["TOOLKIT_GPU_0"], seen["TOOLKIT_GPU_1"]) == (UUIDS["gpu-0"], UUIDS["gpu-1"])
    # Ours, applied after it: both GPUs, where the toolkit's spec says "void".
    assert seen["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS[d] for d in devices)
    assert [seen["GPU_DEVICE_0"], seen["GPU_DEVICE_1"]] == devices

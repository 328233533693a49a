"""Shared GPUs with memory shares on a real node under the real scheduler: one simulated 40Gi
GPU offered to several claims at once (``allowMultipleAllocations``, a ``requestPolicy`` on
its memory, MPS). Three pods share it, each container told its own share; a burst of claims
never holds more than the GPU's memory at once (sampled while it is scheduled and after some
pods leave), and each claim's ``status.devices`` entry carries its share ID.

Consumable capacity (DRAConsumableCapacity) is beta and on by default from Kubernetes 1.36; on
1.35 the API server drops the fields, the agent then publishes the GPU exclusive, and the same
tests assert there that one claim at a time holds it, whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.resource import quantities
from dra_gpu.testing import AgentProcess, eventually
from tests.e2e.helpers import (
    AgentStarter,
    Kubectl,
    claim_and_pod,
    container_env,
    driver_class,
    events_of,
    gone,
    server_minor,
)

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
GI = 2**30
PROFILE = """\
nodes:
  node-01:
    devices:
    - memory: 40Gi
      sharing: {mode: MPS, memory: {default: 8Gi, min: 4Gi, step: 4Gi}}
"""


@pytest_asyncio.fixture
async def shared_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, "dra-gpu-test-shares") as name:
        yield name


@pytest_asyncio.fixture
async def agent(agent_with: AgentStarter) -> AsyncIterator[AgentProcess]:
    async with agent_with(PROFILE) as started:
        yield started


async def allocated(api: kube.Kube, ns: str) -> dict[str, kube.Body]:
    """Claim -> its allocation result, for every claim of ``ns`` allocated now."""
    found = {}
    for claim in (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]:
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            (result,) = allocation["devices"]["results"]
            found[claim["metadata"]["name"]] = result
    return found


async def share_one_after_another(
    api: kube.Kube, ns: str, shared_class: str, wanted: dict[str, str | None]
) -> None:
    """A claim and pod for each of ``wanted`` (name -> memory), each created once the one
    before is allocated. Claims created together can be refused once by the scheduler while
    the others are in flight, and a refused pod is retried only when something it waits for
    changes (or after minutes): the burst test below is where claims come at once."""
    for name, memory in wanted.items():
        await claim_and_pod(api, ns, name, shared_class, memory=memory)

        async def has_allocation(name: str = name) -> bool:
            return name in await allocated(api, ns)

        await eventually(has_allocation, timeout=120, what=f"claim {name} allocated")


def assert_fits(results: dict[str, kube.Body], shared: bool) -> None:
    """What is allocated at one time fits in gpu-0: shares within its 40Gi, each with its own
    share ID (1.35: one claim, whole)."""
    if not shared:
        assert len(results) <= 1, results
        assert all("shareID" not in r for r in results.values()), results
        return
    used = sum(
        int(quantities.exact_value(r["consumedCapacity"]["memory"])) for r in results.values()
    )
    assert used <= 40 * GI, results
    shares = [r["shareID"] for r in results.values()]
    assert len(set(shares)) == len(shares), results


async def share_env(kubectl: Kubectl, ns: str, pod: str) -> dict[str, str]:
    async def env() -> dict[str, str] | None:
        return await container_env(kubectl, ns, pod, "main")

    found = await eventually(env, timeout=120, what=f"pod {pod} running")
    return {
        k: v
        for k, v in found.items()
        if k.startswith(("GPU_", "DRA_GPU_")) or k == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
    }


async def is_running(api: kube.Kube, ns: str, pod: str) -> bool:
    current = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    return bool(current["status"].get("phase") == "Running")


async def published_device(api: kube.Kube) -> kube.Body:
    async def device() -> kube.Body | None:
        listing = await api.get(
            f"{RESOURCE}/resourceslices",
            fieldSelector=f"spec.driver={DRIVER},spec.nodeName=node-01",
        )
        found = [d for s in listing["items"] for d in s["spec"].get("devices") or []]
        return found[0] if len(found) == 1 else None

    return await eventually(device, timeout=60, what="gpu-0 published")


async def test_three_pods_share_one_gpu_each_with_its_memory_share(
    api: kube.Kube, kubectl: Kubectl, namespace: str, shared_class: str, agent: AgentProcess
) -> None:
    ns = namespace
    shared = await server_minor(api) >= 36
    if shared:
        # The agent's first write may be dropped (1.35 only); then it is published again.
        async def shared_published() -> kube.Body | None:
            device = await published_device(api)
            return device if device.get("allowMultipleAllocations") else None

        device = await eventually(shared_published, timeout=60, what="gpu-0 published shared")
        assert device["capacity"]["memory"]["requestPolicy"] == {
            "default": "8Gi",
            "validRange": {"min": "4Gi", "step": "4Gi"},
        }
    wanted = {"small": None, "medium": "12Gi", "large": "14Gi"}  # 8Gi (default), 12Gi, 16Gi
    if shared:
        await share_one_after_another(api, ns, shared_class, wanted)
    else:
        for name, memory in wanted.items():
            await claim_and_pod(api, ns, name, shared_class, memory=memory)

    if not shared:
        # 1.35: published exclusive (the log says why); one pod gets gpu-0 whole.
        assert "allowMultipleAllocations" not in await published_device(api)

        async def one_running() -> list[str] | None:
            running = [n for n in wanted if await is_running(api, ns, n)]
            return running or None

        (runner,) = await eventually(one_running, timeout=180, what="one pod running")
        env = await share_env(kubectl, ns, runner)
        assert env == {"GPU_DEVICE_0": "gpu-0", "DRA_GPU_SHARING_STRATEGY": "Exclusive"}
        assert_fits(await allocated(api, ns), shared=False)
        assert "DRAConsumableCapacity is off" in agent.log_file.read_text()
        return

    async def all_running() -> bool:
        return all([await is_running(api, ns, n) for n in wanted])

    await eventually(all_running, timeout=180, what="three pods sharing gpu-0 running")
    results = await allocated(api, ns)
    assert {n: r["device"] for n, r in results.items()} == dict.fromkeys(wanted, "gpu-0")
    assert {n: r["consumedCapacity"]["memory"] for n, r in results.items()} == {
        "small": "8Gi",
        "medium": "12Gi",
        "large": "16Gi",  # rounded up to min + a whole number of steps
    }
    assert_fits(results, shared=True)
    for name, result in results.items():
        memory = result["consumedCapacity"]["memory"]
        mib = int(quantities.exact_value(memory)) // 2**20
        assert await share_env(kubectl, ns, name) == {
            "GPU_DEVICE_0": "gpu-0",
            "DRA_GPU_SHARING_STRATEGY": "MPS",
            "DRA_GPU_MEMORY_LIMIT": memory,
            "DRA_GPU_SHARE_ID": result["shareID"],
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}M",
        }

    async def statuses() -> dict[str, str] | None:
        found = {}
        for claim in (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]:
            entries = (claim.get("status") or {}).get("devices") or []
            if len(entries) != 1:
                return None
            found[claim["metadata"]["name"]] = entries[0].get("shareID")
        return found

    by_claim = await eventually(statuses, timeout=60, what="status.devices of the three claims")
    assert by_claim == {n: r["shareID"] for n, r in results.items()}


async def test_a_burst_of_shares_never_holds_more_than_the_gpus_memory(
    api: kube.Kube, namespace: str, shared_class: str, agent: AgentProcess
) -> None:
    ns = namespace
    shared = await server_minor(api) >= 36
    names = [f"s{i}" for i in range(6)]
    await asyncio.gather(*(claim_and_pod(api, ns, n, shared_class, memory="12Gi") for n in names))

    async def settled(waiting: list[str]) -> tuple[dict[str, kube.Body]] | None:
        """Once every pod of ``waiting`` runs or was found unschedulable: what is allocated."""
        now = await allocated(api, ns)
        assert_fits(now, shared)  # checked on every sample, not only at the end
        refused = {
            e["involvedObject"]["name"]
            for e in await events_of(api, ns)
            if e.get("reason") == "FailedScheduling"
        }
        for name in waiting:
            if not await is_running(api, ns, name) and name not in refused:
                return None
        return (now,)

    (first,) = await eventually(lambda: settled(names), timeout=180, what="burst scheduled")
    # 12Gi each of 40Gi: three at once (1.35: one, whole).
    assert len(first) == (3 if shared else 1), first
    for name in first:
        await api.delete(f"/api/v1/namespaces/{ns}/pods/{name}")

    waiting = [n for n in names if n not in first]

    async def second_wave() -> dict[str, kube.Body] | None:
        found = await settled(waiting)
        now = found[0] if found else {}
        full = len(now) == (3 if shared else 1)  # the freed memory taken up again
        return now if full and not set(now) & set(first) else None

    second = await eventually(second_wave, timeout=180, what="waiting claims scheduled")
    assert set(second) <= set(waiting), second


def standin_state(agent: AgentProcess) -> dict[str, object] | None:
    """What gpu-0's (stand-in) MPS control daemon says it enforces; None: none runs."""
    path = agent.checkpoint_dir / "sharing" / "gpu-0" / "pipe" / "dra-gpu-standin.json"
    try:
        found: dict[str, object] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return found


async def test_the_mps_daemon_serves_every_share_and_goes_with_the_last(
    api: kube.Kube, kubectl: Kubectl, namespace: str, shared_class: str, agent: AgentProcess
) -> None:
    ns = namespace
    if await server_minor(api) < 36:
        return  # 1.35: published exclusive (the first test says so); no share, no daemon
    assert standin_state(agent) is None  # nothing shared yet: no daemon
    wanted = {"m1": None, "m2": "12Gi", "m3": "16Gi"}
    await share_one_after_another(api, ns, shared_class, wanted)

    async def all_running() -> bool:
        return all([await is_running(api, ns, n) for n in wanted])

    await eventually(all_running, timeout=180, what="three MPS shares of gpu-0 running")
    daemon = standin_state(agent)
    assert daemon is not None
    uuid = daemon["visibleDevices"]
    assert daemon["defaultDevicePinnedMemLimit"] == {uuid: "8192M"}  # the policy's default
    results = await allocated(api, ns)
    for name, result in results.items():
        # Each share's container reaches the daemon through the mounted pipe directory, and
        # carries its own limit for it.
        seen = json.loads(
            await kubectl(
                "exec",
                "-n",
                ns,
                name,
                "-c",
                "main",
                "--",
                "cat",
                "/tmp/nvidia-mps/dra-gpu-standin.json",
            )
        )
        assert seen["pid"] == daemon["pid"]
        env = await container_env(kubectl, ns, name, "main")
        assert env is not None
        mib = int(quantities.exact_value(result["consumedCapacity"]["memory"])) // 2**20
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib}M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid

    # The agent restarts: the daemon keeps running, and is adopted.
    agent.restart()
    after = standin_state(agent)
    assert after is not None
    assert after["pid"] == daemon["pid"]

    # One share goes: the daemon stays; the last goes: the daemon goes with it.
    await api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/m1")
    # A pod whose claim was prepared goes only once the driver unprepared it.
    await eventually(
        lambda: gone(api, f"/api/v1/namespaces/{ns}/pods/m1"), timeout=120, what="m1 gone"
    )
    still = standin_state(agent)
    assert still is not None
    assert still["pid"] == daemon["pid"]
    await api.request("DELETE", f"/api/v1/namespaces/{ns}/pods")
    await eventually(
        lambda: standin_state(agent) is None or None, timeout=120, what="the daemon stopped"
    )
    assert not (agent.checkpoint_dir / "sharing" / "gpu-0").exists()

"""Crash consistency: prepare/unprepare cycles through a real kubelet while the agent is
SIGKILLed at random moments, from outside and at its own crash points (``DRA_GPU_FAILPOINTS``:
between the CDI spec and the checkpoint writes, after a spec deletion, before an answer).

Every pod must run with the device it was allocated (checked through the CDI edits its
container got); afterwards every claim in use has exactly its spec and checkpoint entry, and
once the pods are gone nothing is left: no spec, no entry, no ``status.devices``. 40 cycles in
``make test``, the issue's 500 with ``DRA_GPU_LOAD=full`` (``make reliability``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint, failpoints
from dra_gpu.testing import AgentProcess, ControlPlane, NodeRuntime, RealNode, eventually
from tests.e2e.helpers import RESOURCE, Kubectl, exists, gpu_env, gpu_nodes, workload

FULL = os.environ.get("DRA_GPU_LOAD") == "full"
CYCLES = 500 if FULL else 40
WORKERS = 6  # pods in flight at once, on a node with 8 GPUs
CLASS = "dra-gpu-crash"
NODE = "crash-01"
DRIVER = "gpu.example.com"
CRASH_POINTS = ",".join(f"{point}=0.03" for point in failpoints.POINTS)


@dataclasses.dataclass
class Tally:
    cycles: int = 0
    kills: int = 0
    self_kills: int = 0
    done: bool = False


@pytest_asyncio.fixture
async def crash_node(
    api: kube.Kube, control_plane: ControlPlane, node_runtime: NodeRuntime, short_path: Path
) -> AsyncIterator[tuple[RealNode, AgentProcess]]:
    env = {failpoints.ENV: CRASH_POINTS}
    async with gpu_nodes(
        api,
        control_plane,
        node_runtime,
        short_path,
        [NODE],
        gpus=8,
        device_class=CLASS,
        agent_env=env,
    ) as (nodes, agents):
        yield nodes[0], agents[0]


def pod(name: str, claim: kube.Body) -> kube.Body:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"dra-gpu.io/pool": CLASS},
            "resourceClaims": [{"name": "gpu", **claim}],
            "containers": [workload(claims=["gpu"])],
        },
    }


async def start_again(agent: AgentProcess) -> None:
    """Until it is ready: its own crash points may kill it during recovery, too."""
    while True:
        try:
            await agent.astart(120)
            return
        except RuntimeError:  # exited while starting
            continue


async def killer(agent: AgentProcess, tally: Tally, rng: random.Random) -> None:
    while not tally.done:
        # Alive 1-4 s between kills: the real kubelet retries a failed prepare 10-15 s later
        # (pod worker backoff), so with shorter lives nearly every retry met a dead agent.
        deadline = asyncio.get_running_loop().time() + rng.uniform(1.0, 4.0)
        while not agent.exited and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polls a child process: there is no event to wait on
        if agent.exited:  # at one of its crash points
            tally.self_kills += 1
        else:
            agent.kill()
            tally.kills += 1
        await asyncio.sleep(rng.uniform(0.0, 0.5))  # the kubelet meets a dead socket meanwhile
        await start_again(agent)


async def allocated_device(api: kube.Kube, ns: str, pod_name: str) -> tuple[str, str]:
    """(claim UID, device) of the pod's claim."""
    current = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod_name}")
    (named,) = current["spec"]["resourceClaims"]
    if "resourceClaimName" in named:
        claim_name = named["resourceClaimName"]
    else:
        (generated,) = current["status"]["resourceClaimStatuses"]
        claim_name = generated["resourceClaimName"]
    claim = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim_name}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return claim["metadata"]["uid"], result["device"]


async def run_pod(api: kube.Kube, kubectl: Kubectl, ns: str, name: str, claim: kube.Body) -> str:
    """Create the pod, wait until it runs, check its container got its device; returns the
    claim's UID."""
    await api.create(f"/api/v1/namespaces/{ns}/pods", pod(name, claim))

    async def running() -> bool:
        current = await api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return current["status"].get("phase") == "Running"

    await eventually(running, timeout=180, interval=0.2, what=f"pod {name} Running")
    uid, device = await allocated_device(api, ns, name)
    env = await gpu_env(kubectl, ns, name)
    assert env.get("GPU_DEVICE_0") == device, f"pod {name} runs with {env}, allocated {device}"
    return uid


async def delete_pod(api: kube.Kube, ns: str, name: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    await api.delete(path)

    async def gone() -> bool:
        return not await exists(api, path)

    await eventually(gone, timeout=180, interval=0.2, what=f"pod {name} gone (unprepared)")


async def test_random_sigkills_during_prepare_and_unprepare_lose_and_leak_nothing(
    api: kube.Kube, kubectl: Kubectl, namespace: str, crash_node: tuple[RealNode, AgentProcess]
) -> None:
    node, agent = crash_node
    ns = namespace
    one_gpu = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}}
    await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
        {"metadata": {"name": "one-gpu"}, "spec": {"spec": one_gpu}},
    )
    # Odd workers reuse one claim of their own (same UID, new allocation each time).
    for number in range(1, WORKERS, 2):
        await api.create(
            f"{RESOURCE}/namespaces/{ns}/resourceclaims",
            {"metadata": {"name": f"claim-{number}"}, "spec": one_gpu},
        )

    def claim_of(worker: int) -> kube.Body:
        if worker % 2:
            return {"resourceClaimName": f"claim-{worker}"}
        return {"resourceClaimTemplateName": "one-gpu"}

    tally = Tally()
    seed = random.randrange(1 << 32)
    print(f"\ncrash test seed {seed}")
    rng = random.Random(seed)

    async def worker(number: int) -> None:
        round_ = 0
        while tally.cycles < CYCLES:
            name = f"w{number}-{round_}"
            round_ += 1
            await run_pod(api, kubectl, ns, name, claim_of(number))
            await delete_pod(api, ns, name)
            tally.cycles += 1

    killing = asyncio.create_task(killer(agent, tally, rng))
    try:
        await asyncio.gather(*(worker(n) for n in range(WORKERS)))
    finally:
        tally.done = True
        await killing
    print(
        f"crash test: {tally.cycles} prepare/unprepare cycles, {tally.kills} SIGKILLs from "
        f"outside, {tally.self_kills} at the agent's crash points"
    )
    assert tally.kills + tally.self_kills >= 3, "the agent was hardly killed: nothing was tested"

    # In use: exactly the specs and checkpoint entries of the running pods' claims. One more
    # crash first, then no more crash points: nobody would restart the agent now.
    agent.kill()
    agent.env.clear()
    await agent.astart()
    in_use = set(
        await asyncio.gather(
            *(run_pod(api, kubectl, ns, f"last-{n}", claim_of(n)) for n in range(WORKERS))
        )
    )
    assert set(checkpoint.read_checkpoint(agent.checkpoint_file).claims) == in_use
    assert set(cdi.list_claim_specs(agent.cdi_dir, DRIVER)) == in_use

    async def devices_reported() -> bool:
        claims = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
        return all(
            [d["device"] for d in c["status"].get("devices", [])]
            == [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]
            for c in claims
            if c["metadata"]["uid"] in in_use
        )

    await eventually(devices_reported, timeout=60, what="status.devices of every claim in use")

    # Gone: nothing left behind.
    await asyncio.gather(*(delete_pod(api, ns, f"last-{n}") for n in range(WORKERS)))
    assert checkpoint.read_checkpoint(agent.checkpoint_file).claims == {}
    assert cdi.list_claim_specs(agent.cdi_dir, DRIVER) == {}

    async def no_device_status_left() -> bool:
        claims = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
        return all(not c.get("status", {}).get("devices") for c in claims)

    await eventually(no_device_status_left, timeout=60, what="no status.devices entry left")
    assert node.prepared_claims() == {}, "the kubelet holds no claim either"

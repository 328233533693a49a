"""MIG partitions on a real node under the real scheduler: a burst of claims for partitions of
one simulated A100 40GB (and one for the whole GPU) never over-commits it. Every set of claims
allocated at once, sampled while the burst is scheduled and after some pods leave, fits in the
GPU's memory slices and compute slices; the pods that got a partition run with it prepared.

Each pod on a partition runs on a MIG instance the agent created for it at prepare (the
simulated GPU's instance table, on the node's tmpfs, holds exactly the prepared partitions; the
container is told its MIG device), destroyed at unprepare; after a node reboot the instances
of the claims still prepared are there again; a SIGKILL between creating an instance and
recording it leaks none.

Partitionable devices (DRAPartitionableDevices) are beta and on by default from Kubernetes 1.36;
on 1.35 the API server drops the counters, and the agent then publishes the GPU whole only, so
the same tests assert there that no partition is offered, only whole-GPU claims run and no
instance is ever made.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import checkpoint, failpoints, runner
from dra_gpu.devices import mig
from dra_gpu.testing import AgentProcess, RealNode, eventually
from tests.e2e.helpers import (
    AgentStarter,
    Kubectl,
    claim_and_pod,
    driver_class,
    events_of,
    gpu_env,
    server_minor,
)

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
PROFILE = """\
nodes:
  node-01:
    devices:
    - {memory: 40Gi, migCapable: true, mig: A100-40GB, productName: NVIDIA A100-SXM4-40GB}
"""
BURST = ["3g.20gb"] * 3 + ["2g.10gb"] * 3 + ["1g.5gb"] * 4
PLACEMENTS = {mig.partition_name_of("gpu-0", p): p for p in mig.placements(mig.A100_40GB)}
PROFILES = {p.name: p for p in mig.A100_40GB.profiles}


@pytest_asyncio.fixture
async def mig_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, "dra-gpu-test-mig") as name:
        yield name


@pytest_asyncio.fixture
async def agent(
    agent_with: AgentStarter, request: pytest.FixtureRequest
) -> AsyncIterator[AgentProcess]:
    env = {failpoints.ENV: "mig-instance-created=1"} if "crash" in request.node.name else {}
    async with agent_with(PROFILE, env=env) as started:
        yield started
    assert instances(started) == {}, "every instance destroyed once the pods are gone"


def instances(agent: AgentProcess) -> dict[str, str]:
    """The simulated GPU's MIG instances now (partition device name -> MIG device UUID)."""
    path = agent.cdi_dir / runner.SIMULATED_HARDWARE_DIR / "node-01-mig-instances.json"
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {
        mig.partition_name_of(i["parent"], mig.Placement(PROFILES[i["profile"]], i["start"])): i[
            "uuid"
        ]
        for i in table
    }


def recorded_instances(agent: AgentProcess) -> dict[str, str]:
    """What the agent's checkpoint records as created (partition -> MIG device UUID)."""
    claims = checkpoint.read_checkpoint(agent.checkpoint_file).claims.values()
    return {
        d.device: d.mig_instance.uuid
        for c in claims
        for d in c.devices
        if d.mig_instance is not None
    }


def selector(profile: str) -> str:
    attrs = f'device.attributes["{DRIVER}"]'
    if profile == "whole":
        return f'{attrs}.type == "gpu"'
    return f'"profile" in {attrs} && {attrs}.profile == "{profile}"'


async def allocated(api: kube.Kube, ns: str) -> dict[str, str]:
    """Claim -> device, for every claim of ``ns`` allocated now."""
    found = {}
    for claim in (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]:
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            (result,) = allocation["devices"]["results"]
            found[claim["metadata"]["name"]] = result["device"]
    return found


def assert_fits(devices: dict[str, str]) -> None:
    """What is allocated at one time fits in gpu-0: the whole GPU alone, or placements whose
    memory slices are disjoint and whose compute slices add up to at most 7."""
    if "gpu-0" in devices.values():
        assert list(devices.values()) == ["gpu-0"], devices
        return
    used = [PLACEMENTS[d] for d in devices.values()]
    slices_used = Counter(i for p in used for i in p.memory_slices)
    assert all(n == 1 for n in slices_used.values()), devices
    assert sum(p.profile.compute_slices for p in used) <= mig.COMPUTE_SLICES, devices


async def settled(api: kube.Kube, ns: str, names: list[str]) -> tuple[dict[str, str]] | None:
    """Once every pod of ``names`` runs or was found unschedulable: what is allocated (in a
    1-tuple: nothing allocated, ``{}``, is an answer too)."""
    now = await allocated(api, ns)
    assert_fits(now)  # checked on every sample, not only at the end
    refused = {
        e["involvedObject"]["name"]
        for e in await events_of(api, ns)
        if e.get("reason") == "FailedScheduling"
    }
    for name in names:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        if pod["status"].get("phase") != "Running" and name not in refused:
            return None
    return (now,)


async def test_a_burst_of_mig_claims_never_over_commits_the_gpu(
    api: kube.Kube, kubectl: Kubectl, namespace: str, mig_class: str, agent: AgentProcess
) -> None:
    ns = namespace

    async def published() -> list[kube.Body]:
        listing = await api.get(
            f"{RESOURCE}/resourceslices",
            fieldSelector=f"spec.driver={DRIVER},spec.nodeName=node-01",
        )
        items: list[kube.Body] = listing["items"]
        return items if items else []

    partitions_served = await server_minor(api) >= 36
    names = [f"c{i}-{p.replace('.', '-')}" for i, p in enumerate(BURST)]
    await asyncio.gather(
        *(
            claim_and_pod(api, ns, n, mig_class, selector=selector(p))
            for n, p in zip(names, BURST, strict=True)
        )
    )
    (first,) = await eventually(
        lambda: settled(api, ns, names), timeout=180, what="burst scheduled"
    )
    devices = [d["name"] for s in await published() for d in s["spec"].get("devices") or []]
    # Then a claim for the whole GPU.
    await claim_and_pod(api, ns, "whole", mig_class, selector=selector("whole"))
    (after,) = await eventually(
        lambda: settled(api, ns, [*names, "whole"]), timeout=180, what="whole-GPU claim scheduled"
    )
    if not partitions_served:
        # 1.35: the counters were dropped, so the agent offers the GPU whole, once.
        assert devices == ["gpu-0"]
        assert first == {}
        assert after == {"whole": "gpu-0"}
        assert (await gpu_env(kubectl, ns, "whole", "main")) == {"GPU_DEVICE_0": "gpu-0"}
        assert instances(agent) == {}
        return

    assert len(devices) == 26  # the whole GPU and 25 placements
    assert len(first) >= 2, first  # partitions were handed out, several at once
    assert after == first  # the whole GPU is refused while partitions are held
    # One MIG instance per running pod's partition, and no other; each container is told its.
    made = instances(agent)
    assert set(made) == set(first.values()), (made, first)
    assert recorded_instances(agent) == made
    for claim, device in first.items():
        assert (await gpu_env(kubectl, ns, claim, "main")) == {
            "GPU_DEVICE_0": device,
            "GPU_DEVICE_0_MIG": made[device],
        }

    # Free what the first wave holds; the waiting claims get the GPU in turn, still within it.
    for claim in first:
        await api.delete(f"/api/v1/namespaces/{ns}/pods/{claim}")
    waiting = [n for n in [*names, "whole"] if n not in first]

    async def second_wave() -> dict[str, str] | None:
        found = await settled(api, ns, waiting)
        now = found[0] if found else {}
        return now if now and not set(now) & set(first) else None

    second = await eventually(second_wave, timeout=180, what="waiting claims scheduled")
    assert second, "nothing of the waiting claims was allocated after the first wave left"

    # The first wave's instances went with its pods; the second wave's are there.
    async def second_instances() -> dict[str, str] | None:
        running = {d for c, d in second.items() if d != "gpu-0" and await is_running(api, ns, c)}
        made = instances(agent)
        return (
            made if set(made) == running and running == set(second.values()) - {"gpu-0"} else None
        )

    made = await eventually(second_instances, timeout=120, what="instances of the second wave")
    assert recorded_instances(agent) == made


async def is_running(api: kube.Kube, ns: str, pod: str) -> bool:
    current = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    return bool(current["status"].get("phase") == "Running")


async def one_running_pod(
    api: kube.Kube, ns: str, device_class: str, name: str, partitions_served: bool
) -> str:
    """A pod on a 3g.20gb partition (1.35: on the whole GPU); returns the allocated device."""
    await claim_and_pod(
        api, ns, name, device_class, selector=selector("3g.20gb" if partitions_served else "whole")
    )

    async def running() -> bool:
        return await is_running(api, ns, name)

    await eventually(running, timeout=180, what=f"pod {name} Running")
    return (await allocated(api, ns))[name]


async def test_a_reboot_brings_back_the_instances_of_the_claims_still_prepared(
    api: kube.Kube,
    kubectl: Kubectl,
    node_named: dict[str, RealNode],
    namespace: str,
    mig_class: str,
    agent: AgentProcess,
) -> None:
    ns = namespace
    served = await server_minor(api) >= 36
    device = await one_running_pod(api, ns, mig_class, "kept", served)
    before = instances(agent)
    env_before = await gpu_env(kubectl, ns, "kept", "main")
    assert before == ({device: env_before["GPU_DEVICE_0_MIG"]} if served else {})
    first_run = (await api.get(f"/api/v1/namespaces/{ns}/pods/kept"))["status"][
        "containerStatuses"
    ][0]["containerID"]

    agent.kill()  # the agent goes down with the node, which comes back with an empty /run:
    await asyncio.to_thread(node_named["node-01"].reboot)  # no CDI spec, no MIG instance
    assert instances(agent) == {}
    await agent.astart()

    # At start, before the kubelet re-prepares the claim, the recorded instance is back.
    assert instances(agent) == before
    assert recorded_instances(agent) == before

    async def started_again() -> bool:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/kept")
        statuses = pod["status"].get("containerStatuses") or []
        return bool(
            statuses
            and statuses[0].get("containerID") not in (None, first_run)
            and "running" in statuses[0].get("state", {})
        )

    await eventually(started_again, timeout=180, what="the pod's container started again")
    assert await gpu_env(kubectl, ns, "kept", "main") == env_before
    assert instances(agent) == before


async def test_a_crash_between_creating_an_instance_and_recording_it_leaks_none(
    api: kube.Kube, namespace: str, mig_class: str, agent: AgentProcess
) -> None:
    # The agent runs with DRA_GPU_FAILPOINTS=mig-instance-created=1 (see the fixture).
    ns = namespace
    served = await server_minor(api) >= 36
    name = "crashing"
    await claim_and_pod(
        api, ns, name, mig_class, selector=selector("3g.20gb" if served else "whole")
    )
    if served:

        def died() -> bool:
            return agent.exited

        await eventually(died, timeout=180, what="the agent killed at mig-instance-created")
        leaked = instances(agent)
        assert len(leaked) == 1, "created before the kill"
        assert recorded_instances(agent) == {}, "... and never recorded"
        agent.env.clear()
        await agent.astart()
        assert "no prepared claim holds it" in agent.log_file.read_text()
        assert instances(agent) == {} or recorded_instances(agent) == instances(agent)

    async def running() -> bool:
        return await is_running(api, ns, name)

    await eventually(running, timeout=180, what=f"pod {name} Running after the retry")
    made = instances(agent)
    assert len(made) == (1 if served else 0), made
    assert recorded_instances(agent) == made, "exactly the recorded instance, nothing leaked"
    assert not agent.exited

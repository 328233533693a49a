"""MIG partitions on a real node under the real scheduler: a burst of claims for partitions of
one simulated A100 40GB never over-commits it. Every set of claims allocated at once, sampled
while the burst is scheduled and after some pods leave, fits in the GPU's memory slices and
compute slices; the pods that got a partition run with it prepared. A GPU in MIG mode is
published as its partitions only: a claim for the whole GPU is never allocated.

Each pod on a partition runs on a MIG instance the agent created for it at prepare (the
simulated GPU's instance table, on the node's tmpfs, holds exactly the prepared partitions; the
container is told its MIG device), destroyed at unprepare; after a node reboot the instances
of the claims still prepared are there again; a SIGKILL between creating an instance and
recording it leaks none. Instances the agent did not make (written into the table as the GPU
Operator's mig-manager would make them) are left alone and the placements they block are not
offered; a MIG-mode GPU that NVML does not let the agent manage (``migManagement: denied``: an
agent without MIG's privileges) publishes nothing, the node's other GPU is published and
prepared, and a Warning Event on the Node says which chart value to set.

Partitionable devices (DRAPartitionableDevices) are beta and on by default from Kubernetes 1.36;
on 1.35 the API server drops the counters, and the agent then publishes of the MIG-mode GPU only
its full-size partition (``7g.40gb``, which excludes every other), so the same tests assert
there that only that one is offered and that its claim runs on a real MIG instance.

A failing test prints the pods, the namespace's Events, the agent's log and the instance table
before its pods are deleted (``diagnosed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

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
UNPRIVILEGED = """\
nodes:
  node-01:
    devices:
    - {memory: 40Gi, migCapable: true, mig: A100-40GB, migManagement: denied}
    - {memory: 24Gi, productName: NVIDIA L4}
"""
BURST = ["3g.20gb"] * 3 + ["2g.10gb"] * 3 + ["1g.5gb"] * 4
TABLE = mig.TABLES["A100-40GB"]
PLACEMENTS = {mig.partition_name_of("gpu-0", p): p for p in mig.placements(TABLE)}
PROFILES = {p.name: p for p in TABLE.profiles}
FULL = "7g.40gb"
"""The full-size profile: on 1.35 the only partition offered."""


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


def table_file(cdi_dir: Path) -> Path:
    return cdi_dir / runner.SIMULATED_HARDWARE_DIR / "node-01-mig-instances.json"


def instances(agent: AgentProcess) -> dict[str, str]:
    """The simulated GPU's MIG instances now (partition device name -> MIG device UUID)."""
    try:
        table = json.loads(table_file(agent.cdi_dir).read_text())
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


async def published(api: kube.Kube) -> list[str]:
    listing = await api.get(
        f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER},spec.nodeName=node-01"
    )
    return sorted(d["name"] for s in listing["items"] for d in s["spec"].get("devices") or [])


def assert_fits(devices: dict[str, str]) -> None:
    """What is allocated at one time fits in gpu-0: placements whose memory slices are disjoint
    and whose compute slices add up to at most 7 (never the whole GPU: it is not offered)."""
    assert "gpu-0" not in devices.values(), devices
    used = [PLACEMENTS[d] for d in devices.values()]
    slices_used = Counter(i for p in used for i in p.memory_slices)
    assert all(n == 1 for n in slices_used.values()), devices
    assert sum(p.profile.compute_slices for p in used) <= mig.COMPUTE_SLICES, devices


def could_still_get(profile: str, held: list[mig.Placement], offered: set[str]) -> bool:
    """Whether the scheduler could still allocate a claim for ``profile`` beside ``held``:
    some offered placement of it that the hardware would take too."""
    return any(
        p.profile.name == profile and mig.conflict(p, held) is None
        for name, p in PLACEMENTS.items()
        if name in offered
    )


async def settled(
    api: kube.Kube, ns: str, wanted: dict[str, str], offered: set[str]
) -> tuple[dict[str, str]] | None:
    """Once the scheduler is done with the claims of ``wanted`` (claim -> profile): every one
    allocated has its pod Running, and none left could get a placement beside them. What is
    allocated then, in a 1-tuple (``{}`` is an answer too).

    Not "every pod Running or found unschedulable once": a pod refused before keeps its
    FailedScheduling Event, so that reads as settled while the scheduler is still handing out
    what others just freed (the flake of issue 26: a second wave sampled half allocated, then
    waited for instances of exactly those claims while the rest were being prepared)."""
    now = await allocated(api, ns)
    assert_fits(now)  # checked on every sample, not only at the end
    held = [PLACEMENTS[d] for c, d in now.items() if c in wanted]
    for claim, profile in wanted.items():
        if claim in now:
            if not await is_running(api, ns, claim):
                return None
        elif profile != "whole" and could_still_get(profile, held, offered):
            return None
    return ({c: d for c, d in now.items() if c in wanted},)


async def is_running(api: kube.Kube, ns: str, pod: str) -> bool:
    current = await api.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    return bool(current["status"].get("phase") == "Running")


@contextlib.asynccontextmanager
async def diagnosed(api: kube.Kube, ns: str, agent: AgentProcess) -> AsyncIterator[None]:
    """On a failure, print what explains it while it is still there: the pods and their
    state, the namespace's Events, the agent's log and the instances, the hardware's and the
    checkpoint's (the fixtures delete the pods right after)."""
    try:
        yield
    except BaseException:
        lines = ["---- diagnostics (before teardown) ----"]
        with contextlib.suppress(Exception):
            for pod in (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]:
                status = pod["status"]
                waiting = [
                    c.get("state", {}).get("waiting", {}).get("reason", "")
                    for c in status.get("containerStatuses") or []
                ]
                lines.append(f"pod {pod['metadata']['name']}: {status.get('phase')} {waiting}")
            lines.append(f"allocated: {await allocated(api, ns)}")
            for event in await events_of(api, ns):
                who = event["involvedObject"]["name"]
                lines.append(f"event {who}: {event.get('reason')}: {event.get('message')}")
        with contextlib.suppress(Exception):
            lines.append(f"instances: {instances(agent)}")
            lines.append(f"recorded: {recorded_instances(agent)}")
        with contextlib.suppress(Exception):
            lines.extend(agent.log_file.read_text().splitlines()[-150:])
        print("\n".join(lines))
        raise


async def test_a_burst_of_mig_claims_never_over_commits_the_gpu(
    api: kube.Kube, kubectl: Kubectl, namespace: str, mig_class: str, agent: AgentProcess
) -> None:
    ns = namespace
    async with diagnosed(api, ns, agent):
        await burst_never_over_commits(api, kubectl, ns, mig_class, agent)


async def burst_never_over_commits(
    api: kube.Kube, kubectl: Kubectl, ns: str, mig_class: str, agent: AgentProcess
) -> None:
    partitions_served = await server_minor(api) >= 36
    offered = set(await eventually(lambda: published(api), timeout=60, what="slices"))
    if not partitions_served:
        # 1.35: no counters, so only the partition that excludes every other is offered.
        assert offered == {mig.partition_name_of("gpu-0", mig.Placement(PROFILES[FULL], 0))}
    else:
        assert offered == set(PLACEMENTS)  # the 25 placements, not the whole GPU
    wanted = {f"c{i}-{p.replace('.', '-')}": p for i, p in enumerate(BURST)}
    wanted["whole"] = "whole"
    await asyncio.gather(
        *(claim_and_pod(api, ns, n, mig_class, selector=selector(p)) for n, p in wanted.items())
    )
    (first,) = await eventually(
        lambda: settled(api, ns, wanted, offered), timeout=180, what="burst scheduled"
    )
    assert "whole" not in first  # never: the whole GPU of a MIG-mode GPU is not offered
    if not partitions_served:
        assert first == {}
        await claim_and_pod(api, ns, "full", mig_class, selector=selector(FULL))
        (full,) = await eventually(
            lambda: settled(api, ns, {"full": FULL}, offered), timeout=180, what="full scheduled"
        )
        assert instances(agent) == {
            full["full"]: (await gpu_env(kubectl, ns, "full", "main"))["GPU_DEVICE_0_MIG"]
        }
        return

    assert len(first) >= 2, first  # partitions were handed out, several at once
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
    waiting = {n: p for n, p in wanted.items() if n not in first}

    async def second_wave() -> dict[str, str] | None:
        if set(await allocated(api, ns)) & set(first):
            return None  # the first wave is still leaving
        found = await settled(api, ns, waiting, offered)
        return found[0] if found and found[0] else None

    second = await eventually(second_wave, timeout=180, what="waiting claims scheduled")
    assert "whole" not in second

    # The first wave's instances went with its pods; the second wave's are there, exactly.
    async def second_instances() -> dict[str, str] | None:
        made = instances(agent)
        return made if set(made) == set(second.values()) else None

    made = await eventually(second_instances, timeout=120, what="instances of the second wave")
    assert recorded_instances(agent) == made
    refused = {e["involvedObject"]["name"] for e in await events_of(api, ns)}
    assert "whole" in refused, "the whole-GPU claim's pod was found unschedulable"


async def one_running_pod(
    api: kube.Kube, ns: str, device_class: str, name: str, partitions_served: bool
) -> str:
    """A pod on a 3g.20gb partition (1.35: the full-size one); returns the allocated device."""
    await claim_and_pod(
        api, ns, name, device_class, selector=selector("3g.20gb" if partitions_served else FULL)
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
    assert before == {device: env_before["GPU_DEVICE_0_MIG"]}
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
    await claim_and_pod(api, ns, name, mig_class, selector=selector("3g.20gb" if served else FULL))

    def died() -> bool:
        return agent.exited

    await eventually(died, timeout=180, what="the agent killed at mig-instance-created")
    leaked = instances(agent)
    assert len(leaked) == 1, "created before the kill"
    assert recorded_instances(agent) == {}, "... and never recorded"
    agent.env.clear()
    await agent.astart()
    # Its own (the intents file says so), not someone else's: destroyed, not left alone.
    assert "no prepared claim holds it" in agent.log_file.read_text()
    assert instances(agent) == {} or recorded_instances(agent) == instances(agent)

    async def running() -> bool:
        return await is_running(api, ns, name)

    await eventually(running, timeout=180, what=f"pod {name} Running after the retry")
    made = instances(agent)
    assert len(made) == 1, made
    assert recorded_instances(agent) == made, "exactly the recorded instance, nothing leaked"
    assert not agent.exited


async def node_events(api: kube.Kube, reason: str) -> list[kube.Body]:
    listing = await api.get(
        "/api/v1/namespaces/default/events",
        fieldSelector=f"involvedObject.kind=Node,involvedObject.name=node-01,reason={reason}",
    )
    items: list[kube.Body] = listing.get("items", [])
    return items


async def test_a_mig_mode_gpu_without_privileges_publishes_nothing_and_the_node_goes_on(
    api: kube.Kube, namespace: str, mig_class: str, agent_with: AgentStarter
) -> None:
    ns = namespace
    async with agent_with(UNPRIVILEGED) as started, diagnosed(api, ns, started):
        devices = await eventually(lambda: published(api), timeout=60, what="slices")
        assert devices == ["gpu-1"]  # no partition of gpu-0, and not gpu-0 whole
        events = await eventually(
            lambda: node_events(api, "MigManagementRefused"), what="the Node's Warning Event"
        )
        message = events[-1]["message"]
        assert events[-1]["type"] == "Warning"
        assert "gpu-0" in message
        assert "nvmlDeviceGetGpuInstancePossiblePlacements" in message
        assert "agent.mig.manage=true" in message
        # The rest of the node is served: a claim gets gpu-1 and its pod runs.
        await claim_and_pod(api, ns, "plain", mig_class)

        async def running() -> bool:
            return await is_running(api, ns, "plain")

        await eventually(running, timeout=180, what="pod plain Running")
        assert (await allocated(api, ns)) == {"plain": "gpu-1"}
        assert not started.exited
        assert instances(started) == {}


async def test_instances_of_others_are_left_alone_and_nothing_is_allocated_over_them(
    api: kube.Kube,
    namespace: str,
    mig_class: str,
    agent_with: AgentStarter,
    node_named: dict[str, RealNode],
) -> None:
    ns = namespace
    served = await server_minor(api) >= 36
    # A 3g.20gb at memory slices 4-7 made by someone else (the mig-manager's layout).
    theirs = mig.Placement(PROFILES["3g.20gb"], 4)
    path = table_file(node_named["node-01"].cdi_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "parent": "gpu-0",
        "profile": "3g.20gb",
        "start": 4,
        "gpuInstance": 1,
        "computeInstance": 0,
        "uuid": "MIG-00000000-0000-4000-8000-00000000fore",
    }
    path.write_text(json.dumps([entry]))
    try:
        async with agent_with(PROFILE) as started, diagnosed(api, ns, started):
            expected = sorted(n for n, p in PLACEMENTS.items() if mig.conflict(p, [theirs]) is None)
            devices = await eventually(lambda: published(api), timeout=60, what="slices")
            # 1.35 (no counters): of the placements left, the one that excludes all the others
            # (4g.20gb over slices 0-3, beside theirs), so one claim at a time holds what is free.
            assert devices == (expected if served else ["gpu-0-mig-4g-20gb-0"])
            assert "left MIG instance" in started.log_file.read_text()
            assert await eventually(
                lambda: node_events(api, "MigInstancesLeftAlone"), what="the Node's Event"
            )
            await claim_and_pod(api, ns, "beside", mig_class, selector=selector("4g.20gb"))
            (got,) = await eventually(
                lambda: settled(api, ns, {"beside": "4g.20gb"}, set(devices)),
                timeout=180,
                what="the 4g.20gb claim scheduled",
            )
            assert got == {"beside": "gpu-0-mig-4g-20gb-0"}
            made = instances(started)
            assert set(made) == {"gpu-0-mig-3g-20gb-4", "gpu-0-mig-4g-20gb-0"}
            # A claim that could only go over theirs waits.
            await claim_and_pod(api, ns, "over", mig_class, selector=selector(FULL))
            assert await eventually(
                lambda: events_of_pod(api, ns, "over"), timeout=60, what="pod over refused"
            )
        # The agent stopped, its pods gone: theirs is still there, untouched.
        assert json.loads(path.read_text()) == [entry]
    finally:
        path.unlink(missing_ok=True)


async def events_of_pod(api: kube.Kube, ns: str, pod: str) -> list[kube.Body]:
    return [
        e
        for e in await events_of(api, ns)
        if e["involvedObject"]["name"] == pod and e.get("reason") == "FailedScheduling"
    ]


# ---- the chart asks for MIG's privileges only when told to ----------------------------------


def test_the_chart_makes_the_agent_privileged_only_for_mig_on_nvml_nodes() -> None:
    from tests.chart.template import container, env_of, find, render

    def agent_of(*values: str) -> tuple[dict[str, object], dict[str, str]]:
        daemonset = find(render(*(a for v in values for a in ("--set", v))), "DaemonSet")
        downward = {
            "spec.nodeName": "node-01",
            "metadata.uid": "0a1b2c3d-0000-4000-8000-0000000000aa",
        }
        return container(daemonset)["securityContext"], env_of(daemonset, downward)

    for values in [(), ("agent.backend=nvml",), ("agent.mig.manage=true",)]:
        security, env = agent_of(*values)  # the default; nvml without MIG; simulated GPUs
        assert "privileged" not in security, values
        assert security["capabilities"] == {"drop": ["ALL"]}, values
        assert "NVIDIA_MIG_CONFIG_DEVICES" not in env, values
        assert env["DRA_GPU_MIG_OWN_LAYOUT"] == "false", values
    security, env = agent_of("agent.backend=nvml", "agent.mig.manage=true")
    assert security == {"privileged": True, "readOnlyRootFilesystem": True}
    assert env["NVIDIA_MIG_CONFIG_DEVICES"] == "all"
    _, env = agent_of("agent.mig.ownLayout=true")
    assert env["DRA_GPU_MIG_OWN_LAYOUT"] == "true"

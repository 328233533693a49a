"""Two agents of one driver on one node: no fight over the pool.

Both run as real processes (``python -m dra_gpu agent``) for the same real node, registered
with its kubelet through the same kubelet directory, as two DaemonSets with one driver name
would, but different device profiles, so that each finds the other's pool wrong. The one the
kubelet registered last keeps publishing; the other backs off exponentially, both say why
(log, Warning Event on the Node, metrics), and once the winner stops, the other takes over.
With the same CDI and checkpoint directories too (two releases with the chart's default host
paths), what the winner prepared is the other's to unprepare once it takes over, and the loser
writes nothing there meanwhile.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint, slices
from dra_gpu.testing import AgentProcess, ControlPlane, RealNode, eventually
from tests.e2e.helpers import allocated_claim, plugin_call

NODE = "node-03"
DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
CONFLICT = "ResourcePoolConflict"


Pair = tuple[AgentProcess, AgentProcess]


@pytest_asyncio.fixture
async def agent_pair(
    control_plane: ControlPlane,
    node_named: dict[str, RealNode],
    api: kube.Kube,
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Pair]]:
    """Two agents for one node, 2 and 3 GPUs, not started; ``shared=True``: one CDI and one
    checkpoint directory for both."""
    agents: list[AgentProcess] = []

    def make(*, shared: bool = False) -> Pair:
        for name, gpus in (("first", 2), ("second", 3)):
            profile = tmp_path / f"{name}.yaml"
            profile.write_text(
                f"nodes:\n  {NODE}:\n    devices:\n    - count: {gpus}\n      memory: 8Gi\n"
            )
            host = tmp_path / "host"
            agent = AgentProcess(
                NODE,
                control_plane.kubeconfig,
                node_named[NODE].kubelet_dir,
                tmp_path / name,
                profile=profile,
                resync_seconds=5.0,
                extra_args=(f"--cdi-dir={host}/cdi", f"--checkpoint-dir={host}/checkpoint")
                if shared
                else (),
            )
            agents.append(agent)
        return agents[0], agents[1]

    yield make
    for agent in agents:
        agent.stop()
    for item in await node_slices(api):
        await api.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")


async def node_slices(api: kube.Kube) -> list[kube.Body]:
    listing = await api.get(
        f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER},spec.nodeName={NODE}"
    )
    items: list[kube.Body] = listing["items"]
    return items


async def pool_of(api: kube.Kube, devices: int) -> tuple[int, str] | None:
    """(generation, publisher instance) once the pool holds ``devices`` devices."""
    found = await node_slices(api)
    if sum(len(s["spec"]["devices"]) for s in found) != devices:
        return None
    (item,) = found
    publisher = slices.publisher_of(item)
    assert publisher is not None, item["metadata"]
    return item["spec"]["pool"]["generation"], publisher.instance


def log_of(agent: AgentProcess) -> str:
    return agent.log_file.read_text()


def instance_of(agent: AgentProcess) -> str:
    found = re.search(rf"serving {DRIVER} on node {NODE} as (\S+):", log_of(agent))
    assert found is not None, log_of(agent)
    return found.group(1)


def metric(agent: AgentProcess, name: str) -> float:
    for line in agent.metrics().splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def conflict_notes(api: kube.Kube) -> list[str]:
    listing = await api.get(
        "/api/v1/namespaces/default/events",
        fieldSelector=f"involvedObject.kind=Node,involvedObject.name={NODE},reason={CONFLICT}",
    )
    return [e.get("message", "") for e in listing["items"]]


async def test_the_later_agent_keeps_the_pool_the_other_backs_off_and_takes_over_after_it(
    api: kube.Kube, agent_pair: Callable[..., Pair]
) -> None:
    first, second = agent_pair()
    await first.astart()
    await eventually(lambda: pool_of(api, 2), what="the first agent's pool (2 devices)")
    notes_before = await conflict_notes(api)

    # The second one takes the sockets, the kubelet registers it, it publishes its 3 devices.
    await second.astart()
    one, two = instance_of(first), instance_of(second)
    generation, writer = await eventually(
        lambda: pool_of(api, 3), what="the second agent's pool (3 devices)"
    )
    assert writer == two

    # The first one backs off and tries again ever more slowly; each try costs the pool at
    # most two generations (its write and the answer), where a fight would cost thousands.
    def tries() -> int:
        return log_of(first).count("trying to take it over")

    await eventually(lambda: tries() >= 2, timeout=90, what="two tries of the first agent")
    now, writer = await eventually(lambda: pool_of(api, 3), what="the second agent's pool")
    assert writer == two
    assert now - generation <= 2 * tries() + 2, f"generation {generation} -> {now}"

    # Both say why, naming each other: log lines, Events on the Node, metrics.
    assert f"also written by another agent, {two}" in log_of(first)
    assert "this agent backs off" in log_of(first)
    await eventually(
        lambda: "keeps publishing" in log_of(second), what="the second agent's log line"
    )
    assert f"also written by another agent, {one}" in log_of(second)

    async def new_notes() -> list[str] | None:
        notes = [n for n in await conflict_notes(api) if n not in notes_before]
        return notes if len(notes) >= 2 else None

    notes = await eventually(new_notes, what="a Warning Event on the Node from each agent")
    assert any(f"another agent, {two}" in n and "this agent backs off" in n for n in notes)
    assert any(f"another agent, {one}" in n and "keeps publishing" in n for n in notes)
    assert metric(first, "dra_gpu_slice_pool_yielding") == 1.0
    assert metric(first, f'dra_gpu_slice_pool_other_writer{{agent="{one}",other="{two}"}}') == 1
    assert metric(first, "dra_gpu_slice_pool_conflicts_total") >= 1
    assert metric(second, "dra_gpu_slice_pool_yielding") == 0.0

    # The second one goes (its sockets with it): the first one's come back, the kubelet
    # registers it again, and its devices are published.
    second.stop()
    await eventually(lambda: owned_by(api, 2, one), timeout=60, what="the first agent's pool")
    assert "re-created" in log_of(first)
    await eventually(
        lambda: metric(first, "dra_gpu_slice_pool_yielding") == 0.0,
        timeout=60,
        what="the first agent no longer yielding",
    )


async def owned_by(api: kube.Kube, devices: int, instance: str) -> bool:
    found = await pool_of(api, devices)
    return found is not None and found[1] == instance


async def test_with_shared_host_directories_the_claims_prepared_go_with_the_pool(
    api: kube.Kube,
    node_named: dict[str, RealNode],
    namespace: str,
    agent_pair: Callable[..., Pair],
    tmp_path: Path,
) -> None:
    node = node_named[NODE]
    first, second = agent_pair(shared=True)
    await first.astart()
    await second.astart()
    one = instance_of(first)
    await eventually(lambda: pool_of(api, 3), what="the second agent's pool (3 devices)")
    await eventually(lambda: "no longer writing" in log_of(first), what="the first agent retired")

    claim = await allocated_claim(api, namespace, NODE, "gpu-0")
    # Prepared as the kubelet would: by the second agent
    prepared = str(await plugin_call(node, "prepare", claim))
    cdi_dir, recorded = tmp_path / "host" / "cdi", tmp_path / "host" / "checkpoint"
    assert set(cdi.list_claim_specs(cdi_dir, DRIVER)) == {claim.uid}
    assert set(checkpoint.read_checkpoint(recorded / "checkpoint.json").claims) == {claim.uid}

    # The second one goes; the first one takes over the sockets, the pool, and the claim.
    second.stop()
    await eventually(lambda: owned_by(api, 2, one), timeout=60, what="the first agent's pool")
    again = str(await plugin_call(node, "prepare", claim))
    assert again == prepared, "answered from the checkpoint the second agent left"
    await plugin_call(node, "unprepare", claim)
    assert cdi.list_claim_specs(cdi_dir, DRIVER) == {}
    assert checkpoint.read_checkpoint(recorded / "checkpoint.json").claims == {}

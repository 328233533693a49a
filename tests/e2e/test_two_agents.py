"""Two agents of one driver on one node: no fight over the pool, and no gap in between.

Both run as real processes (``python -m dra_gpu agent``) for the same real node, registered
with its kubelet through the same kubelet directory, with different device profiles, so that
each finds the other's pool wrong.

- With the driver's fixed socket names (two DaemonSets with one driver name): the second
  takes the sockets over, the kubelet registers it, and it publishes; the first hands the pool
  over (a Normal Event, no tries, no conflict) and takes it back once the second is gone. With
  the same CDI and checkpoint directories too, what the winner prepared is the other's to
  unprepare once it takes over, and the loser writes nothing there meanwhile.
- With sockets of their own (the chart's pods, ``--pod-uid``: a rolling update), both stay
  registered; the kubelet prepares through the newer, the older hands the pool over, and
  stopping the older while pods start loses no prepare: one checkpoint, serialized by the
  lock both take.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint, slices
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.testing import AgentProcess, ControlPlane, RealNode, eventually
from tests.e2e.helpers import (
    allocated_claim,
    claim_and_pod,
    delete_our_slices,
    driver_class,
    plugin_call,
)

NODE = "node-03"
DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
CONFLICT = "ResourcePoolConflict"
HANDOVER = "ResourcePoolHandedOver"


Pair = tuple[AgentProcess, AgentProcess]


@pytest_asyncio.fixture
async def agent_pair(
    control_plane: ControlPlane,
    node_named: dict[str, RealNode],
    api: kube.Kube,
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Pair]]:
    """Two agents for one node, 2 and 3 GPUs, not started; ``shared=True``: one CDI and one
    checkpoint directory for both; ``pods=True``: sockets of their own (pod UIDs), the node's
    CDI directory (their pods run) and one checkpoint directory, as a rolling update's pods."""
    agents: list[AgentProcess] = []
    links: list[Path] = []

    def make(*, shared: bool = False, pods: bool = False) -> Pair:
        node = node_named[NODE]
        kubelet_dir = node.kubelet_dir
        if pods:
            # Per-pod socket names are 37 bytes longer; the node's kubelet directory (a long
            # path here, /var/lib/kubelet in a pod) is reached through a short link, so that
            # they fit a unix socket's 107 bytes, for us and for the kubelet that dials them.
            links.append(Path(tempfile.mkdtemp(prefix="k", dir="/tmp")))
            kubelet_dir = links[-1] / "k"
            kubelet_dir.symlink_to(node.kubelet_dir)
        for name, gpus in (("first", 2), ("second", 3)):
            profile = tmp_path / f"{name}.yaml"
            profile.write_text(
                f"nodes:\n  {NODE}:\n    devices:\n    - count: {gpus}\n      memory: 8Gi\n"
            )
            host = tmp_path / "host"
            extra: tuple[str, ...] = ()
            if shared:
                extra = (f"--cdi-dir={host}/cdi", f"--checkpoint-dir={host}/checkpoint")
            elif pods:
                extra = (f"--checkpoint-dir={host}/checkpoint",)
            agent = AgentProcess(
                NODE,
                control_plane.kubeconfig,
                kubelet_dir,
                tmp_path / name,
                profile=profile,
                resync_seconds=5.0,
                extra_args=extra,
                cdi=node.cdi_dir if pods else None,
                pod_uid=str(uuid.uuid4()) if pods else "",
            )
            agents.append(agent)
        return agents[0], agents[1]

    yield make
    for agent in agents:
        agent.stop()
    for item in await node_slices(api):
        await api.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")
    for link in links:
        shutil.rmtree(link, ignore_errors=True)


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


async def node_notes(api: kube.Kube, reason: str) -> list[str]:
    listing = await api.get(
        "/api/v1/namespaces/default/events",
        fieldSelector=f"involvedObject.kind=Node,involvedObject.name={NODE},reason={reason}",
    )
    return [e.get("message", "") for e in listing["items"]]


async def stays(check: Callable[[], object], seconds: float, what: str) -> None:
    """``check()`` holds (is truthy) at every look for ``seconds`` (an absence: nothing to
    wait for)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if asyncio.iscoroutine(found):
            found = await found
        assert found, what
        await asyncio.sleep(1.0)


async def test_the_later_agent_keeps_the_pool_the_other_hands_it_over_and_takes_it_back(
    api: kube.Kube, agent_pair: Callable[..., Pair]
) -> None:
    first, second = agent_pair()
    await first.astart()
    await eventually(lambda: pool_of(api, 2), what="the first agent's pool (2 devices)")
    conflicts_before = await node_notes(api, CONFLICT)
    handovers_before = await node_notes(api, HANDOVER)

    # The second one takes the sockets, the kubelet registers it, it publishes its 3 devices.
    await second.astart()
    one, two = instance_of(first), instance_of(second)
    generation, writer = await eventually(
        lambda: pool_of(api, 3), what="the second agent's pool (3 devices)"
    )
    assert writer == two

    # The first one hands the pool over while the second is registered: it says so once and
    # writes nothing at all, for several of its resyncs (5 s); not a conflict.
    await eventually(
        lambda: f"hands it over to {two}" in log_of(first), what="the first agent's handover"
    )

    async def unchanged() -> bool:
        return await pool_of(api, 3) == (generation, two)

    await stays(unchanged, 15.0, "the pool as the second agent wrote it")
    assert "trying to take it over" not in log_of(first)
    assert metric(first, "dra_gpu_slice_pool_yielding") == 1.0
    assert metric(first, "dra_gpu_slice_pool_conflicts_total") == 0
    assert metric(second, "dra_gpu_slice_pool_yielding") == 0.0

    async def handed_over() -> list[str] | None:
        notes = [n for n in await node_notes(api, HANDOVER) if n not in handovers_before]
        return notes or None

    (note,) = await eventually(handed_over, what="a Normal Event on the Node from the first")
    assert f"{one} hands it over to {two}" in note
    assert [n for n in await node_notes(api, CONFLICT) if n not in conflicts_before] == []

    # The second one goes (its sockets with it): the first one's come back, the kubelet
    # registers it again, and it takes its pool back at once.
    second.stop()
    await eventually(lambda: owned_by(api, 2, one), timeout=60, what="the first agent's pool")
    assert "re-created" in log_of(first)
    assert "takes it back from" in log_of(first)
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


async def dra_call(
    socket: Path, method: str, claim: v1.Claim
) -> v1.NodePrepareResourceResponse | v1.NodeUnprepareResourceResponse:
    """``method`` (prepare, unprepare) of ``claim`` on one agent's DRA socket, as the kubelet
    calls it; the claim's answer, which must not be an error."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        result: v1.NodePrepareResourceResponse | v1.NodeUnprepareResourceResponse
        if method == "prepare":
            request = v1.NodePrepareResourcesRequest(claims=[claim])
            result = (await stub.NodePrepareResources(request, timeout=40)).claims[claim.uid]
        else:
            request_ = v1.NodeUnprepareResourcesRequest(claims=[claim])
            result = (await stub.NodeUnprepareResources(request_, timeout=40)).claims[claim.uid]
    assert not result.error, result.error
    return result


def dra_socket_of(agent: AgentProcess) -> Path:
    return agent.kubelet_dir / "plugins" / DRIVER / f"dra-{agent.pod_uid}.sock"


def registrations(node: RealNode) -> list[str]:
    return sorted(p.name for p in (node.kubelet_dir / "plugins_registry").glob(f"{DRIVER}*.sock"))


async def running(api: kube.Kube, namespace: str, name: str) -> bool:
    pod = await api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return bool(pod.get("status", {}).get("phase") == "Running")


async def failed_prepares(api: kube.Kube, namespace: str) -> list[str]:
    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/events",
        fieldSelector="reason=FailedPrepareDynamicResources",
    )
    return [e.get("message", "") for e in listing["items"]]


async def test_with_sockets_of_their_own_the_newer_prepares_and_stopping_the_older_loses_nothing(
    api: kube.Kube,
    node_named: dict[str, RealNode],
    namespace: str,
    agent_pair: Callable[..., Pair],
    tmp_path: Path,
) -> None:
    node = node_named[NODE]
    first, second = agent_pair(pods=True)
    recorded = tmp_path / "host" / "checkpoint" / "checkpoint.json"
    await first.astart()
    await eventually(lambda: pool_of(api, 2), what="the first agent's pool (2 devices)")
    await second.astart()
    one, two = instance_of(first), instance_of(second)

    # Both registered, side by side: nobody's sockets replaced, nobody retired.
    assert registrations(node) == sorted(f"{DRIVER}-{a.pod_uid}-reg.sock" for a in (first, second))
    for agent in (first, second):

        def registered(agent: AgentProcess = agent) -> bool:
            return metric(agent, "dra_gpu_agent_registered") == 1.0

        await eventually(registered, what=f"{agent.pod_uid} registered with the kubelet")
    assert "no longer writing" not in log_of(first)
    # The newer publishes; the older hands the pool over.
    await eventually(lambda: owned_by(api, 3, two), what="the second agent's pool")
    await eventually(lambda: f"hands it over to {two}" in log_of(first), what="the handover")

    async with driver_class(api, f"two-agents-{namespace}") as device_class:
        # The kubelet prepares through the newer one.
        await claim_and_pod(api, namespace, "p1", device_class, node=NODE)
        await eventually(lambda: running(api, namespace, "p1"), timeout=90, what="p1 running")
        prepared = 'dra_gpu_prepare_claims_total{result="success"}'
        assert metric(second, prepared) >= 1
        assert metric(first, prepared) == 0

        # A call the older one is answering when it is told to stop: it waits for the lock,
        # which the test holds (the newer one's prepare, say); the registration stays until it
        # is answered, and the answer is on record for the newer one.
        claim = await allocated_claim(api, namespace, NODE, "gpu-1", name="direct")
        lock = os.open(recorded.parent / "serialize.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            call = asyncio.create_task(dra_call(dra_socket_of(first), "prepare", claim))
            await asyncio.sleep(0.5)  # the call reaches the agent and waits for the lock
            assert not call.done()
            stopping = asyncio.create_task(asyncio.to_thread(first.stop, 60))
            await eventually(
                lambda: "waiting for 1 call(s) being answered" in log_of(first),
                what="the older agent waiting for its call",
            )
            assert f"{DRIVER}-{first.pod_uid}-reg.sock" in registrations(node)
            # Pods start meanwhile: the kubelet sends them to the newer one.
            await claim_and_pod(api, namespace, "p2", device_class, node=NODE)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
        answered = await asyncio.wait_for(call, 40)
        assert await stopping == 0
        assert registrations(node) == [f"{DRIVER}-{second.pod_uid}-reg.sock"]
        await eventually(lambda: running(api, namespace, "p2"), timeout=90, what="p2 running")
        assert await failed_prepares(api, namespace) == []

        # The newer one answers the claim from the older one's record: nothing lost, nothing
        # prepared twice; one checkpoint holds every claim.
        again = await dra_call(dra_socket_of(second), "prepare", claim)
        assert again == answered
        on_disk = checkpoint.read_checkpoint(recorded).claims
        assert claim.uid in on_disk
        assert len(on_disk) == 3
        await dra_call(dra_socket_of(second), "unprepare", claim)
        await api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")

        async def nothing_prepared() -> bool:
            pods = (await api.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
            return not pods and not checkpoint.read_checkpoint(recorded).claims

        await eventually(nothing_prepared, timeout=90, what="the pods gone, unprepared")
    await delete_our_slices(api, [NODE])
    assert one != two

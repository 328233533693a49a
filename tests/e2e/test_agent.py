"""The node agent as a real process, with the real control plane and real nodes.

Every agent runs as ``python -m dra_gpu agent`` (the chart's command) for one of the session's
real nodes: registered with its kubelet, its CDI specs in the node's ``/var/run/cdi`` where
containerd reads them, its checkpoint in a directory of its own. Pods really run (busybox), and
what CDI gave them is read from inside the container. Each test stops its agents and removes
their slices afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import stat
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.proto.dra.v1beta1 import api_pb2 as v1beta1
from dra_gpu.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_gpu.testing import AgentProcess, ControllerProcess, ControlPlane, RealNode, eventually
from tests.e2e.helpers import (
    EXAMPLES,
    TUTORIAL_PROFILE,
    Kubectl,
    delete_our_slices,
    driver_class,
    event_with,
    gpu_env,
    workload,
)

DRIVER = "gpu.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"

AgentFactory = Callable[..., Awaitable[AgentProcess]]


@pytest_asyncio.fixture
async def start_agent(
    control_plane: ControlPlane,
    node_named: dict[str, RealNode],
    api: kube.Kube,
    namespace: str,
    tmp_path: Path,
) -> AsyncIterator[AgentFactory]:
    """Starts agents; afterwards deletes the test's pods while the agents still run (a pod
    whose claim was prepared only goes once the driver unprepared it), then stops them."""
    agents: list[AgentProcess] = []

    async def start(node: str, profile: Path = TUTORIAL_PROFILE, **options: Any) -> AgentProcess:
        state = tmp_path / f"agent-{node}-{len(agents)}"
        agent = AgentProcess.on(
            node_named[node], control_plane.kubeconfig, state, profile=profile, **options
        )
        agents.append(agent)
        await agent.astart()
        return agent

    yield start
    await api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")
    await eventually(lambda: nothing_left_but_claim(api, namespace), what="test pods gone")
    for agent in agents:
        agent.stop()
        journal = checkpoint.journal_path(agent.checkpoint_file)
        for path in (agent.checkpoint_file, journal, *agent.cdi_dir.glob("*.json")):
            path.unlink(missing_ok=True)
    await delete_our_slices(api)


@pytest_asyncio.fixture
async def tutorial_class(api: kube.Kube, kubectl: Kubectl) -> AsyncIterator[None]:
    yield
    await api.delete(f"{RESOURCE}/deviceclasses/gpu-inferencia")


async def node_slices(api: kube.Kube, node: str) -> list[kube.Body]:
    listing = await api.get(
        f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER},spec.nodeName={node}"
    )
    items: list[kube.Body] = listing["items"]
    return items


async def only_claim(api: kube.Kube, ns: str) -> kube.Body | None:
    items = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
    return items[0] if len(items) == 1 else None


async def running_pod(api: kube.Kube, ns: str) -> kube.Body | None:
    pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    return running[0] if running else None


async def test_the_whole_tutorial_runs_the_pod_with_gpu_0_prepared_by_the_agent(
    api: kube.Kube,
    kubectl: Kubectl,
    namespace: str,
    start_agent: AgentFactory,
    tutorial_class: None,
) -> None:
    ns = namespace
    # Without a driver: class missing, then (with the class) nothing to allocate.
    await kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "recomendador.yaml"))
    await eventually(
        lambda: event_with(api, ns, "FailedScheduling", "device class gpu-inferencia does not"),
        what="class missing",
    )
    await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    await eventually(
        lambda: event_with(api, ns, "FailedScheduling", "cannot allocate all claims"),
        what="no devices",
    )

    # The driver instead of a hand-made slice.
    agents = [await start_agent(node) for node in ("node-01", "node-02", "node-03")]
    assert f"registered with the kubelet as {DRIVER}" in agents[0].log_file.read_text()
    published = await eventually(lambda: node_slices(api, "node-01"), what="node-01's slice")
    assert [d["name"] for d in published[0]["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert await eventually(lambda: node_slices(api, "node-02"), what="node-02's (empty) pool")

    pod = await eventually(lambda: running_pod(api, ns), what="the pod Running")
    assert pod["spec"]["nodeName"] == "node-01"
    claim = await only_claim(api, ns)
    assert claim is not None
    uid = claim["metadata"]["uid"]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert (result["pool"], result["device"]) == ("node-01", "gpu-0")

    # What the container got from containerd, through the CDI spec the agent wrote.
    env = await gpu_env(kubectl, ns, pod["metadata"]["name"], "recomendador")
    assert env["GPU_DEVICE_0"] == "gpu-0"
    spec_file = agents[0].cdi_dir / cdi.spec_file_name(DRIVER, uid)
    spec = json.loads(spec_file.read_text())
    assert [d["name"] for d in spec["devices"]] == [cdi.cdi_device_name(uid, "gpu-0")]
    assert uid in checkpoint.read_checkpoint(agents[0].checkpoint_file).claims

    async def device_status() -> list[kube.Body]:
        claim = await only_claim(api, ns)
        return (claim or {}).get("status", {}).get("devices", [])

    entries = await eventually(device_status, what="status.devices written")
    assert [(e["driver"], e["pool"], e["device"]) for e in entries] == [
        (DRIVER, "node-01", "gpu-0")
    ]
    assert entries[0]["conditions"][0]["type"] == "Ready"
    assert entries[0]["conditions"][0]["status"] == "True"
    assert entries[0]["data"]["memory"] == "24Gi"
    assert not await event_with(api, ns, "FailedPrepareDynamicResources", "")

    # Deleting the Deployment unprepares: spec and checkpoint entry gone, claim gone.
    await kubectl("delete", "-n", ns, "deployment/recomendador")
    await eventually(lambda: nothing_left(api, ns), what="pod and claim gone")
    assert not spec_file.exists()
    assert uid not in checkpoint.read_checkpoint(agents[0].checkpoint_file).claims
    assert 'dra_gpu_prepare_claims_total{result="success"} 1.0' in agents[0].metrics()
    # What the agent wanted in status.devices is written, or moot now: nothing kept of it.
    pending = "dra_gpu_status_writes_pending"
    await eventually(
        lambda: f"{pending} 0.0" in agents[0].metrics(pending) or None,
        what="no status write pending",
    )


async def running_container(api: kube.Kube, ns: str, pod: str) -> str | None:
    """The ID of the pod's (only) container while it runs."""
    status = (await api.get(f"/api/v1/namespaces/{ns}/pods/{pod}"))["status"]
    containers = status.get("containerStatuses") or [{}]
    running = "running" in containers[0].get("state", {})
    return str(containers[0]["containerID"]) if running else None


async def nothing_left(api: kube.Kube, ns: str) -> bool:
    pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
    claims = (await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims"))["items"]
    return not pods and not claims


# --- a pod with one claim, without the tutorial's template ------------------------------------


@pytest_asyncio.fixture
async def any_gpu_class(api: kube.Kube) -> AsyncIterator[str]:
    async with driver_class(api, "dra-gpu-test-any") as name:
        yield name


async def claim_and_pod(
    api: kube.Kube, ns: str, device_class: str, node: str, config: object = None
) -> tuple[kube.Body, kube.Body]:
    devices: kube.Body = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
    }
    if config is not None:
        devices["config"] = [{"opaque": {"driver": DRIVER, "parameters": config}}]
    claim = await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {
            "metadata": {"name": "gpu"},
            "spec": {"devices": devices},
        },
    )
    pod = await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "worker"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [workload("main", claims=["gpu"])],
            },
        },
    )
    return claim, pod


async def running_worker(api: kube.Kube, ns: str, device_class: str) -> str:
    """The pod ``worker`` on node-01 with its claim ``gpu``, Running; returns the claim's UID."""
    claim, _ = await claim_and_pod(api, ns, device_class, "node-01")
    await eventually(lambda: running_pod(api, ns), what="pod Running")
    uid: str = claim["metadata"]["uid"]
    return uid


async def delete_worker_and_check_nothing_is_left(
    api: kube.Kube, ns: str, agent: AgentProcess
) -> None:
    """The deletion goes through unprepare: no spec and no checkpoint entry remain."""
    await api.delete(f"/api/v1/namespaces/{ns}/pods/worker")
    await eventually(lambda: nothing_left_but_claim(api, ns), what="pod gone")
    assert checkpoint.read_checkpoint(agent.checkpoint_file).claims == {}
    assert list(agent.cdi_dir.glob("*.json")) == []


def dra_socket(node: RealNode) -> str:
    return f"unix://{node.kubelet_dir}/plugins/{DRIVER}/dra.sock"


async def test_prepare_repeats_the_same_answer_over_v1_and_v1beta1(
    api: kube.Kube,
    node_named: dict[str, RealNode],
    namespace: str,
    start_agent: AgentFactory,
    any_gpu_class: str,
) -> None:
    await start_agent("node-01")
    uid = await running_worker(api, namespace, any_gpu_class)
    recorded = node_named["node-01"].prepared_claims()[uid].devices
    request = [v1.Claim(namespace=namespace, name="gpu", uid=uid)]
    async with grpc.aio.insecure_channel(dra_socket(node_named["node-01"])) as channel:
        first = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=request)
        )
        again = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=request)
        )
        beta = await v1beta1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1beta1.NodePrepareResourcesRequest(
                claims=[v1beta1.Claim(namespace=namespace, name="gpu", uid=uid)]
            )
        )
    assert first == again
    assert first.SerializeToString() == beta.SerializeToString()
    (device,) = first.claims[uid].devices
    assert (device.pool_name, list(device.request_names)) == ("node-01", ["gpu"])
    assert list(device.cdi_device_ids) == list(recorded[0].cdi_ids)
    assert list(device.cdi_device_ids) == [cdi.cdi_device_id(DRIVER, uid, device.device_name)]


@pytest.mark.parametrize("agent_restarts", [False, True], ids=["agent-kept", "agent-restarted"])
async def test_a_reboot_restores_the_specs_and_prepares_nothing_twice(
    api: kube.Kube,
    kubectl: Kubectl,
    node_named: dict[str, RealNode],
    namespace: str,
    start_agent: AgentFactory,
    any_gpu_class: str,
    agent_restarts: bool,
) -> None:
    node = node_named["node-01"]
    agent = await start_agent("node-01")
    uid = await running_worker(api, namespace, any_gpu_class)
    spec_file = agent.cdi_dir / cdi.spec_file_name(DRIVER, uid)
    spec_before = spec_file.read_bytes()
    env_before = await gpu_env(kubectl, namespace, "worker", "main")
    recorded = checkpoint.read_checkpoint(agent.checkpoint_file).claims[uid]
    first_run = await running_container(api, namespace, "worker")

    if agent_restarts:
        agent.kill()  # the agent goes down with the node ...
    await asyncio.to_thread(node.reboot)  # ... which comes back with an empty /run (CDI specs)
    if agent_restarts:
        await agent.astart()

    async def started_again() -> str | None:
        container = await running_container(api, namespace, "worker")
        return container if container not in (None, first_run) else None

    # The kubelet starts the pod's containers again, preparing its claim again first.
    await eventually(started_again, timeout=120, what="the pod's container started again")
    assert await gpu_env(kubectl, namespace, "worker", "main") == env_before
    assert spec_file.read_bytes() == spec_before, "the same spec, written again"
    assert checkpoint.read_checkpoint(agent.checkpoint_file).claims == {uid: recorded}
    # Prepared once: the kubelet's second call got the recorded answer, one claim on record.
    # (The 1.35 and 1.36 kubelets append the re-prepared devices to their own record after a
    # reboot, so gpu-0 may be listed twice there; 1.37 replaces it.)
    assert {d.device for d in node.prepared_claims()[uid].devices} == {"gpu-0"}
    assert "dra_gpu_prepared_claims 1.0" in agent.metrics()
    assert await node_slices(api, "node-01"), "slices published again after the wipe"

    await delete_worker_and_check_nothing_is_left(api, namespace, agent)


async def test_records_the_kubelet_forgot_are_unprepared_once_their_claims_moved_on(
    api: kube.Kube,
    namespace: str,
    start_agent: AgentFactory,
    any_gpu_class: str,
) -> None:
    agent = await start_agent("node-01")
    uid = await running_worker(api, namespace, any_gpu_class)
    idle = await api.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {"metadata": {"name": "idle"}, "spec": {"devices": {"requests": []}}},
    )
    agent.kill()
    # Left from before, while the node's kubelet state was wiped (nobody will ever ask to
    # unprepare them): a claim deleted since, one re-created under the same name with a new
    # UID, one that exists but is no longer allocated.
    recorded = checkpoint.read_checkpoint(agent.checkpoint_file)
    live = recorded.claims[uid]
    stale = {
        "0d5e6f70-0000-4000-8000-000000000001": ("deleted-long-ago", "it no longer exists"),
        "0d5e6f70-0000-4000-8000-000000000002": ("gpu", "it was deleted and re-created"),
        idle["metadata"]["uid"]: ("idle", "it is no longer allocated"),
    }
    for stale_uid, (name, _) in stale.items():
        spec = cdi.claim_spec(DRIVER, stale_uid, [("gpu-1", {"GPU_DEVICE_0": "gpu-1"})])
        cdi.write_claim_spec(agent.cdi_dir, spec, claim_uid=stale_uid)
        old = dataclasses.replace(live, uid=stale_uid, name=name, cdi_spec=spec)
        recorded = recorded.with_claim(old)
    checkpoint.write_checkpoint(agent.checkpoint_file, recorded)

    await agent.astart()

    def only_the_live_claim() -> bool:
        recorded = set(checkpoint.read_checkpoint(agent.checkpoint_file).claims)
        return recorded == {uid} == set(cdi.list_claim_specs(agent.cdi_dir, DRIVER))

    await eventually(only_the_live_claim, what="the stale records unprepared")
    log = agent.log_file.read_text()
    for stale_uid, (name, reason) in stale.items():
        assert f"unprepared claim {namespace}/{name} (uid {stale_uid}): {reason}" in log
    assert "dra_gpu_prepared_claims 1.0" in agent.metrics()


async def nothing_left_but_claim(api: kube.Kube, ns: str) -> bool:
    return not (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]


async def test_malformed_opaque_config_reaches_the_pods_events_naming_the_field(
    api: kube.Kube, namespace: str, start_agent: AgentFactory, any_gpu_class: str
) -> None:
    await start_agent("node-01")
    config = {
        "apiVersion": "gpu.dra-gpu.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS"},
    }
    await claim_and_pod(api, namespace, any_gpu_class, "node-01", config)
    event = await eventually(
        lambda: event_with(api, namespace, "FailedPrepareDynamicResources", "sharing.strategy"),
        what="the prepare error on the pod",
    )
    assert "NodePrepareResources failed for ResourceClaim gpu: " in event["message"]
    assert (
        "ResourceClaim config[0].opaque.parameters.sharing.strategy: 'MPS' is not one of "
        "Exclusive, TimeSlicing" in event["message"]
    )
    assert await running_pod(api, namespace) is None


async def test_200_devices_become_one_consistent_pool_of_two_slices(
    api: kube.Kube, start_agent: AgentFactory, tmp_path: Path
) -> None:
    profile = tmp_path / "big.yaml"
    profile.write_text("nodes:\n  node-03:\n    devices:\n    - count: 200\n      memory: 16Gi\n")
    await start_agent("node-03", profile)

    async def two_slices() -> list[kube.Body]:
        found = await node_slices(api, "node-03")
        return found if len(found) == 2 else []

    pool = await eventually(two_slices, what="two slices for node-03")
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in pool} == {2}
    assert len({s["spec"]["pool"]["generation"] for s in pool}) == 1
    names = [d["name"] for s in pool for d in s["spec"]["devices"]]
    assert sorted(len(s["spec"]["devices"]) for s in pool) == [72, 128]
    assert len(set(names)) == 200
    assert all(s["metadata"]["ownerReferences"][0]["kind"] == "Node" for s in pool)


async def test_a_slice_deleted_by_hand_is_published_again(
    api: kube.Kube, start_agent: AgentFactory
) -> None:
    await start_agent("node-02", resync_seconds=300)  # the watch, not the resync, must notice
    (first,) = await eventually(lambda: node_slices(api, "node-02"), what="node-02's slice")
    await api.delete(f"{RESOURCE}/resourceslices/{first['metadata']['name']}")

    async def republished() -> list[kube.Body]:
        found = await node_slices(api, "node-02")
        return [s for s in found if s["metadata"]["uid"] != first["metadata"]["uid"]]

    (again,) = await eventually(republished, what="node-02's slice again")
    assert again["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]


def truncated(text: str) -> str:
    return text[: len(text) // 2]


def bad_checksum(text: str) -> str:
    return json.dumps({**json.loads(text), "checksum": "0" * 64})


def unknown_version(text: str) -> str:
    return json.dumps({**json.loads(text), "version": "v9"})


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (truncated, "not valid JSON, truncated or damaged"),
        (bad_checksum, "checksum mismatch: file says 0000"),
        (unknown_version, "unknown checkpoint version 'v9'; this agent reads 'v1'"),
    ],
)
async def test_a_corrupt_checkpoint_is_kept_aside_reported_and_rebuilt_from_the_cluster(
    api: kube.Kube,
    namespace: str,
    start_agent: AgentFactory,
    any_gpu_class: str,
    damage: Callable[[str], str],
    reason: str,
) -> None:
    agent = await start_agent("node-01")
    uid = await running_worker(api, namespace, any_gpu_class)
    before = checkpoint.read_checkpoint(agent.checkpoint_file).claims[uid]

    agent.kill()
    bad = agent.checkpoint_file
    damaged = damage(bad.read_text())
    bad.write_text(damaged)
    await agent.astart()

    (kept,) = bad.parent.glob("checkpoint.json.corrupt-*")
    assert kept.read_text() == damaged, "the bad file is kept as it was"
    assert checkpoint.read_checkpoint(bad).claims == {uid: before}, "rebuilt, same record"
    assert "dra_gpu_checkpoint_corruptions_total 1.0" in agent.metrics()
    assert agent.probe("/healthz") == 200

    async def reported() -> kube.Body | None:
        listing = await api.get(
            "/api/v1/namespaces/default/events",
            fieldSelector="involvedObject.kind=Node,involvedObject.name=node-01",
        )
        found = [
            e
            for e in listing["items"]
            if e["reason"] == "CheckpointCorrupt" and kept.name in e["message"]
        ]
        return found[-1] if found else None

    event = await eventually(reported, what="CheckpointCorrupt event on node-01")
    assert event["type"] == "Warning"
    # Long paths make the event's note shortened in the middle; the log has it whole.
    assert event["message"].startswith(f"checkpoint {bad} is corrupt: ")
    assert "rebuilt 1 prepared claim(s)" in event["message"]
    assert f"checkpoint {bad} is corrupt: {reason}" in agent.log_file.read_text()

    # Serving from the rebuilt state: the pod's deletion unprepares the claim.
    await delete_worker_and_check_nothing_is_left(api, namespace, agent)
    kept.unlink()


async def test_bad_grpc_requests_get_per_claim_errors_and_the_agent_keeps_serving(
    node_named: dict[str, RealNode], start_agent: AgentFactory, namespace: str
) -> None:
    agent = await start_agent("node-01")
    socket = dra_socket(node_named["node-01"])
    many = [v1.Claim(namespace=namespace, name=f"c{i}", uid=f"uid-{i}") for i in range(1000)]
    async with grpc.aio.insecure_channel(socket) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        bad = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[
            v1.Claim(namespace=namespace, name="nope", uid="unknown-uid"),
            v1.Claim(namespace="", name="", uid="no-namespace"),
            v1.Claim(namespace=namespace, name="nope", uid="unknown-uid"),  # duplicated
        ]))  # fmt: skip
        assert set(bad.claims) == {"unknown-uid", "no-namespace"}
        assert bad.claims["unknown-uid"].error == f"ResourceClaim {namespace}/nope not found"
        assert bad.claims["no-namespace"].error == (
            "claim ''/'' (uid 'no-namespace'): the request lacks namespace, name"
        )
        batch = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=many))
        assert len(batch.claims) == 1000
        assert all(r.error.endswith("not found") for r in batch.claims.values())
        gone = await stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=many))
        assert all(r.error == "" for r in gone.claims.values())
    assert agent.probe("/healthz") == 200
    assert 'dra_gpu_prepare_claims_total{result="error"}' in agent.metrics()


DRA_METHODS = [
    f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}"
    for version in ("v1", "v1beta1")
    for method in ("NodePrepareResources", "NodeUnprepareResources")
]
FUZZ_EXAMPLES = 500 if os.environ.get("DRA_GPU_LOAD") == "full" else 60


def names_the_claim(error: str, claims: list[v1.Claim]) -> bool:
    return any(
        f"{c.namespace}/{c.name}" in error or f"{c.namespace!r}/{c.name!r}" in error for c in claims
    )


async def test_fuzzed_grpc_requests_get_answers_naming_the_claim_and_never_break_the_agent(
    node_named: dict[str, RealNode], start_agent: AgentFactory, namespace: str
) -> None:
    agent = await start_agent("node-01")
    socket = dra_socket(node_named["node-01"])
    text = st.text(max_size=80)
    label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
    claim = st.builds(
        v1.Claim,
        namespace=st.one_of(text, label, st.just(namespace)),
        name=st.one_of(text, label),
        uid=st.one_of(text, label, st.uuids().map(str)),
    )

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=False)
    @given(
        raw=st.binary(max_size=4096),
        method=st.sampled_from(DRA_METHODS),
        claims=st.lists(claim, max_size=40),
    )
    def fuzz(raw: bytes, method: str, claims: list[v1.Claim]) -> None:
        with grpc.insecure_channel(socket) as channel:
            refused: grpc.RpcError | None = None
            untyped: Any = channel.unary_unary(method)  # raw bytes in, raw bytes out
            try:  # bytes as they come: a message, or garbage the server must refuse
                untyped(raw, timeout=30)
            except grpc.RpcError as exc:
                refused = exc
            # grpc's own answer to bytes that are not the message: "Error parsing message".
            assert refused is None or refused.code() == grpc.StatusCode.UNKNOWN, refused
            stub = v1_grpc.DRAPluginStub(channel)
            prepared = stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=claims), timeout=30
            )
            assert set(prepared.claims) == {c.uid for c in claims}
            for uid, result in prepared.claims.items():
                same_uid = [c for c in claims if c.uid == uid]
                assert result.error, "none of these claims exists"
                assert names_the_claim(result.error, same_uid), result.error
            unprepared = stub.NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=claims), timeout=30
            )
            assert set(unprepared.claims) == {c.uid for c in claims}
            for uid, gone in unprepared.claims.items():
                same_uid = [c for c in claims if c.uid == uid]
                assert not gone.error or names_the_claim(gone.error, same_uid), gone.error

    await asyncio.to_thread(fuzz)
    assert not agent.exited
    assert agent.probe("/healthz") == 200
    assert checkpoint.read_checkpoint(agent.checkpoint_file).claims == {}
    assert list(agent.cdi_dir.glob("*.json")) == []


async def test_nothing_the_agent_creates_is_open_to_others_even_under_umask_0(
    api: kube.Kube,
    node_named: dict[str, RealNode],
    namespace: str,
    any_gpu_class: str,
    start_agent: AgentFactory,
) -> None:
    node = node_named["node-01"]
    node_dir = node.kubelet_dir
    for left_by_earlier_tests in (node.cdi_dir, node_dir / "plugins" / DRIVER):
        shutil.rmtree(left_by_earlier_tests, ignore_errors=True)
    previous = os.umask(0)  # a careless container runtime; the agent inherits it
    try:
        agent = await start_agent("node-01")
    finally:
        os.umask(previous)
    await running_worker(api, namespace, any_gpu_class)

    plugin_dir = node_dir / "plugins" / DRIVER
    created = [
        agent.cdi_dir,
        *agent.cdi_dir.iterdir(),
        agent.checkpoint_dir,
        *agent.checkpoint_dir.iterdir(),
        plugin_dir,
        *plugin_dir.iterdir(),
        *node_dir.joinpath("plugins_registry").glob(f"{DRIVER}*"),
    ]
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in created}
    assert [p for p, mode in modes.items() if mode & 0o002] == [], "world-writable"
    assert [p for p in created if p.is_socket() and modes[p] & 0o007] == [], "sockets for all"
    assert modes[agent.checkpoint_file] == 0o600
    assert {modes[p] for p in agent.cdi_dir.glob("*.json")} == {0o644}  # runtimes read them


async def test_metrics_and_probes_expose_no_credentials(
    control_plane: ControlPlane,
    controller: ControllerProcess,
    start_agent: AgentFactory,
) -> None:
    agent = await start_agent("node-01")
    pages = {
        "agent metrics": agent.metrics(),
        "controller metrics": controller.metrics(),
    }
    for name, process in (("agent", agent), ("controller", controller)):
        for path in ("/healthz", "/readyz"):
            url = f"http://127.0.0.1:{process.health_port}{path}"
            pages[f"{name} {path}"] = await asyncio.to_thread(read_page, url)
    secrets = [control_plane.token, "Bearer", "PRIVATE KEY", "BEGIN CERTIFICATE", "kubeconfig"]
    assert {name: [s for s in secrets if s in page] for name, page in pages.items()} == {
        name: [] for name in pages
    }
    assert "dra_gpu_prepare_claims_total" in pages["agent metrics"]


def read_page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read()).decode()


@pytest.mark.parametrize(
    "signum", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name
)
async def test_sighup_and_sigint_stop_the_agent_as_cleanly_as_sigterm(
    api: kube.Kube,
    node_named: dict[str, RealNode],
    start_agent: AgentFactory,
    signum: signal.Signals,
) -> None:
    agent = await start_agent("node-02")
    assert agent.pid is not None
    os.kill(agent.pid, signum)

    await eventually(lambda: agent.exited, what=f"the agent gone after {signum.name}")
    assert agent.stop() == 0, agent.log_file.read_text()[-2000:]
    # Its sockets went with it (the kubelet would keep a dead plugin registered), its slices
    # stayed (a restarting agent must not empty the node).
    node_dir = node_named["node-02"].kubelet_dir
    assert list((node_dir / "plugins_registry").glob(f"{DRIVER}*")) == []
    assert not (node_dir / "plugins" / DRIVER / "dra.sock").exists()
    assert await node_slices(api, "node-02") != []
    assert "stopping; slices stay published" in agent.log_file.read_text()

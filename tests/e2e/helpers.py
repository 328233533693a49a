"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import grpc
import pytest

from dra_gpu import kube
from dra_gpu.proto.dra.v1 import api_pb2 as v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_gpu.resource import labels
from dra_gpu.testing import (
    AgentProcess,
    ControlPlane,
    NodeRuntime,
    RealNode,
    eventually,
    start_nodes,
)

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.example.com"

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "crds-examples"
TUTORIAL_PROFILE = REPO / "charts/dra-gpu/profiles/tutorial.yaml"
"""The tutorial's simulated GPUs: gpu-0 24Gi and gpu-1 8Gi on node-01."""


class Kubectl:
    """The built kubectl against the test cluster, as the tutorial's reader runs it."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = str(binary)
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    async def run(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        """Exit code, stdout and stderr (where ``kubectl`` prints an admission's
        ``Warning: ...`` lines and its refusals)."""
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def __call__(self, *args: str) -> str:
        code, out, err = await self.run(*args)
        if code != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {err}")
        return out


async def exists(api: kube.Kube, path: str) -> bool:
    try:
        await api.get(path)
    except kube.ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


async def gone(api: kube.Kube, path: str) -> bool:
    return not await exists(api, path)


async def server_minor(api: kube.Kube) -> int:
    """The API server's minor version (36 for 1.36): features on by default differ by it."""
    version = await api.get("/version")
    return int(str(version["minor"]).rstrip("+"))


@contextlib.asynccontextmanager
async def driver_class(api: kube.Kube, name: str) -> AsyncIterator[str]:
    """A DeviceClass ``name`` admitting every device of gpu.example.com; deleted afterwards."""
    selectors = [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]
    await api.create(
        f"{RESOURCE}/deviceclasses",
        {"metadata": {"name": name}, "spec": {"selectors": selectors}},
    )
    try:
        yield name
    finally:
        await api.delete(f"{RESOURCE}/deviceclasses/{name}")


@contextlib.asynccontextmanager
async def agent_on(
    api: kube.Kube,
    agent: AgentProcess,
    namespace: str,
    pods_gone_within: float = 60,
) -> AsyncIterator[AgentProcess]:
    """``agent`` started; afterwards the test's pods are deleted while it still runs (a pod
    whose claim was prepared only goes once the driver unprepared it), then it stops and its
    node's slices go."""
    await agent.astart()
    try:
        yield agent
    finally:
        await api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")

        async def no_pods() -> bool:
            return not (await api.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]

        await eventually(no_pods, timeout=pods_gone_within, what="test pods gone")
        agent.stop()
        await delete_our_slices(api, [agent.node])


class AgentStarter(Protocol):
    """The ``agent_with`` fixture: an agent on node-01 with a simulated profile (a path, or
    the text of one); the test's pods go before it stops (``agent_on``)."""

    def __call__(
        self,
        profile: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        pods_gone_within: float = 120,
    ) -> contextlib.AbstractAsyncContextManager[AgentProcess]: ...


async def claim_and_pod(
    api: kube.Kube,
    ns: str,
    name: str,
    device_class: str,
    *,
    selector: str | None = None,
    memory: str | None = None,
    node: str = "node-01",
) -> None:
    """A claim ``name`` with one request ``gpu`` of ``device_class`` (a CEL ``selector``, a
    ``memory`` share), and a pod ``name`` on ``node`` that uses it."""
    exactly: kube.Body = {"deviceClassName": device_class}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    await api.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        },
    )
    await pod_with_claim(api, ns, name, node)


async def pod_with_claim(api: kube.Kube, ns: str, name: str, node: str = "node-01") -> None:
    """Pod ``name`` on ``node`` using claim ``name`` (its container ``main``)."""
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [workload("main", claims=["gpu"])],
                "terminationGracePeriodSeconds": 1,
            },
        },
    )


async def allocated_claim(
    api: kube.Kube,
    ns: str,
    node: str,
    device: str,
    *,
    name: str = "gpu",
    reserved: bool = False,
) -> v1.Claim:
    """Claim ``name`` allocated ``device`` of ``node``'s pool (and with ``reserved``, reserved
    for a pod that ``holder`` made), written as the scheduler would; as the kubelet names it."""
    base = f"{RESOURCE}/namespaces/{ns}/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": "any"}}
    created = await api.create(
        base, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
    )
    pod = await holder(api, ns, name) if reserved else None
    created["status"] = allocation(node, device, pod)
    await api.replace(f"{base}/{name}/status", created)
    return v1.Claim(namespace=ns, name=name, uid=created["metadata"]["uid"])


async def holder(api: kube.Kube, ns: str, claim: str) -> kube.Body:
    """A pod that uses ``claim`` and never runs (held by a scheduling gate), for a reservation
    that Kubernetes keeps (its resourceclaim controller removes those of pods that are gone)."""
    return await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"generateName": f"{claim}-holder-"},
            "spec": {
                "schedulingGates": [{"name": "example.com/never"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [workload("main", claims=["gpu"])],
            },
        },
    )


def allocation(node: str, device: str, pod: kube.Body | None = None) -> kube.Body:
    """A claim's status: ``device`` of ``node``'s pool allocated (and reserved for ``pod``)."""
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    status: kube.Body = {"allocation": {"devices": {"results": [result]}}}
    if pod is not None:
        meta = pod["metadata"]
        status["reservedFor"] = [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]
    return status


async def plugin_call(
    node: RealNode, method: Literal["prepare", "unprepare"], claim: v1.Claim
) -> v1.NodePrepareResourceResponse | v1.NodeUnprepareResourceResponse:
    """Prepare or unprepare ``claim`` as ``node``'s kubelet would; the claim's answer, which
    must not be an error."""
    socket = f"unix://{node.kubelet_dir}/plugins/{DRIVER}/dra.sock"
    async with grpc.aio.insecure_channel(socket) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        result: v1.NodePrepareResourceResponse | v1.NodeUnprepareResourceResponse
        if method == "prepare":
            prepared = await stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[claim]), timeout=10
            )
            result = prepared.claims[claim.uid]
        else:
            unprepared = await stub.NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[claim]), timeout=10
            )
            result = unprepared.claims[claim.uid]
    assert not result.error, result.error
    return result


async def events_of(api: kube.Kube, namespace: str, kind: str = "Pod") -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.kind={kind}"
    )
    items: list[kube.Body] = listing.get("items", [])
    return items


WORKLOAD_IMAGE = "dra-gpu.local/workload:1"
"""Static busybox (``hack/build-images.sh``), imported into every node's containerd."""
_node_indexes = itertools.count(10)
"""Addresses of nodes a test starts (``192.0.2.N``): after the session's node-01..03."""


def workload(name: str = "c", *, claims: Sequence[str] = ()) -> kube.Body:
    """A container that prints its environment, then waits (and ends at once on SIGTERM)."""
    container: kube.Body = {
        "name": name,
        "image": WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", "env; trap 'exit 0' TERM; sleep 3600 & wait"],
    }
    if claims:
        container["resources"] = {"claims": [{"name": claim} for claim in claims]}
    return container


async def container_env(
    kubectl: Kubectl, namespace: str, pod: str, container: str = "c"
) -> dict[str, str] | None:
    """The environment the container runs with (CDI edits included), or None while it is
    not running."""
    try:
        out = await kubectl("exec", "-n", namespace, pod, "-c", container, "--", "env")
    except AssertionError:
        return None
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


async def gpu_env(
    kubectl: Kubectl, namespace: str, pod: str, container: str = "c"
) -> dict[str, str]:
    """The ``GPU_*`` variables CDI gave the running container (waits until it runs)."""

    async def env() -> dict[str, str] | None:
        return await container_env(kubectl, namespace, pod, container)

    found = await eventually(env, what=f"container {container} of {namespace}/{pod} running")
    return {key: value for key, value in found.items() if key.startswith("GPU_")}


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1)[:4000]


@contextlib.asynccontextmanager
async def gpu_nodes(
    api: kube.Kube,
    control_plane: ControlPlane,
    runtime: NodeRuntime,
    root: Path,
    names: Sequence[str],
    *,
    gpus: int,
    device_class: str,
    agent_env: dict[str, str] | None = None,
) -> AsyncIterator[tuple[list[RealNode], list[AgentProcess]]]:
    """Real nodes of their own (labelled ``dra-gpu.io/pool=<device_class>``), each with an
    agent and ``gpus`` simulated GPUs, and a DeviceClass for them; all removed afterwards."""
    profile = root / "profile.yaml"
    profile.write_text(
        "nodes:\n"
        + "".join(f"  {n}:\n    devices:\n    - count: {gpus}\n      memory: 16Gi\n" for n in names)
    )
    nodes = [RealNode(control_plane, n, next(_node_indexes), root / n, runtime) for n in names]
    async with driver_class(api, device_class):
        try:
            await asyncio.to_thread(start_nodes, nodes)
            for name in names:
                await api.patch(
                    f"/api/v1/nodes/{name}",
                    {"metadata": {"labels": {"dra-gpu.io/pool": device_class}}},
                )
            agents = [
                AgentProcess.on(
                    node,
                    control_plane.kubeconfig,
                    root / f"agent-{node.name}",
                    profile=profile,
                    env=dict(agent_env or {}),
                )
                for node in nodes
            ]
            try:
                await asyncio.gather(*(a.astart(120) for a in agents))
                yield nodes, agents
            finally:
                for agent in agents:
                    agent.stop()
        finally:
            for node in nodes:
                await asyncio.to_thread(node.stop)
            for name in names:  # the other tests count three nodes
                with contextlib.suppress(kube.ApiError):
                    await api.delete(f"/api/v1/nodes/{name}")
            await delete_our_slices(api, names)


async def delete_our_slices(api: kube.Kube, nodes: Collection[str] | None = None) -> None:
    """The slices our agents published (of ``nodes``, or all): a stopped agent leaves its
    pool published, and later tests count the devices of their own."""
    listing = await api.get(
        f"{RESOURCE}/resourceslices",
        labelSelector=f"{labels.MANAGED_BY_LABEL}={labels.MANAGED_BY_VALUE}",
    )
    for item in listing["items"]:
        if nodes is None or item["spec"].get("nodeName") in nodes:
            await api.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")


async def event_with(api: kube.Kube, ns: str, reason: str, text: str) -> kube.Body | None:
    """A Pod event of ``ns`` with ``reason`` whose message contains ``text``."""
    for event in await events_of(api, ns):
        if event.get("reason") == reason and text in event.get("message", ""):
            return event
    return None


@contextlib.asynccontextmanager
async def isolated_namespace(
    request: pytest.FixtureRequest, api: kube.Kube, kubectl: Kubectl
) -> AsyncIterator[str]:
    """A namespace of one test; a failed test prints the pods, claims, slices and events it
    saw, so a red CI run says why. Gone (with its claims) before the next test starts."""
    name = f"t-{secrets.token_hex(3)}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # Pods are rejected until the controller-manager created the default ServiceAccount.
    await eventually(
        lambda: exists(api, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        what=f"ServiceAccount {name}/default",
    )
    yield name
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        print(f"\n===== diagnostics for namespace {name} =====")
        for args in (
            ("get", "pods,resourceclaims,resourceclaimtemplates", "-n", name, "-o", "wide"),
            ("get", "deviceclasses,resourceslices", "-o", "wide"),
            ("get", "events", "-n", name, "--sort-by=.lastTimestamp"),
            ("get", "resourceclaims", "-n", name, "-o", "yaml"),
        ):
            try:
                print(f"$ kubectl {' '.join(args)}\n{await kubectl(*args)}")
            except AssertionError as exc:
                print(exc)
    await api.delete(f"/api/v1/namespaces/{name}")

    async def gone() -> bool:
        return not await exists(api, f"/api/v1/namespaces/{name}")

    # Wait until it is gone: its claims hold devices that the next test may need.
    await eventually(gone, timeout=120, what=f"namespace {name} gone")


class Helm:
    def __init__(self, control_plane: ControlPlane) -> None:
        self.binary = str(control_plane.binary("helm"))
        self.env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}

    async def run(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def __call__(self, *args: str) -> str:
        code, out, err = await self.run(*args)
        assert code == 0, f"helm {' '.join(args)} failed: {err}"
        return out

"""The kubelet stand-in's DRA part against the real control plane and a real gRPC plugin.

A tiny DRA plugin lives in this module: it serves Registration and DRAPlugin (v1, v1beta1 or
both) on unix sockets in the kubelet directory of an extra node, ``node-dra-1``, writes a CDI
spec per claim and publishes nothing; the tests create the ResourceSlice by hand. The node has
its own stand-in so that the session's nodes and other tests are never touched.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.agent import cdi
from dra_gpu.proto.dra.v1 import api_pb2 as dra_v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from dra_gpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dra_gpu.proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg_pb
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_gpu.testing import DraSettings, KubeletStandIn, eventually
from tests.e2e import helpers
from tests.e2e.helpers import events_of, started_env

NODE = "node-dra-1"
V1, V1BETA1 = "v1.DRAPlugin", "v1beta1.DRAPlugin"
RESOURCE = "/apis/resource.k8s.io/v1"


# --- a tiny DRA plugin ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    service: str  # "v1" or "v1beta1"
    method: str
    namespace: str
    name: str
    uid: str


class TinyPlugin:
    """Registration + DRAPlugin on unix sockets, the DRA socket first, as the Go helper does.

    Prepare writes a CDI spec for the claim (device gpu-0, env ``GPU_DEVICE_0=gpu-0``) and
    answers with its ID; unprepare deletes it. ``prepare_errors`` / ``unprepare_errors`` (by
    claim name) make a claim fail.
    """

    def __init__(
        self,
        kubelet_dir: Path,
        cdi_dir: Path,
        driver: str,
        *,
        advertised: Sequence[str] = (V1, V1BETA1),
        served: Sequence[str] = (V1, V1BETA1),
    ) -> None:
        self.driver, self.cdi_dir = driver, cdi_dir
        self.advertised, self.served = list(advertised), list(served)
        self.registration_socket = kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"
        self.dra_socket = kubelet_dir / "plugins" / driver / "dra.sock"
        self.calls: list[Call] = []
        self.statuses: list[tuple[bool, str]] = []
        self.prepare_errors: dict[str, str] = {}
        self.unprepare_errors: dict[str, str] = {}
        self._dra_server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        self._dra_server = grpc.aio.server()
        if V1 in self.served:
            dra_v1_grpc.add_DRAPluginServicer_to_server(_Servicer(self, "v1"), self._dra_server)
        if V1BETA1 in self.served:
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(
                _Servicer(self, "v1beta1"), self._dra_server
            )
        self._dra_server.add_insecure_port(f"unix://{self.dra_socket}")
        await self._dra_server.start()
        self._reg_server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), self._reg_server)
        self._reg_server.add_insecure_port(f"unix://{self.registration_socket}")
        await self._reg_server.start()

    async def stop(self) -> None:
        # Registration goes first: its socket file vanishing is the kubelet's deregistration.
        if self._reg_server is not None:
            self.registration_socket.unlink(missing_ok=True)
            await self._reg_server.stop(None)
            self._reg_server = None
        if self._dra_server is not None:
            await self._dra_server.stop(None)
            self.dra_socket.unlink(missing_ok=True)
            self._dra_server = None

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugin: TinyPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return reg_pb.PluginInfo(
            type="DRAPlugin",
            name=self.plugin.driver,
            endpoint=str(self.plugin.dra_socket),
            supported_versions=self.plugin.advertised,
        )

    async def NotifyRegistrationStatus(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        self.plugin.statuses.append((request.plugin_registered, request.error))
        return reg_pb.RegistrationStatusResponse()


class _Servicer:
    def __init__(self, plugin: TinyPlugin, service: str) -> None:
        self.plugin, self.service = plugin, service
        self.pb = dra_v1 if service == "v1" else dra_v1beta1

    def _record(self, method: str, claim: Any) -> None:
        self.plugin.calls.append(Call(self.service, method, claim.namespace, claim.name, claim.uid))

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            self._record("NodePrepareResources", claim)
            error = self.plugin.prepare_errors.get(claim.name)
            if error:
                response.claims[claim.uid].error = error
                continue
            spec = cdi.claim_spec(
                self.plugin.driver, claim.uid, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})]
            )
            cdi.write_claim_spec(self.plugin.cdi_dir, spec, claim_uid=claim.uid)
            response.claims[claim.uid].devices.append(
                self.pb.Device(
                    request_names=["gpu"],
                    pool_name=NODE,
                    device_name="gpu-0",
                    cdi_device_ids=[cdi.cdi_device_id(self.plugin.driver, claim.uid, "gpu-0")],
                )
            )
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self._record("NodeUnprepareResources", claim)
            error = self.plugin.unprepare_errors.get(claim.name, "")
            if not error:
                cdi.delete_claim_spec(self.plugin.cdi_dir, self.plugin.driver, claim.uid)
            response.claims[claim.uid].error = error
        return response


# --- fixtures -------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def dra_kubelet(api: kube.Kube) -> AsyncIterator[KubeletStandIn]:
    # A short root: unix socket paths must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    settings = DraSettings(wipe_delay_seconds=2.0, retry_seconds=0.5)
    try:
        async with KubeletStandIn(api, [NODE], root, dra=settings) as standin:
            yield standin
    finally:
        # Other tests count the session's nodes: this one must not outlive the module.
        await api.delete(f"/api/v1/nodes/{NODE}")
        shutil.rmtree(root, ignore_errors=True)


PluginFactory = Callable[..., Awaitable[TinyPlugin]]


@pytest_asyncio.fixture
async def start_plugin(dra_kubelet: KubeletStandIn) -> AsyncIterator[PluginFactory]:
    started: list[TinyPlugin] = []

    async def start(driver: str, **options: Any) -> TinyPlugin:
        plugin = TinyPlugin(
            dra_kubelet.kubelet_dir(NODE), dra_kubelet.dra.cdi_dir(NODE), driver, **options
        )
        await plugin.start()
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        await plugin.stop()


@pytest_asyncio.fixture
async def cluster_scoped(api: kube.Kube) -> AsyncIterator[list[str]]:
    """Paths of cluster-scoped objects a test created; deleted after it."""
    paths: list[str] = []
    yield paths
    for path in paths:
        await api.delete(path)


# --- helpers --------------------------------------------------------------------------------


def unique_driver() -> str:
    # Each test its own driver: a wipe due for one test's driver never hits another's slices.
    return f"gpu-{secrets.token_hex(3)}.example.com"


async def publish_gpu(api: kube.Kube, cleanup: list[str], driver: str) -> str:
    """A DeviceClass for ``driver`` and a hand-made slice with gpu-0 on NODE; the class name."""
    token = secrets.token_hex(3)
    device_class, slice_name = f"dra-standin-{token}", f"{NODE}-{token}"
    await api.create(
        f"{RESOURCE}/deviceclasses",
        {
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    cleanup.append(f"{RESOURCE}/deviceclasses/{device_class}")
    await create_slice(api, cleanup, driver, slice_name)
    return device_class


async def create_slice(api: kube.Kube, cleanup: list[str], driver: str, name: str) -> str:
    await api.create(
        f"{RESOURCE}/resourceslices",
        {
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "gpu-0",
                        "capacity": {"memory": {"value": "24Gi"}},
                    }
                ],
            },
        },
    )
    path = f"{RESOURCE}/resourceslices/{name}"
    cleanup.append(path)
    return path


def claim_devices(device_class: str) -> kube.Body:
    return {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}


async def create_claim_and_pod(
    api: kube.Kube, ns: str, device_class: str, *, template: bool = False
) -> None:
    """Claim (or template) ``gpu`` and pod ``worker`` on NODE: container ``main`` uses the
    claim, container ``sidecar`` does not."""
    if template:
        await api.create(
            f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
            {
                "metadata": {"name": "gpu"},
                "spec": {"spec": {"devices": claim_devices(device_class)}},
            },
        )
        pod_claim: kube.Body = {"name": "gpu", "resourceClaimTemplateName": "gpu"}
    else:
        await api.create(
            f"{RESOURCE}/namespaces/{ns}/resourceclaims",
            {"metadata": {"name": "gpu"}, "spec": {"devices": claim_devices(device_class)}},
        )
        pod_claim = {"name": "gpu", "resourceClaimName": "gpu"}
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "worker"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "resourceClaims": [pod_claim],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/cuda:1",
                        "resources": {"claims": [{"name": "gpu"}]},
                    },
                    {"name": "sidecar", "image": "registry.example/log:1"},
                ],
            },
        },
    )


async def the_claim(api: kube.Kube, ns: str) -> kube.Body:
    listing = await api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")
    (claim,) = listing["items"]
    return claim


async def pod_phase(api: kube.Kube, ns: str, name: str = "worker") -> str | None:
    try:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    except kube.ApiError as exc:
        if exc.not_found:
            return None
        raise
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return str(pod.get("status", {}).get("phase"))


async def wait_phase(api: kube.Kube, ns: str, phase: str | None) -> None:
    async def reached() -> bool:
        return await pod_phase(api, ns) == phase

    await eventually(reached, what=f"pod {ns}/worker {phase or 'gone'}")


async def warning_with(api: kube.Kube, ns: str, text: str) -> kube.Body | None:
    for event in await events_of(api, ns):
        if event.get("type") == "Warning" and text in event.get("message", ""):
            return event
    return None


async def delete_pod_and_wait_gone(api: kube.Kube, ns: str) -> None:
    await api.delete(f"/api/v1/namespaces/{ns}/pods/worker")  # graceful: the stand-in ends it
    await wait_phase(api, ns, None)


# --- tests ----------------------------------------------------------------------------------


async def test_without_a_plugin_the_pod_gets_the_kubelets_not_registered_event(
    api: kube.Kube, dra_kubelet: KubeletStandIn, namespace: str, cluster_scoped: list[str]
) -> None:
    device_class = await publish_gpu(api, cluster_scoped, "gpu.example.com")
    await create_claim_and_pod(api, namespace, device_class)
    message = (
        "Failed to prepare dynamic resources: prepare dynamic resources: "
        "DRA driver gpu.example.com is not registered"
    )
    event = await eventually(
        lambda: warning_with(api, namespace, message), what="not-registered event"
    )
    assert event["reason"] == "FailedPrepareDynamicResources"
    assert event["message"] == message
    assert event["source"] == {"component": "kubelet", "host": NODE}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("kubelet", NODE)
    assert event["firstTimestamp"]
    assert event["lastTimestamp"]
    pod = await api.get(f"/api/v1/namespaces/{namespace}/pods/worker")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "worker",
        "namespace": namespace,
        "uid": pod["metadata"]["uid"],
    }

    # Retries bump the one event instead of posting the same message again.
    async def bumped() -> kube.Body | None:
        same = [e for e in await events_of(api, namespace) if e.get("message") == message]
        assert len(same) == 1, same
        return same[0] if same[0].get("count", 1) > 1 else None

    await eventually(bumped, what="the event's count bumped by a retry")
    assert await pod_phase(api, namespace) == "Pending"
    # Never prepared, so nothing to unprepare: the deletion just completes.
    await delete_pod_and_wait_gone(api, namespace)


async def test_registered_plugin_prepares_the_claim_and_the_pod_runs_with_its_cdi_env(
    api: kube.Kube,
    dra_kubelet: KubeletStandIn,
    start_plugin: PluginFactory,
    namespace: str,
    cluster_scoped: list[str],
) -> None:
    driver = unique_driver()
    plugin = await start_plugin(driver)
    assert await dra_kubelet.dra.wait_registered(NODE, driver) == V1
    await eventually(lambda: plugin.statuses == [(True, "")], what="registration notified")
    device_class = await publish_gpu(api, cluster_scoped, driver)
    await create_claim_and_pod(api, namespace, device_class)
    await wait_phase(api, namespace, "Running")

    claim = await the_claim(api, namespace)
    uid = claim["metadata"]["uid"]
    assert plugin.calls_of("NodePrepareResources") == [
        Call("v1", "NodePrepareResources", namespace, "gpu", uid)
    ]
    prepared = dra_kubelet.dra.prepared_claims(NODE)[uid]
    assert (prepared.namespace, prepared.name) == (namespace, "gpu")
    assert [d.cdi_device_ids for d in prepared.devices] == [
        (cdi.cdi_device_id(driver, uid, "gpu-0"),)
    ]
    assert dra_kubelet.dra.container_env(namespace, "worker", "main") == {"GPU_DEVICE_0": "gpu-0"}
    assert dra_kubelet.dra.container_env(namespace, "worker", "sidecar") == {}

    # Deletion: unprepare first, then the pod goes away and the record forgets the claim.
    await delete_pod_and_wait_gone(api, namespace)
    assert plugin.calls_of("NodeUnprepareResources") == [
        Call("v1", "NodeUnprepareResources", namespace, "gpu", uid)
    ]
    assert uid not in dra_kubelet.dra.prepared_claims(NODE)
    assert cdi.read_claim_spec(dra_kubelet.dra.cdi_dir(NODE), driver, uid) is None


async def test_a_claims_error_reaches_the_pods_events_and_a_retry_succeeds(
    api: kube.Kube,
    dra_kubelet: KubeletStandIn,
    start_plugin: PluginFactory,
    namespace: str,
    cluster_scoped: list[str],
) -> None:
    driver = unique_driver()
    plugin = await start_plugin(driver)
    plugin.prepare_errors["gpu"] = "gpu-0 fell off the bus"
    await dra_kubelet.dra.wait_registered(NODE, driver)
    device_class = await publish_gpu(api, cluster_scoped, driver)
    await create_claim_and_pod(api, namespace, device_class)

    text = "NodePrepareResources failed for ResourceClaim gpu: gpu-0 fell off the bus"
    event = await eventually(lambda: warning_with(api, namespace, text), what="per-claim error")
    assert event["reason"] == "FailedPrepareDynamicResources"
    assert (
        event["message"]
        == f"Failed to prepare dynamic resources: prepare dynamic resources: {text}"
    )
    assert await pod_phase(api, namespace) == "Pending"

    plugin.prepare_errors.clear()
    await wait_phase(api, namespace, "Running")
    await delete_pod_and_wait_gone(api, namespace)


async def test_a_failed_unprepare_keeps_the_pod_terminating_until_it_succeeds(
    api: kube.Kube,
    dra_kubelet: KubeletStandIn,
    start_plugin: PluginFactory,
    namespace: str,
    cluster_scoped: list[str],
) -> None:
    driver = unique_driver()
    plugin = await start_plugin(driver)
    await dra_kubelet.dra.wait_registered(NODE, driver)
    device_class = await publish_gpu(api, cluster_scoped, driver)
    await create_claim_and_pod(api, namespace, device_class)
    await wait_phase(api, namespace, "Running")

    plugin.unprepare_errors["gpu"] = "GPU still busy"
    await api.delete(f"/api/v1/namespaces/{namespace}/pods/worker")
    text = "unprepare dynamic resources: NodeUnprepareResources failed for ResourceClaim gpu"
    event = await eventually(lambda: warning_with(api, namespace, text), what="unprepare error")
    assert event["message"].endswith("GPU still busy")
    assert await pod_phase(api, namespace) == "Terminating"

    plugin.unprepare_errors.clear()
    await wait_phase(api, namespace, None)


async def test_a_v1beta1_only_plugin_is_called_through_v1beta1(
    api: kube.Kube,
    dra_kubelet: KubeletStandIn,
    start_plugin: PluginFactory,
    namespace: str,
    cluster_scoped: list[str],
) -> None:
    driver = unique_driver()
    plugin = await start_plugin(driver, advertised=[V1BETA1], served=[V1BETA1])
    assert await dra_kubelet.dra.wait_registered(NODE, driver) == V1BETA1
    device_class = await publish_gpu(api, cluster_scoped, driver)
    # A claim from a template: the stand-in finds its name in the pod's status.
    await create_claim_and_pod(api, namespace, device_class, template=True)
    await wait_phase(api, namespace, "Running")

    claim = await the_claim(api, namespace)
    assert plugin.calls == [
        Call(
            "v1beta1",
            "NodePrepareResources",
            namespace,
            claim["metadata"]["name"],
            claim["metadata"]["uid"],
        )
    ]
    assert dra_kubelet.dra.container_env(namespace, "worker", "main") == {"GPU_DEVICE_0": "gpu-0"}
    await delete_pod_and_wait_gone(api, namespace)
    assert {c.service for c in plugin.calls} == {"v1beta1"}


async def test_a_plugin_without_a_known_service_is_refused_with_the_kubelets_text(
    dra_kubelet: KubeletStandIn, start_plugin: PluginFactory
) -> None:
    driver = unique_driver()
    plugin = await start_plugin(driver, advertised=["v9.DRAPlugin"])
    await eventually(lambda: plugin.statuses, what="a registration status")
    registered, error = plugin.statuses[0]
    assert not registered
    assert error.startswith("RegisterPlugin error -- plugin validation failed with err: ")
    assert (
        'none of services supported by the plugin (["v9.DRAPlugin"]) are supported by the '
        'kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    ) in error
    assert driver not in dra_kubelet.dra.registered_drivers(NODE)


async def test_a_drivers_slices_are_wiped_once_its_socket_is_gone_for_the_delay(
    api: kube.Kube,
    dra_kubelet: KubeletStandIn,
    start_plugin: PluginFactory,
    cluster_scoped: list[str],
) -> None:
    driver, bystander = unique_driver(), unique_driver()
    plugin = await start_plugin(driver)
    await dra_kubelet.dra.wait_registered(NODE, driver)
    await eventually(lambda: dra_kubelet.dra.connected(NODE, driver), what="plugin connected")
    token = secrets.token_hex(3)
    ours = await create_slice(api, cluster_scoped, driver, f"{NODE}-{token}-a")
    theirs = await create_slice(api, cluster_scoped, bystander, f"{NODE}-{token}-b")

    await plugin.stop()

    async def wiped() -> bool:
        try:
            await api.get(ours)
        except kube.ApiError as exc:
            return exc.not_found
        return False

    await eventually(wiped, what=f"slices of {driver} on {NODE} wiped")
    assert driver not in dra_kubelet.dra.registered_drivers(NODE)
    await api.get(theirs)  # another driver's slice is left alone


async def test_a_kubelet_restart_keeps_prepared_claims_and_a_reboot_empties_the_cdi_dir(
    api: kube.Kube,
    dra_kubelet: KubeletStandIn,
    start_plugin: PluginFactory,
    namespace: str,
    cluster_scoped: list[str],
) -> None:
    driver = unique_driver()
    plugin = await start_plugin(driver)
    await dra_kubelet.dra.wait_registered(NODE, driver)
    device_class = await publish_gpu(api, cluster_scoped, driver)
    slice_path = cluster_scoped[-1]
    await create_claim_and_pod(api, namespace, device_class)
    await wait_phase(api, namespace, "Running")
    uid = (await the_claim(api, namespace))["metadata"]["uid"]

    await dra_kubelet.dra.restart_kubelet(NODE)
    # A starting kubelet wipes the node's slices; the plugin registers again.
    assert not await helpers.exists(api, slice_path)
    await eventually(lambda: len(plugin.statuses) == 2, what="the plugin registered again")
    assert uid in dra_kubelet.dra.prepared_claims(NODE)

    cdi_dir = dra_kubelet.dra.cdi_dir(NODE)
    assert list(cdi_dir.iterdir())
    await dra_kubelet.dra.reboot(NODE)
    assert list(cdi_dir.iterdir()) == []
    await eventually(lambda: len(plugin.statuses) == 3, what="the plugin registered again")
    # After the reboot the pod's containers start again: the claim is prepared once more (the
    # plugin writes its spec again) and the CDI IDs resolve afresh.
    await eventually(
        lambda: uid in dra_kubelet.dra.prepared_claims(NODE), what="prepared after the reboot"
    )
    await eventually(
        lambda: "GPU_DEVICE_0" in (started_env(dra_kubelet, namespace, "worker", "main") or {}),
        what="pod restarted",
    )

    # The record survived both: the deletion unprepares.
    await delete_pod_and_wait_gone(api, namespace)
    assert [c.method for c in plugin.calls] == [
        "NodePrepareResources",
        "NodePrepareResources",
        "NodeUnprepareResources",
    ]

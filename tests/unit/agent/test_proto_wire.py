"""Our .proto files reproduce the kubelet's wire contract: paths, field numbers, compatibility.

A stub generated with another proto package still imports and runs, and the kubelet then calls
methods that do not exist. These tests pin what the kubelet dials, and serve it over a real
unix socket through a real channel.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from google.protobuf.message import Message

from dra_gpu.proto.dra.v1 import api_pb2 as dra_v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from dra_gpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dra_gpu.proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from dra_gpu.proto.drahealth.v1 import api_pb2 as health_v1
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as registration
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc


def method_path(module: ModuleType, service: str, method: str) -> str:
    descriptor = module.DESCRIPTOR.services_by_name[service]
    return f"/{descriptor.full_name}/{descriptor.methods_by_name[method].name}"


@pytest.mark.parametrize(
    ("module", "service", "method", "path"),
    [
        (registration, "Registration", "GetInfo", "/pluginregistration.Registration/GetInfo"),
        (
            registration,
            "Registration",
            "NotifyRegistrationStatus",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
        ),
        (
            dra_v1,
            "DRAPlugin",
            "NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        ),
        (
            dra_v1,
            "DRAPlugin",
            "NodeUnprepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        ),
        (
            dra_v1beta1,
            "DRAPlugin",
            "NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        ),
        (
            dra_v1beta1,
            "DRAPlugin",
            "NodeUnprepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        ),
        (
            health_v1alpha1,
            "DRAResourceHealth",
            "NodeWatchResources",
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        ),
        (
            health_v1,
            "DRAResourceHealth",
            "NodeWatchResources",
            "/v1.DRAResourceHealth/NodeWatchResources",
        ),
    ],
)
def test_method_paths_are_the_ones_the_kubelet_dials(
    module: ModuleType, service: str, method: str, path: str
) -> None:
    assert method_path(module, service, method) == path


def test_only_the_health_watch_streams() -> None:
    watch = health_v1alpha1.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name[
        "NodeWatchResources"
    ]
    assert watch.server_streaming
    assert not watch.client_streaming
    prepare = dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].methods_by_name[
        "NodePrepareResources"
    ]
    assert not prepare.server_streaming


def field_numbers(message: type[Message]) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


def test_registration_field_numbers() -> None:
    assert field_numbers(registration.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert field_numbers(registration.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert field_numbers(registration.InfoRequest) == {}
    assert field_numbers(registration.RegistrationStatusResponse) == {}


@pytest.mark.parametrize("module", [dra_v1, dra_v1beta1])
def test_dra_field_numbers(module: ModuleType) -> None:
    assert field_numbers(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert field_numbers(module.NodePrepareResourcesRequest) == {"claims": 1}
    assert field_numbers(module.NodePrepareResourcesResponse) == {"claims": 1}
    assert field_numbers(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert field_numbers(module.NodeUnprepareResourcesResponse) == {"claims": 1}
    assert field_numbers(module.NodeUnprepareResourceResponse) == {"error": 1}
    claims = module.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert claims.message_type.GetOptions().map_entry  # a map keyed by claim UID


def test_share_id_is_an_optional_field_of_v1_only() -> None:
    assert field_numbers(dra_v1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert "share_id" not in field_numbers(dra_v1beta1.Device)
    assert not dra_v1.Device(pool_name="node-01").HasField("share_id")


@pytest.mark.parametrize("health", [health_v1, health_v1alpha1])
def test_health_field_numbers_and_enum(health: ModuleType) -> None:
    # As k8s.io/kubelet v0.37.2 pkg/apis/dra-health/{v1,v1alpha1}/api.proto (message: 1.36+).
    assert field_numbers(health.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert field_numbers(health.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
    assert field_numbers(health.NodeWatchResourcesResponse) == {"devices": 1}
    assert dict(health.HealthStatus.items()) == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def test_v1_prepare_response_parses_as_v1beta1() -> None:
    device = dra_v1.Device(
        request_names=["gpu"],
        pool_name="node-01",
        device_name="gpu-0",
        cdi_device_ids=["k8s.gpu.example.com/gpu=uid-1-gpu-0"],
        share_id="share-1",  # unknown to v1beta1: skipped, the rest still parses
    )
    v1 = dra_v1.NodePrepareResourcesResponse(
        claims={
            "uid-1": dra_v1.NodePrepareResourceResponse(devices=[device]),
            "uid-2": dra_v1.NodePrepareResourceResponse(error="claim not allocated"),
        }
    )
    beta = dra_v1beta1.NodePrepareResourcesResponse.FromString(v1.SerializeToString())
    assert set(beta.claims) == {"uid-1", "uid-2"}
    (got,) = beta.claims["uid-1"].devices
    assert list(got.request_names) == ["gpu"]
    assert (got.pool_name, got.device_name) == ("node-01", "gpu-0")
    assert list(got.cdi_device_ids) == ["k8s.gpu.example.com/gpu=uid-1-gpu-0"]
    assert beta.claims["uid-2"].error == "claim not allocated"


# --- real server, real channel, unix socket -----------------------------------------------------


class Registration(registration_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.statuses: list[registration.RegistrationStatus] = []

    async def GetInfo(
        self, request: registration.InfoRequest, context: grpc.aio.ServicerContext
    ) -> registration.PluginInfo:
        return registration.PluginInfo(
            type="DRAPlugin",
            name="gpu.example.com",
            endpoint="/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
            supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        )

    async def NotifyRegistrationStatus(
        self, request: registration.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> registration.RegistrationStatusResponse:
        self.statuses.append(request)
        return registration.RegistrationStatusResponse()


class PrepareV1(dra_v1_grpc.DRAPluginServicer):
    async def NodeUnprepareResources(
        self, request: dra_v1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        return dra_v1.NodeUnprepareResourcesResponse()

    async def NodePrepareResources(
        self, request: dra_v1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_v1.NodePrepareResourcesResponse:
        return dra_v1.NodePrepareResourcesResponse(
            claims={c.uid: dra_v1.NodePrepareResourceResponse(error="v1") for c in request.claims}
        )


class PrepareV1beta1(dra_v1beta1_grpc.DRAPluginServicer):
    async def NodeUnprepareResources(
        self, request: dra_v1beta1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_v1beta1.NodeUnprepareResourcesResponse:
        return dra_v1beta1.NodeUnprepareResourcesResponse()

    async def NodePrepareResources(
        self, request: dra_v1beta1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_v1beta1.NodePrepareResourcesResponse:
        return dra_v1beta1.NodePrepareResourcesResponse(
            claims={
                c.uid: dra_v1beta1.NodePrepareResourceResponse(error="v1beta1")
                for c in request.claims
            }
        )


@contextlib.asynccontextmanager
async def serving(
    socket: Path, *register: Callable[[grpc.aio.Server], None]
) -> AsyncIterator[grpc.aio.Channel]:
    """A real grpc.aio server on a unix socket, and a channel to it."""
    server = grpc.aio.server()
    for add in register:
        add(server)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            yield channel
    finally:
        await server.stop(grace=None)


async def test_registration_answers_get_info_over_a_unix_socket(tmp_path: Path) -> None:
    servicer = Registration()
    socket = tmp_path / "gpu.example.com-reg.sock"
    add = registration_grpc.add_RegistrationServicer_to_server
    async with serving(socket, lambda server: add(servicer, server)) as channel:
        stub = registration_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration.InfoRequest(), timeout=5)
        await stub.NotifyRegistrationStatus(
            registration.RegistrationStatus(plugin_registered=True), timeout=5
        )
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.example.com"
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert [s.plugin_registered for s in servicer.statuses] == [True]


async def test_v1_and_v1beta1_share_one_socket_under_their_full_paths(tmp_path: Path) -> None:
    # Called by literal path, the way the kubelet's own stubs name them.
    add_v1 = dra_v1_grpc.add_DRAPluginServicer_to_server
    add_beta = dra_v1beta1_grpc.add_DRAPluginServicer_to_server
    async with serving(
        tmp_path / "dra.sock",
        lambda server: add_v1(PrepareV1(), server),
        lambda server: add_beta(PrepareV1beta1(), server),
    ) as channel:
        answers = {}
        for version, module in (("v1", dra_v1), ("v1beta1", dra_v1beta1)):
            call = channel.unary_unary(
                f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
                request_serializer=module.NodePrepareResourcesRequest.SerializeToString,
                response_deserializer=module.NodePrepareResourcesResponse.FromString,
            )
            request = module.NodePrepareResourcesRequest(
                claims=[module.Claim(namespace="default", uid="uid-1", name="gpu-claim")]
            )
            response = await call(request, timeout=5)
            answers[version] = response.claims["uid-1"].error
    assert answers == {"v1": "v1", "v1beta1": "v1beta1"}

"""The agent's device health: a fault in the simulated faults file becomes a taint, metrics and
a change the publisher hears of; the kubelet's health stream (DRAResourceHealth v1 and
v1alpha1, over a real unix socket) reports every device and the change; the registration
advertises the health service."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from dra_gpu import metrics
from dra_gpu.agent import server
from dra_gpu.agent.health import HealthMonitor
from dra_gpu.devices import model, simulated
from dra_gpu.proto.drahealth.v1 import api_pb2 as health_v1
from dra_gpu.proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_gpu.testing import eventually
from tests.unit.agent.test_state import state

PROFILE = simulated.parse_profile("nodes: {node-h: {devices: [{memory: 24Gi}, {memory: 8Gi}]}}")
T0 = datetime.datetime(2026, 3, 1, 12, 3, tzinfo=datetime.UTC)
assert REGISTRY is not metrics.AGENT


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


def sample(name: str, **labels: str) -> float | None:
    return metrics.AGENT.get_sample_value(name, labels)


def monitor(tmp_path: Path, clock: Clock, quiet: float = 30) -> tuple[HealthMonitor, list[int]]:
    backend = simulated.SimulatedBackend(PROFILE, "node-h", faults_file=tmp_path / "faults.yaml")
    triggered: list[int] = []

    async def inventory() -> model.Inventory:
        return PROFILE.inventory("node-h")

    found = HealthMonitor(
        None,
        backend,
        driver="gpu.example.com",
        node="node-h",
        quiet_seconds=quiet,
        on_change=lambda: triggered.append(1),
        inventory=inventory,
        clock=clock,
    )
    return found, triggered


async def test_a_fault_taints_the_device_counts_it_and_clears_after_the_quiet_period(
    tmp_path: Path,
) -> None:
    clock = Clock()
    health, triggered = monitor(tmp_path, clock)
    assert await health.check_once() == []
    assert sample("dra_gpu_device_health", node="node-h", device="gpu-1", state="healthy") == 1
    faults_before = sample("dra_gpu_device_faults_total", node="node-h", cause="xid")
    (tmp_path / "faults.yaml").write_text("gpu-1: {xid: 79}\n")
    [added] = await health.check_once()
    assert str(added.taint) == "gpu.example.com/xid=79:NoExecute"
    assert triggered == [1]
    assert [str(t) for t in health.taints()["gpu-1"]] == ["gpu.example.com/xid=79:NoExecute"]
    assert sample("dra_gpu_device_health", node="node-h", device="gpu-1", state="fatal") == 1
    assert sample("dra_gpu_device_health", node="node-h", device="gpu-1", state="healthy") == 0
    after = sample("dra_gpu_device_faults_total", node="node-h", cause="xid")
    assert after == (faults_before or 0) + 1
    (tmp_path / "faults.yaml").unlink()
    clock.now = T0 + datetime.timedelta(seconds=29)
    assert await health.check_once() == []  # quiet, but not for long enough
    clock.now = T0 + datetime.timedelta(seconds=30)
    [cleared] = await health.check_once()
    assert not cleared.added
    assert health.taints() == {}
    assert triggered == [1, 1]
    assert sample("dra_gpu_device_health", node="node-h", device="gpu-1", state="healthy") == 1


async def test_a_bad_faults_file_is_reported_and_changes_nothing(tmp_path: Path) -> None:
    health, triggered = monitor(tmp_path, Clock())
    (tmp_path / "faults.yaml").write_text("gpu-1: {xid: many}\n")
    with pytest.raises(model.ProfileError, match=r"gpu-1\.xid"):
        await health.check_once()  # run_forever logs this and polls again
    assert triggered == []
    assert health.taints() == {}


@pytest.mark.parametrize(
    ("module", "grpc_module"),
    [(health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc)],
)
async def test_the_kubelets_health_stream_reports_every_device_and_each_change(
    tmp_path: Path, module: object, grpc_module: object
) -> None:
    clock = Clock()
    health, _ = monitor(tmp_path, clock)
    dra_socket = tmp_path / "plugins" / "gpu.example.com" / "dra.sock"
    reg_socket = tmp_path / "plugins_registry" / "gpu.example.com-reg.sock"
    async with server.serve(
        state(tmp_path),
        driver="gpu.example.com",
        dra_socket=dra_socket,
        registration_socket=reg_socket,
        status=server.RegistrationStatus(),
        health=health,
        pool="node-h",
    ):
        async with grpc.aio.insecure_channel(f"unix://{reg_socket}") as channel:
            info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=1)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        before = asyncio.all_tasks()
        async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
            stub = grpc_module.DRAResourceHealthStub(channel)  # type: ignore[attr-defined]
            stream = stub.NodeWatchResources(module.NodeWatchResourcesRequest())  # type: ignore[attr-defined]
            first = await stream.read()
            assert [
                (d.device.pool_name, d.device.device_name, d.health) for d in first.devices
            ] == [("node-h", "gpu-0", 1), ("node-h", "gpu-1", 1)]
            (tmp_path / "faults.yaml").write_text("gpu-0: {ecc: double-bit}\n")
            await health.check_once()
            second = await stream.read()
            gpu0 = second.devices[0]
            assert (gpu0.device.device_name, gpu0.health) == ("gpu-0", 2)  # UNHEALTHY
            assert abs(gpu0.last_updated_time - time.time()) < 60  # freshness, for the kubelet
            assert gpu0.message == (
                "double-bit ECC error (simulated) at 2026-03-01T12:03:00Z; "
                "tainted gpu.example.com/ecc=double-bit:NoExecute"
            )
            assert second.devices[1].health == 1
            stream.cancel()
        # The call's tasks, grpcio's on the kubelet's side and ours, end a few loop rounds later.
        await eventually(
            lambda: not [t for t in asyncio.all_tasks() - before if not t.done()] or None,
            interval=0.01,
            what="the stream's tasks ended",
        )


async def test_each_change_tells_the_devices_healthy_condition_for_the_claims_status(
    tmp_path: Path,
) -> None:
    clock = Clock()
    health, _ = monitor(tmp_path, clock, quiet=30)
    told: list[tuple[str, dict[str, Any]]] = []
    health.on_device_health = lambda device, condition: told.append((device, condition))
    (tmp_path / "faults.yaml").write_text("gpu-1: {xid: 79}\n")
    await health.check_once()
    [(device, unhealthy)] = told
    assert device == "gpu-1"
    assert (unhealthy["type"], unhealthy["status"], unhealthy["reason"]) == (
        "Healthy",
        "False",
        "DeviceUnhealthy",
    )
    assert "XID 79" in unhealthy["message"]
    assert "gpu.example.com/xid=79:NoExecute" in unhealthy["message"]
    (tmp_path / "faults.yaml").unlink()
    clock.now = T0 + datetime.timedelta(seconds=30)
    await health.check_once()
    (_, recovered) = told[-1]
    assert (recovered["status"], recovered["reason"]) == ("True", "DeviceRecovered")
    assert recovered["lastTransitionTime"] == "2026-03-01T12:03:30Z"
    assert unhealthy["lastTransitionTime"] == "2026-03-01T12:03:00Z"

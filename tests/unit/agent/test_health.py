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

from dra_gpu.agent import server
from dra_gpu.agent.health_monitor import HealthMonitor
from dra_gpu.devices import model, simulated
from dra_gpu.proto.drahealth.v1 import api_pb2 as health_v1
from dra_gpu.proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_gpu.proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_gpu.serving import metrics
from dra_gpu.testing import eventually
from tests.unit.agent.test_state import state

PROFILE = simulated.parse_profile(
    "nodes: {node-h: {devices: [{memory: 24Gi}, {memory: 8Gi}]},"
    " node-m: {devices: [{memory: 24Gi}, {memory: 8Gi}]}}"
)
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
    (tmp_path / "faults.yaml").write_text("gpu-1: {xid: 74}\n")
    [added] = await health.check_once()
    assert str(added.taint) == "gpu.example.com/xid=74:NoSchedule"
    assert triggered == [1]
    assert [str(t) for t in health.taints()["gpu-1"]] == ["gpu.example.com/xid=74:NoSchedule"]
    assert sample("dra_gpu_device_health", node="node-h", device="gpu-1", state="degraded") == 1
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
                "tainted gpu.example.com/ecc=double-bit:NoSchedule"
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
    (tmp_path / "faults.yaml").write_text("gpu-1: {xid: 74}\n")
    await health.check_once()
    [(device, unhealthy)] = told
    assert device == "gpu-1"
    assert (unhealthy["type"], unhealthy["status"], unhealthy["reason"]) == (
        "Healthy",
        "False",
        "DeviceUnhealthy",
    )
    assert "XID 74" in unhealthy["message"]
    assert "gpu.example.com/xid=74:NoSchedule" in unhealthy["message"]
    (tmp_path / "faults.yaml").unlink()
    clock.now = T0 + datetime.timedelta(seconds=30)
    await health.check_once()
    (_, recovered) = told[-1]
    assert (recovered["status"], recovered["reason"]) == ("True", "DeviceRecovered")
    assert recovered["lastTransitionTime"] == "2026-03-01T12:03:30Z"
    assert unhealthy["lastTransitionTime"] == "2026-03-01T12:03:00Z"


class NodeApi:
    """The one call the monitor makes for an operator's clear: GET the Node."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.gets = 0

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        assert path == "/api/v1/nodes/node-h"
        self.gets += 1
        return {"metadata": {"name": "node-h", "uid": "u", "annotations": dict(self.annotations)}}


async def test_a_reset_needing_fault_stays_past_the_quiet_period_until_an_operator_clears_it(
    tmp_path: Path,
) -> None:
    clock = Clock()
    health, _ = monitor(tmp_path, clock, quiet=30)
    api = NodeApi()
    health.api = api  # type: ignore[assignment]
    health.claims = list  # no claims: the Events go to the Node only
    (tmp_path / "faults.yaml").write_text("gpu-0: {xid: 95}\n")
    [added] = await health.check_once()
    assert str(added.taint) == "gpu.example.com/xid=95:NoSchedule"
    (tmp_path / "faults.yaml").unlink()
    clock.now = T0 + datetime.timedelta(hours=1)
    assert await health.check_once() == []  # quiet for an hour: still broken
    assert sample("dra_gpu_device_health", node="node-h", device="gpu-0", state="fatal") == 1
    # A clear that names a time before the fault takes nothing; a bad one is logged.
    api.annotations["gpu.example.com/gpu-reset.gpu-0"] = "2026-03-01T12:00:00Z"
    api.annotations["gpu.example.com/gpu-reset.gpu-1"] = "soon"
    clock.now += datetime.timedelta(seconds=10)
    assert await health.check_once() == []
    api.annotations["gpu.example.com/gpu-reset.gpu-0"] = "2026-03-01T13:00:00Z"
    clock.now += datetime.timedelta(seconds=5)
    assert await health.check_once() == []  # read at most every clear_check_seconds
    clock.now += datetime.timedelta(seconds=5)
    [cleared] = await health.check_once()
    assert not cleared.added
    assert "an operator cleared it" in cleared.reason
    assert health.taints() == {}
    gets = api.gets
    clock.now += datetime.timedelta(minutes=5)
    await health.check_once()
    assert api.gets == gets  # nothing held: the Node is not read


MIG_PROFILE = simulated.parse_profile(
    "nodes: {node-h: {devices: [{memory: 40Gi, migCapable: true, mig: A100-40GB}, {memory: 8Gi}]}}"
)


async def test_a_fault_of_a_mig_mode_gpu_taints_its_partitions_and_their_claims(
    tmp_path: Path,
) -> None:
    backend = simulated.SimulatedBackend(
        MIG_PROFILE, "node-h", faults_file=tmp_path / "faults.yaml"
    )
    inventory = MIG_PROFILE.inventory("node-h")
    partition = "gpu-0-mig-3g-20gb-4"
    assert partition in inventory.by_name

    async def current() -> model.Inventory:
        return inventory

    told: list[str] = []
    health = HealthMonitor(
        None,
        backend,
        driver="gpu.example.com",
        node="node-h",
        quiet_seconds=30,
        inventory=current,
        on_device_health=lambda device, condition: told.append(device),
        clock=Clock(),
    )
    (tmp_path / "faults.yaml").write_text("gpu-0: {xid: 48}\n")
    await health.check_once()
    taints = health.taints(inventory.devices)
    assert [str(t) for t in taints[partition]] == ["gpu.example.com/xid=48:NoSchedule"]
    assert "gpu-1" not in taints
    assert partition in told  # its claims' status hears it too
    reports = {r.device: r for r in await health.device_reports()}
    assert not reports[partition].healthy
    assert reports["gpu-1"].healthy
    assert sample("dra_gpu_device_health", node="node-h", device=partition, state="fatal") == 1


class Unmonitored(simulated.SimulatedBackend):
    def monitored(self) -> dict[str, bool]:
        return {"gpu-0": False, "gpu-1": True}


async def test_a_gpu_nvml_does_not_watch_is_a_gauge_of_zero(tmp_path: Path) -> None:
    backend = Unmonitored(PROFILE, "node-h")

    async def inventory() -> model.Inventory:
        return PROFILE.inventory("node-h")

    health = HealthMonitor(
        None,
        backend,
        driver="gpu.example.com",
        node="node-h",
        quiet_seconds=30,
        inventory=inventory,
        clock=Clock(),
    )
    await health.check_once()
    assert sample("dra_gpu_device_health_monitored", node="node-h", device="gpu-0") == 0
    assert sample("dra_gpu_device_health_monitored", node="node-h", device="gpu-1") == 1


async def test_a_backend_that_sees_every_devices_faults_reports_each_monitored() -> None:
    backend = simulated.SimulatedBackend(PROFILE, "node-m")  # its faults file names any device

    async def inventory() -> model.Inventory:
        return PROFILE.inventory("node-m")

    health = HealthMonitor(
        None,
        backend,
        driver="gpu.example.com",
        node="node-m",
        quiet_seconds=30,
        inventory=inventory,
        clock=Clock(),
    )
    await health.check_once()
    for device in ("gpu-0", "gpu-1"):
        assert sample("dra_gpu_device_health_monitored", node="node-m", device=device) == 1

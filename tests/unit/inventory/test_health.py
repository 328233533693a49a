"""Device health: faults become taints with the right effect, key and time; taints clear only
after a quiet period (a flapping device is not toggled faster); taints are published on the
device; the simulated faults file and the NVML event thread are the sources."""

from __future__ import annotations

import asyncio
import datetime
import threading
from pathlib import Path

import pytest

from dra_gpu import slices
from dra_gpu.devices import health, model, nvml, simulated
from tests.unit.inventory import fake_pynvml
from tests.unit.inventory.fake_pynvml import FakeNvml

DRIVER = "gpu.example.com"
T0 = datetime.datetime(2026, 3, 1, 12, 3, 0, 250000, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_a_fatal_xid_taints_no_execute_naming_the_xid_since_the_fault() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=60)
    fault = health.XidPolicy().fault("gpu-0", 79)
    assert fault is not None
    [change] = tracker.observe([fault], at(0))
    assert change.added
    assert change.device == "gpu-0"
    assert change.taint.to_api() == {
        "key": "gpu.example.com/xid",
        "value": "79",
        "effect": "NoExecute",
        "timeAdded": "2026-03-01T12:03:00Z",  # whole seconds, as the API server keeps it
    }
    assert str(change.taint) == "gpu.example.com/xid=79:NoExecute"
    assert tracker.state("gpu-0") == "fatal"
    assert tracker.state("gpu-1") == "healthy"


def test_xids_are_fatal_degraded_or_ignored_by_policy() -> None:
    policy = health.XidPolicy()
    assert policy.classify(79) is health.Severity.FATAL
    assert policy.classify(31) is None  # an application's MMU fault: says nothing of the GPU
    assert policy.classify(999) is health.Severity.DEGRADED
    assert health.Severity.DEGRADED.effect == "NoSchedule"
    custom = health.XidPolicy.parse("31", "")
    assert custom.classify(31) is health.Severity.FATAL
    assert custom.classify(79) is health.Severity.DEGRADED
    with pytest.raises(ValueError, match="both as fatal and as ignored"):
        health.XidPolicy.parse("79", "79")
    with pytest.raises(ValueError, match="'x9' is not an XID"):
        health.XidPolicy.parse("x9", None)


def test_the_taint_clears_only_after_the_quiet_period() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=30)
    tracker.observe([health.ecc_fault("gpu-1")], at(0))
    assert tracker.expire(at(29)) == []
    [cleared] = tracker.expire(at(30))
    assert not cleared.added
    assert cleared.taint.key == "gpu.example.com/ecc"
    assert tracker.taints() == {}
    assert tracker.state("gpu-1") == "healthy"


def test_a_flapping_device_is_not_toggled_faster_than_the_quiet_period() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=30)
    toggles: list[tuple[float, bool]] = []
    # A fault every 20 s for two minutes, then silence; checked every second.
    for second in range(0, 200):
        faults = [health.lost_fault("gpu-0")] if second % 20 == 0 and second <= 120 else []
        changes = tracker.observe(faults, at(second)) + tracker.expire(at(second))
        toggles += [(second, c.added) for c in changes]
    assert toggles == [(0, True), (150, False)]


def test_the_same_fault_keeps_its_time_and_an_escalation_is_a_new_taint() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=60)
    policy = health.XidPolicy()
    degraded = policy.fault("gpu-0", 999)
    fatal = policy.fault("gpu-0", 79)
    assert degraded is not None
    assert fatal is not None
    [added] = tracker.observe([degraded], at(0))
    assert tracker.observe([degraded], at(10)) == []
    assert tracker.taints()["gpu-0"][0].time_added == added.taint.time_added
    removed, escalated = tracker.observe([fatal], at(20))
    assert (removed.added, removed.taint.effect) == (False, "NoSchedule")
    assert (escalated.added, escalated.taint.effect) == (True, "NoExecute")
    assert escalated.taint.time_added == at(20).replace(microsecond=0)
    assert tracker.observe([degraded], at(30)) == []  # a lesser fault keeps the worse taint
    assert [t.effect for t in tracker.taints()["gpu-0"]] == ["NoExecute"]


def gpu(index: int, *taints: health.Taint) -> model.Device:
    device = model.gpu_device(
        index=index,
        uuid=f"GPU-{index}",
        memory="24Gi",
        product_name="Simulated GPU",
        brand="Simulated",
        architecture="Simulated",
        cuda_compute_capability="9.0",
        driver_version="550.54.15",
        mig_capable=False,
    )
    return model.Device(device.name, device.uuid, device.attributes, device.capacity, taints=taints)


TAINT = health.Taint("gpu.example.com/xid", "79", "NoExecute", T0.replace(microsecond=0))


def test_a_tainted_device_is_published_with_its_taints_and_the_pool_changes() -> None:
    clean = slices.build_slices("node-01", "uid", DRIVER, [gpu(0), gpu(1)], 1)
    tainted = slices.build_slices("node-01", "uid", DRIVER, [gpu(0, TAINT), gpu(1)], 2)
    devices = tainted[0]["spec"]["devices"]
    assert devices[0]["taints"] == [
        {
            "key": "gpu.example.com/xid",
            "value": "79",
            "effect": "NoExecute",
            "timeAdded": "2026-03-01T12:03:00Z",
        }
    ]
    assert "taints" not in devices[1]
    assert slices.slices_differ(clean, tainted)
    assert not slices.slices_differ(tainted, tainted)


def test_a_slice_with_a_tainted_device_holds_at_most_64_devices() -> None:
    devices = [gpu(i) for i in range(100)]
    assert len(slices.build_slices("node-01", "uid", DRIVER, devices, 1)) == 1
    devices[5] = gpu(5, TAINT)
    bodies = slices.build_slices("node-01", "uid", DRIVER, devices, 1)
    assert [len(b["spec"]["devices"]) for b in bodies] == [64, 36]


def test_the_faults_file_lists_what_the_devices_have_now() -> None:
    faults = simulated.parse_faults(
        "gpu-0: {xid: 79}\ngpu-1: {ecc: double-bit, xid: 31}\ngpu-2: {lost: true}\n",
        health.XidPolicy(),
    )
    assert [(f.device, f.cause, f.value, f.severity.effect) for f in faults] == [
        ("gpu-0", "xid", "79", "NoExecute"),
        ("gpu-1", "ecc", "double-bit", "NoExecute"),  # XID 31 is ignored by default
        ("gpu-2", "lost", "true", "NoExecute"),
    ]
    assert simulated.parse_faults("", health.XidPolicy()) == ()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("gpu-0: {xid: seventy}", r"faults file f.yaml: gpu-0.xid: expected an XID"),
        ("gpu-0: {melted: true}", r"gpu-0.melted: unknown field \(known: ecc, lost, xid\)"),
        ("gpu-0: {ecc: single-bit}", r"gpu-0.ecc: expected double-bit"),
        ("gpu-0: {}", r"gpu-0: expected one of xid, ecc, lost"),
        ("[gpu-0]", r"expected a mapping, got a list"),
        ("gpu-0: {xid: 79\n", r"not valid YAML"),
    ],
)
def test_a_bad_faults_file_says_which_field(text: str, error: str) -> None:
    with pytest.raises(model.ProfileError, match=error):
        simulated.parse_faults(text, health.XidPolicy(), source="f.yaml")


async def test_the_simulated_backend_reads_the_faults_file_each_time(tmp_path: Path) -> None:
    profile = simulated.parse_profile("nodes: {node-01: {devices: [{memory: 24Gi}]}}")
    faults_file = tmp_path / "faults.yaml"
    backend = simulated.SimulatedBackend(profile, "node-01", faults_file=faults_file)
    assert await backend.faults() == ()  # no file: no faults
    faults_file.write_text("gpu-0: {lost: true}\n")
    [fault] = await backend.faults()
    assert (fault.device, fault.cause) == ("gpu-0", "lost")
    faults_file.unlink()
    assert await backend.faults() == ()


async def _faults_until(backend: nvml.NvmlBackend, count: int) -> list[health.Fault]:
    found: list[health.Fault] = []
    for _ in range(200):
        found += await backend.faults()
        if len(found) >= count:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {found} after 2 s")


async def test_nvml_events_become_faults_off_the_event_loop() -> None:
    fake = FakeNvml()
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        assert await backend.faults() == ()
        await asyncio.to_thread(backend._watching.wait, 5)
        fake.emit(1, fake_pynvml.nvmlEventTypeXidCriticalError, 79)
        fake.emit(0, fake_pynvml.nvmlEventTypeXidCriticalError, 13)  # ignored by default
        fake.emit(0, fake_pynvml.nvmlEventTypeDoubleBitEccError)
        faults = await _faults_until(backend, 2)
        assert [(f.device, f.cause, f.value) for f in faults] == [
            ("gpu-1", "xid", "79"),
            ("gpu-0", "ecc", "double-bit"),
        ]
        watcher = backend._watcher
    assert watcher is not None
    assert not watcher.is_alive()  # aclose ended the thread
    assert all(event_set.freed for event_set in fake.event_sets)
    loop_thread = threading.get_ident()
    waits = [t for name, t in fake.call_threads if name == "nvmlEventSetWait_v2"]
    assert waits
    assert loop_thread not in waits


async def test_a_lost_gpu_is_a_fault_for_as_long_as_it_is_lost() -> None:
    fake = FakeNvml()
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        assert await backend.faults() == ()
        await asyncio.to_thread(backend._watching.wait, 5)
        fake.gpus[0].errors["nvmlDeviceGetUUID"] = fake_pynvml.NVML_ERROR_GPU_IS_LOST
        for _ in range(2):
            [fault] = await backend.faults()
            assert (fault.device, fault.cause, fault.severity.effect) == (
                "gpu-0",
                "lost",
                "NoExecute",
            )
        del fake.gpus[0].errors["nvmlDeviceGetUUID"]
        assert await backend.faults() == ()

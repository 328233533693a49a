"""Device health: faults become taints with the right effect, key and time; taints clear only
after a quiet period (a flapping device is not toggled faster); taints are published on the
device; the simulated faults file and the NVML event thread are the sources."""

from __future__ import annotations

import asyncio
import datetime
import threading
from pathlib import Path

import pytest

from dra_gpu.agent import slices
from dra_gpu.devices import health, mig, model, nvml, simulated
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeGpu, FakeNvml, a100_in_mig_mode

DRIVER = "gpu.example.com"
T0 = datetime.datetime(2026, 3, 1, 12, 3, 0, 250000, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def xid_fault(policy: health.XidPolicy, xid: int, device: str = "gpu-0") -> health.Fault:
    fault = policy.fault(device, xid)
    assert fault is not None, f"XID {xid} taints nothing"
    return fault


def test_a_reset_needing_xid_taints_no_schedule_naming_the_xid_since_the_fault() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=60)
    fault = health.XidPolicy().fault("gpu-0", 48)
    assert fault is not None
    [change] = tracker.observe([fault], at(0))
    assert change.added
    assert change.device == "gpu-0"
    assert change.taint.to_api() == {
        "key": "gpu.example.com/xid",
        "value": "48",
        "effect": "NoSchedule",  # as NVIDIA's DRA driver: no eviction unless asked for
        "timeAdded": "2026-03-01T12:03:00Z",  # whole seconds, as the API server keeps it
    }
    assert str(change.taint) == "gpu.example.com/xid=48:NoSchedule"
    assert "WORKFLOW_XID_48" in fault.message
    assert tracker.state("gpu-0") == "fatal"  # until reset
    assert tracker.state("gpu-1") == "healthy"


def test_the_catalog_says_what_each_xid_does_and_contained_xids_never_taint() -> None:
    policy = health.XidPolicy()
    # IGNORE / RESTART_APP in NVIDIA's catalog: contained to the application, no taint (before,
    # 63, 92 and 94 were NoExecute and evicted every sharer of the GPU).
    for xid in (13, 31, 43, 45, 63, 68, 92, 94):
        assert policy.fault("gpu-0", xid) is None, xid
    # RESET_GPU / RESTART_BM / WORKFLOW_XID_48: until reset.
    for xid in (46, 48, 62, 64, 79, 95, 109, 119, 120, 140):
        fault = policy.fault("gpu-0", xid)
        assert fault is not None
        assert (fault.severity, fault.effect, fault.until_reset) == (
            health.Severity.FATAL,
            "NoSchedule",
            True,
        ), xid
    # A workflow that depends on what NVML does not tell, or an XID newer than the catalog.
    for xid in (74, 144, 999):
        fault = policy.fault("gpu-0", xid)
        assert fault is not None
        assert (fault.severity, fault.effect) == (health.Severity.DEGRADED, "NoSchedule"), xid
    assert "not in NVIDIA's catalog" in xid_fault(policy, 999).message
    for fault in (policy.ecc_fault("gpu-0"), policy.lost_fault("gpu-0")):
        assert (fault.effect, fault.until_reset) == ("NoSchedule", True)


def test_no_execute_is_opt_in_per_xid_or_for_every_reset_needing_fault() -> None:
    listed = health.XidPolicy.parse("48", "74,109")
    assert xid_fault(listed, 48).effect == "NoExecute"
    assert xid_fault(listed, 95).effect == "NoSchedule"
    assert listed.fault("gpu-0", 74) is None  # ignored on top of the catalog
    assert listed.fault("gpu-0", 109) is None
    assert listed.lost_fault("gpu-0").effect == "NoSchedule"
    every = health.XidPolicy.parse("reset", None)
    assert xid_fault(every, 95).effect == "NoExecute"
    assert xid_fault(every, 74).effect == "NoSchedule"  # not reset-needing
    assert every.lost_fault("gpu-0").effect == "NoExecute"
    assert every.ecc_fault("gpu-0").effect == "NoExecute"
    # The old default list, kept in someone's values: it works, and the log says what it does.
    old = health.XidPolicy.parse("48,61,62,63,64,74,79,92,94,95,119,120,140", "13,31,43,45,68")
    assert xid_fault(old, 94).effect == "NoExecute"
    [note] = old.notes()
    assert "63 (IGNORE), 92 (IGNORE), 94 (RESTART_APP)" in note
    assert health.XidPolicy().notes() == []
    with pytest.raises(ValueError, match="both as fatal and as ignored"):
        health.XidPolicy.parse("79", "79")
    with pytest.raises(ValueError, match="'x9' is not an XID"):
        health.XidPolicy.parse("x9", None)


def test_a_reset_needing_taint_outlives_the_quiet_period_until_the_gpu_is_reset() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=30)
    fault = health.XidPolicy().fault("gpu-0", 95)
    assert fault is not None
    tracker.observe([fault], at(0))
    assert tracker.expire(at(3600)) == []  # an hour of quiet: a broken GPU stays out
    assert tracker.held() == {"gpu-0"}
    [cleared] = tracker.observe(
        [health.Reset("gpu-0", "NVML's recovery action is back to none")], at(3601)
    )
    assert (cleared.added, cleared.reason) == (False, "NVML's recovery action is back to none")
    assert tracker.taints() == {}


def test_an_operator_clear_takes_only_the_taints_from_before_the_reset_it_names() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=30)
    policy = health.XidPolicy()
    tracker.observe([policy.lost_fault("gpu-0")], at(0))
    tracker.observe([policy.ecc_fault("gpu-1")], at(100))
    reset_at = health.parse_time("2026-03-01T12:04:00Z")  # between the two faults
    assert tracker.reset("gpu-1", at(200), reason="operator", before=reset_at) == []
    [cleared] = tracker.reset("gpu-0", at(200), reason="operator", before=reset_at)
    assert cleared.device == "gpu-0"
    assert list(tracker.taints()) == ["gpu-1"]
    with pytest.raises(ValueError, match="not an RFC 3339 time"):
        health.parse_time("yesterday")


def test_the_taint_clears_only_after_the_quiet_period() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=30)
    fault = health.XidPolicy().fault("gpu-1", 74)
    assert fault is not None
    tracker.observe([fault], at(0))
    assert tracker.expire(at(29)) == []
    [cleared] = tracker.expire(at(30))
    assert not cleared.added
    assert cleared.taint.key == "gpu.example.com/xid"
    assert tracker.taints() == {}
    assert tracker.state("gpu-1") == "healthy"


def test_a_flapping_device_is_not_toggled_faster_than_the_quiet_period() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=30)
    toggles: list[tuple[float, bool]] = []
    fault = xid_fault(health.XidPolicy(), 74)
    # A fault every 20 s for two minutes, then silence; checked every second.
    for second in range(0, 200):
        faults = [fault] if second % 20 == 0 and second <= 120 else []
        changes = tracker.observe(faults, at(second)) + tracker.expire(at(second))
        toggles += [(second, c.added) for c in changes]
    assert toggles == [(0, True), (150, False)]


def test_the_same_fault_keeps_its_time_and_an_escalation_is_a_new_taint() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=60)
    policy = health.XidPolicy.parse("79", None)
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


def test_a_partition_carries_its_gpus_taints_and_a_gpu_reset_clears_its_partitions() -> None:
    tracker = health.HealthTracker(DRIVER, quiet_seconds=60)
    tracker.parents = {"gpu-0-mig-1g-5gb-0": "gpu-0", "gpu-0-mig-3g-20gb-4": "gpu-0"}
    policy = health.XidPolicy()
    gpu_wide = policy.fault("gpu-0", 48)
    one_instance = policy.fault("gpu-0-mig-3g-20gb-4", 74)
    assert gpu_wide is not None
    assert one_instance is not None
    tracker.observe([gpu_wide, one_instance], at(0))
    taints = tracker.taints()
    assert [str(t) for t in taints["gpu-0-mig-1g-5gb-0"]] == ["gpu.example.com/xid=48:NoSchedule"]
    assert [str(t) for t in taints["gpu-0-mig-3g-20gb-4"]] == [
        "gpu.example.com/xid=74:NoSchedule"  # its own, more specific, under the same key
    ]
    assert tracker.state("gpu-0-mig-1g-5gb-0") == "fatal"
    assert tracker.fault_of("gpu-0-mig-1g-5gb-0") == gpu_wide
    cleared = tracker.observe([health.Reset("gpu-0", "reset")], at(5))
    assert sorted(c.device for c in cleared) == ["gpu-0", "gpu-0-mig-3g-20gb-4"]
    assert tracker.taints() == {}


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
        "gpu-0: {xid: 79}\ngpu-1: {ecc: double-bit, xid: 31}\ngpu-2: {lost: true}\n"
        "gpu-3: {recovery: gpu-reset}\n",
        health.XidPolicy(),
    )
    assert [(f.device, f.cause, f.value, f.effect, f.until_reset) for f in faults] == [
        ("gpu-0", "xid", "79", "NoSchedule", True),
        ("gpu-1", "ecc", "double-bit", "NoSchedule", True),  # XID 31 is the application's
        ("gpu-2", "lost", "true", "NoSchedule", True),
        ("gpu-3", "recovery", "gpu-reset", "NoSchedule", True),
    ]
    assert simulated.parse_faults("", health.XidPolicy()) == ()


def test_a_faults_file_xid_of_one_gpu_instance_is_its_partitions() -> None:
    def partition_at(gpu: str, gpu_instance: int) -> str | None:
        return "gpu-0-mig-3g-20gb-4" if (gpu, gpu_instance) == ("gpu-0", 2) else None

    text = "gpu-0: {xid: 74, gpuInstance: 2}\ngpu-1: {xid: 48, gpuInstance: 9}\n"
    first, second = simulated.parse_faults(text, health.XidPolicy(), partition_at=partition_at)
    assert (first.device, first.value) == ("gpu-0-mig-3g-20gb-4", "74")
    assert "GPU instance 2" in first.message
    assert second.device == "gpu-1"  # no partition at that instance: the whole GPU
    assert "the whole GPU is tainted" in second.message


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("gpu-0: {xid: seventy}", r"faults file f.yaml: gpu-0.xid: expected an XID"),
        (
            "gpu-0: {melted: true}",
            r"gpu-0.melted: unknown field \(known: ecc, gpuInstance, lost, recovery, xid\)",
        ),
        ("gpu-0: {ecc: single-bit}", r"gpu-0.ecc: expected double-bit"),
        ("gpu-0: {recovery: panic}", r"gpu-0.recovery: expected one of gpu-reset, node-reboot"),
        ("gpu-0: {gpuInstance: 1}", r"gpu-0: expected one of xid, ecc, lost, recovery"),
        ("gpu-0: {lost: true, gpuInstance: 1}", r"gpu-0.gpuInstance: only an xid is scoped"),
        ("gpu-0: {xid: 48, gpuInstance: -1}", r"gpu-0.gpuInstance: expected a GPU instance id"),
        ("gpu-0: {}", r"gpu-0: expected one of xid, ecc, lost"),
        ("[gpu-0]", r"expected a mapping, got a list"),
        ("gpu-0: {xid: 79\n", r"not valid YAML"),
    ],
)
def test_a_bad_faults_file_says_which_field(text: str, error: str) -> None:
    with pytest.raises(model.ProfileError, match=error):
        simulated.parse_faults(text, health.XidPolicy(), source="f.yaml")


async def test_the_simulated_backend_reads_the_faults_file_and_sees_a_reset(
    tmp_path: Path,
) -> None:
    profile = simulated.parse_profile("nodes: {node-01: {devices: [{memory: 24Gi}]}}")
    faults_file = tmp_path / "faults.yaml"
    backend = simulated.SimulatedBackend(profile, "node-01", faults_file=faults_file)
    assert await backend.faults() == ()  # no file: no faults
    faults_file.write_text("gpu-0: {lost: true}\n")
    [fault] = await backend.faults()
    assert isinstance(fault, health.Fault)
    assert (fault.device, fault.cause) == ("gpu-0", "lost")
    faults_file.unlink()  # the GPU answers again: it was reset
    [reset] = await backend.faults()
    assert isinstance(reset, health.Reset)
    assert reset.device == "gpu-0"
    assert await backend.faults() == ()


async def test_the_simulated_mig_instance_of_a_gpu_instance_id_is_tainted(tmp_path: Path) -> None:
    profile = simulated.parse_profile(
        "nodes: {node-01: {devices: [{memory: 40Gi, migCapable: true, mig: A100-40GB}]}}"
    )
    faults_file = tmp_path / "faults.yaml"
    backend = simulated.SimulatedBackend(profile, "node-01", faults_file=faults_file)
    created = await backend.create_mig_instance(model.MigPlacement("gpu-0", "3g.20gb", 4))
    faults_file.write_text(f"gpu-0: {{xid: 74, gpuInstance: {created.gpu_instance}}}\n")
    [fault] = await backend.faults()
    assert isinstance(fault, health.Fault)
    assert fault.device == "gpu-0-mig-3g-20gb-4"


async def _faults_until(backend: nvml.NvmlBackend, count: int) -> list[health.Fault]:
    found: list[health.Fault] = []
    for _ in range(200):
        found += [f for f in await backend.faults() if isinstance(f, health.Fault)]
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
        fake.emit(0, fake_pynvml.nvmlEventTypeXidCriticalError, 13)  # the application's
        fake.emit(0, fake_pynvml.nvmlEventTypeDoubleBitEccError)
        faults = await _faults_until(backend, 2)
        assert [(f.device, f.cause, f.value) for f in faults] == [
            ("gpu-1", "xid", "79"),
            ("gpu-0", "ecc", "double-bit"),
        ]
        assert backend.monitored() == {"gpu-0": True, "gpu-1": True}
        watcher = backend._watcher
    assert watcher is not None
    assert not watcher.is_alive()  # aclose ended the thread
    assert all(event_set.freed for event_set in fake.event_sets)
    loop_thread = threading.get_ident()
    waits = [t for name, t in fake.call_threads if name == "nvmlEventSetWait_v2"]
    assert waits
    assert loop_thread not in waits


async def test_a_lost_gpu_is_published_from_its_last_reading_and_tainted_while_lost() -> None:
    fake = FakeNvml()
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        before = await backend.inventory()
        assert await backend.faults() == ()
        await asyncio.to_thread(backend._watching.wait, 5)
        fake.lose(0)  # every call about GPU 0 answers GPU_IS_LOST from now on
        # Before: inventory() raised here, so the publish the fault triggered failed forever.
        after = await backend.inventory()
        assert after.devices == before.devices  # the lost GPU as last read, the other as read
        for _ in range(2):
            [fault] = await backend.faults()
            assert isinstance(fault, health.Fault)
            assert (fault.device, fault.cause, fault.effect, fault.until_reset) == (
                "gpu-0",
                "lost",
                "NoSchedule",
                True,
            )
        # XID 79 from the lost GPU is still named (by its handle: its UUID is gone), and
        # the event thread goes on for the other GPU.
        fake.emit(0, fake_pynvml.nvmlEventTypeXidCriticalError, 79)
        fake.emit(1, fake_pynvml.nvmlEventTypeXidCriticalError, 48)
        events = [f for f in await _faults_until(backend, 4) if f.cause == "xid"]
        assert [(f.device, f.value) for f in events] == [("gpu-0", "79"), ("gpu-1", "48")]
        assert backend._watcher is not None
        assert backend._watcher.is_alive()
        fake.gpus[0].lost = False  # reset: it answers again
        [reset] = await backend.faults()
        assert reset == health.Reset("gpu-0", "the GPU answers NVML again (reset or re-attached)")
        assert await backend.faults() == ()


async def test_a_gpu_lost_before_it_was_ever_read_leaves_the_others_published() -> None:
    fake = FakeNvml()
    fake.gpus[0].lost = True
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        inventory = await backend.inventory()
        assert [d.name for d in inventory.devices] == ["gpu-1"]
        [fault] = await backend.faults()
        assert isinstance(fault, health.Fault)
        assert fault.cause == "lost"


async def test_a_gpu_whose_event_registration_nvml_refuses_is_the_only_one_unwatched() -> None:
    fake = FakeNvml()
    fake.gpus[0].errors["nvmlDeviceGetSupportedEventTypes"] = fake_pynvml.NVML_ERROR_NOT_SUPPORTED
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        assert await backend.faults() == ()
        await asyncio.to_thread(backend._watching.wait, 5)
        fake.emit(1, fake_pynvml.nvmlEventTypeXidCriticalError, 48)
        [fault] = await _faults_until(backend, 1)
        assert (fault.device, fault.value) == ("gpu-1", "48")
        for _ in range(3):
            await backend.faults()
        assert backend.monitored() == {"gpu-0": False, "gpu-1": True}
    # Registered once: the thread did not die and start again on every poll.
    registrations = [n for n, _ in fake.call_threads if n == "nvmlDeviceRegisterEvents"]
    assert len(registrations) == 1


async def test_an_xid_of_one_mig_gpu_instance_taints_its_partition_a_gpu_wide_one_the_gpu() -> None:
    fake = FakeNvml([a100_in_mig_mode(uuid="GPU-0"), FakeGpu(uuid="GPU-1", mig_mode=0)])
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        created = await backend.create_mig_instance(model.MigPlacement("gpu-0", "3g.20gb", 4))
        inventory = await backend.inventory()
        assert await backend.faults() == ()
        await asyncio.to_thread(backend._watching.wait, 5)
        xid = fake_pynvml.nvmlEventTypeXidCriticalError
        fake.emit(0, xid, 74, gpu_instance=created.gpu_instance, compute_instance=0)
        fake.emit(0, xid, 48)  # GPU-wide: 0xFFFFFFFF
        fake.emit(0, xid, 74, gpu_instance=13, compute_instance=0)  # no such instance
        faults = await _faults_until(backend, 3)
    [partition] = [d for d in inventory.devices if mig.placement_of(d) == created.placement]
    assert [(f.device, f.value) for f in faults] == [
        (partition.name, "74"),
        ("gpu-0", "48"),
        ("gpu-0", "74"),
    ]


async def test_nvmls_recovery_action_taints_until_it_is_back_to_none() -> None:
    fake = FakeNvml()
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        assert await backend.faults() == ()
        fake.gpus[1].recovery_action = 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
        [fault] = await backend.faults()
        assert isinstance(fault, health.Fault)
        assert (fault.device, fault.cause, fault.value) == ("gpu-1", "recovery", "gpu-reset")
        fake.gpus[1].recovery_action = 0
        [reset] = await backend.faults()
        assert reset == health.Reset("gpu-1", "NVML's recovery action is back to none")
        fake.gpus[0].recovery_action = None  # a driver without the field: no answer, no fault
        assert await backend.faults() == ()

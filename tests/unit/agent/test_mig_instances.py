"""MIG instances over a claim's life, against both backends' ``MigInstances``: the simulated
GPUs (their instance table in a directory, as on the node's tmpfs) and the NVML backend over the
fake pynvml. Prepare creates the partition's instance and names its MIG device in the CDI spec,
unprepare destroys it, and recovery at start leaves no leaked and no missing instance after a
crash between creation and the checkpoint write, or after a reboot. Real files under tmp_path.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from dra_gpu.agent import cdi, checkpoint, failpoints
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import DeviceState, Prepared, PrepareFailed
from dra_gpu.devices import mig, model, nvml, simulated
from dra_gpu.serving import metrics
from tests.support.fake_pynvml import PRIVILEGED_CALLS, FakeGpu, FakeNvml, a100_in_mig_mode
from tests.unit.agent.rig import ClaimsApi, NoStatus

DRIVER = "gpu.example.com"
NODE = "node-01"
PROFILE = f"""\
nodes:
  {NODE}:
    devices:
    - {{memory: 40Gi, migCapable: true, mig: A100-40GB, productName: NVIDIA A100-SXM4-40GB}}
"""
P3G = "gpu-0-mig-3g-20gb-4"
P1G = "gpu-0-mig-1g-5gb-0"


class MigBackend(model.Backend, model.MigInstances, Protocol):
    """What these tests need of a backend: devices and MIG instances."""


@dataclasses.dataclass
class Rig:
    """One backend and how its GPUs lose their instances (a reboot)."""

    name: str
    backend: MigBackend
    reboot: Callable[[], None]
    visible: Callable[[str], dict[str, str]]
    """The CDI environment naming a MIG device of the first device of a claim."""
    fake: FakeNvml | None = None


@pytest.fixture(params=["simulated", "nvml"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    if request.param == "simulated":
        hardware = tmp_path / "run" / "hardware"
        backend = simulated.SimulatedBackend(
            simulated.parse_profile(PROFILE), NODE, hardware_dir=hardware
        )
        yield Rig(
            "simulated",
            backend,
            lambda: shutil.rmtree(hardware, ignore_errors=True),
            lambda uuid: {"GPU_DEVICE_0_MIG": uuid},
        )
        return
    fake = FakeNvml([a100_in_mig_mode()])
    yield Rig(
        "nvml",
        nvml.NvmlBackend(NODE, nvml=fake),
        lambda: fake.reset(0),
        lambda uuid: {"NVIDIA_VISIBLE_DEVICES": uuid},
        fake,
    )


class Claims(ClaimsApi):
    def add(self, name: str, *devices: str, config: list[Any] | None = None) -> ClaimRef:
        results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
        return self.allocate(name, results, config or [])


def agent(rig: Rig, tmp_path: Path, api: Claims, *, own_layout: bool = False) -> DeviceState:
    """An agent as it starts: the checkpoint on disk loaded."""

    async def inventory(fresh: bool) -> model.Inventory:
        return await rig.backend.inventory()

    state = DeviceState(
        api=api,  # type: ignore[arg-type]  # prepare only GETs claims
        driver=DRIVER,
        node=NODE,
        container_edits=rig.backend.container_edits,
        cdi_dir=tmp_path / "run" / "cdi",
        checkpoint_file=tmp_path / "checkpoint.json",
        inventory=inventory,
        status=NoStatus(),
        mig=rig.backend,
        mig_own_layout=own_layout,
    )
    state.load(checkpoint.read_checkpoint(tmp_path / "checkpoint.json"))
    return state


def spec_env(tmp_path: Path, ref: ClaimRef) -> dict[str, str]:
    spec = json.loads((tmp_path / "run" / "cdi" / cdi.spec_file_name(DRIVER, ref.uid)).read_text())
    (device,) = spec["devices"]
    # What the container sees: the claim's edits, then the device's (as CDI applies them).
    env = spec.get("containerEdits", {}).get("env", []) + device["containerEdits"]["env"]
    return dict(entry.split("=", 1) for entry in env)


def recorded(tmp_path: Path) -> dict[str, list[model.MigInstance]]:
    on_disk = checkpoint.read_checkpoint(tmp_path / "checkpoint.json")
    return {c.name: c.mig_instances() for c in on_disk.claims.values()}


async def test_prepare_creates_the_partitions_instance_and_unprepare_destroys_it(
    rig: Rig, tmp_path: Path
) -> None:
    api = Claims()
    ref = api.add("a", P3G)
    state = agent(rig, tmp_path, api)

    assert isinstance(await state.prepare(ref), Prepared)

    (instance,) = await rig.backend.mig_instances()
    assert instance.placement == model.MigPlacement("gpu-0", "3g.20gb", 4)
    assert instance.compute_instance is not None
    assert instance.uuid.startswith("MIG-")
    assert spec_env(tmp_path, ref).items() >= rig.visible(instance.uuid).items()
    assert recorded(tmp_path) == {"a": [instance]}

    assert await state.unprepare(ref) is None
    assert await rig.backend.mig_instances() == ()
    assert recorded(tmp_path) == {}
    assert await state.unprepare(ref) is None  # repeating it is harmless


async def test_the_whole_gpu_of_a_mig_mode_gpu_is_not_offered(rig: Rig, tmp_path: Path) -> None:
    # A container given the whole GPU of a MIG-mode GPU would get no MIG device to run on.
    inventory = await rig.backend.inventory()
    assert "gpu-0" not in inventory.by_name
    assert {d.partition_of for d in inventory.devices} == {"gpu-0"}
    assert len(inventory.devices) == 25  # every A100 40GB placement
    api = Claims()
    state = agent(rig, tmp_path, api)
    failed = await state.prepare(api.add("whole", "gpu-0"))
    assert isinstance(failed, PrepareFailed)
    assert "device gpu-0 is not on node node-01" in failed.message
    assert await rig.backend.mig_instances() == ()


async def test_a_claim_whose_second_instance_cannot_be_created_keeps_none(
    rig: Rig, tmp_path: Path
) -> None:
    # The scheduler's counters never allow these two together; the hardware refuses them too.
    api = Claims()
    state = agent(rig, tmp_path, api)
    result = await state.prepare(api.add("both", "gpu-0-mig-3g-20gb-0", "gpu-0-mig-4g-20gb-0"))
    assert isinstance(result, PrepareFailed)
    assert "ResourceClaim ns/both" in result.message
    assert await rig.backend.mig_instances() == ()
    assert recorded(tmp_path) == {}


async def test_mig_profile_config_refuses_a_partition_of_another_profile(
    rig: Rig, tmp_path: Path
) -> None:
    api = Claims()
    state = agent(rig, tmp_path, api)
    config: list[Any] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.dra-gpu.io/v1alpha1",
                    "kind": "GpuConfig",
                    "migProfile": "3g.20gb",
                },
            },
        }
    ]
    wrong = await state.prepare(api.add("small", P1G, config=config))
    assert isinstance(wrong, PrepareFailed)
    assert wrong.message == (
        "ResourceClaim ns/small: request gpu: ResourceClaim config[0].opaque.parameters"
        ".migProfile asks for a MIG partition of profile 3g.20gb, but the device allocated, "
        f"{P1G}, is a 1g.5gb partition"
    )
    assert await rig.backend.mig_instances() == ()

    assert isinstance(await state.prepare(api.add("right", P3G, config=config)), Prepared)
    assert len(await rig.backend.mig_instances()) == 1


class Killed(BaseException):
    """SIGKILL at a failpoint: nothing after it runs, no handler sees it."""


async def test_a_crash_between_creating_an_instance_and_recording_it_leaks_nothing(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reach(name: str) -> None:
        if name == "mig-instance-created":
            raise Killed

    api = Claims()
    ref = api.add("a", P3G)
    monkeypatch.setattr(failpoints, "reach", reach)
    with pytest.raises(Killed):
        await agent(rig, tmp_path, api).prepare(ref)
    assert len(await rig.backend.mig_instances()) == 1, "created, not recorded"
    assert recorded(tmp_path) == {}
    monkeypatch.undo()

    restarted = agent(rig, tmp_path, api)
    repaired = await restarted.recover()

    assert await rig.backend.mig_instances() == ()
    (line,) = repaired
    assert line.startswith("destroyed MIG instance gpu-0 3g.20gb at memory slice 4 (GPU instance")
    assert line.endswith("): no prepared claim holds it")
    # The kubelet's retry prepares it again: exactly one instance, recorded.
    assert isinstance(await restarted.prepare(ref), Prepared)
    (instance,) = await rig.backend.mig_instances()
    assert recorded(tmp_path) == {"a": [instance]}


async def test_after_a_reboot_recorded_instances_are_created_again(
    rig: Rig, tmp_path: Path
) -> None:
    api = Claims()
    a, b = api.add("a", P3G), api.add("b", P1G)
    state = agent(rig, tmp_path, api)
    assert isinstance(await state.prepare(a), Prepared)
    assert isinstance(await state.prepare(b), Prepared)
    before = {i.placement: i for i in await rig.backend.mig_instances()}
    state.close()

    rig.reboot()  # the GPU reset: no instance survives; /run (the CDI specs) is empty
    shutil.rmtree(tmp_path / "run" / "cdi")
    assert await rig.backend.mig_instances() == ()

    restarted = agent(rig, tmp_path, api)
    repaired = await restarted.recover()

    after = {i.placement: i for i in await rig.backend.mig_instances()}
    assert set(after) == set(before)
    assert "created MIG instance gpu-0 3g.20gb at memory slice 4 of claim ns/a again" in " ".join(
        repaired
    )
    # The record and the spec name the MIG device that exists now (NVML gives a new UUID).
    by_name = recorded(tmp_path)
    assert by_name == {
        "a": [after[model.MigPlacement("gpu-0", "3g.20gb", 4)]],
        "b": [after[model.MigPlacement("gpu-0", "1g.5gb", 0)]],
    }
    uuid = by_name["a"][0].uuid
    assert spec_env(tmp_path, a).items() >= rig.visible(uuid).items()
    if rig.name == "nvml":
        assert uuid != before[model.MigPlacement("gpu-0", "3g.20gb", 4)].uuid
    # ... and unprepare destroys what exists now.
    assert await restarted.unprepare(a) is None
    assert await restarted.unprepare(b) is None
    assert await rig.backend.mig_instances() == ()
    assert await restarted.recover() == []


async def test_an_instance_that_cannot_be_destroyed_keeps_its_claim_recorded(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = Claims()
    ref = api.add("a", P3G)
    state = agent(rig, tmp_path, api)
    assert isinstance(await state.prepare(ref), Prepared)

    async def busy(instance: model.MigInstance) -> None:
        raise model.InventoryError(
            "node node-01: GPU 0: NVML nvmlGpuInstanceDestroy failed: In use"
        )

    monkeypatch.setattr(rig.backend, "destroy_mig_instance", busy)
    failed = await state.unprepare(ref)
    assert failed is not None
    assert failed.message.startswith("ResourceClaim ns/a: cannot destroy MIG instance gpu-0")
    assert "In use" in failed.message
    assert list(recorded(tmp_path)) == ["a"], "kept: the kubelet retries the unprepare"
    monkeypatch.undo()
    assert await state.unprepare(ref) is None
    assert await rig.backend.mig_instances() == ()


async def test_a_rebuilt_checkpoint_adopts_the_instance_of_its_claim_instead_of_destroying_it(
    rig: Rig, tmp_path: Path
) -> None:
    api = Claims()
    ref = api.add("a", P3G)
    state = agent(rig, tmp_path, api)
    assert isinstance(await state.prepare(ref), Prepared)
    (instance,) = await rig.backend.mig_instances()
    # What a rebuild from the API server and the CDI directory records: no instance.
    record = state.prepared.claims[ref.uid]
    bare = dataclasses.replace(
        record,
        devices=tuple(dataclasses.replace(d, mig_instance=None) for d in record.devices),
    )
    checkpoint.write_checkpoint(
        tmp_path / "checkpoint.json", checkpoint.Checkpoint({ref.uid: bare})
    )

    restarted = agent(rig, tmp_path, api)
    assert (await restarted.recover())[0].startswith("recorded MIG instance gpu-0 3g.20gb")
    assert await rig.backend.mig_instances() == (instance,)
    assert recorded(tmp_path) == {"a": [instance]}


# ---- MIG without privileges -------------------------------------------------------------------

UNPRIVILEGED_PROFILE = f"""\
nodes:
  {NODE}:
    devices:
    - {{memory: 40Gi, migCapable: true, mig: A100-40GB, migManagement: denied}}
    - {{memory: 80Gi}}
"""


@dataclasses.dataclass
class Unprivileged:
    backend: MigBackend
    fake: FakeNvml | None = None


@pytest.fixture(params=["simulated", "nvml"])
def unprivileged(request: pytest.FixtureRequest, tmp_path: Path) -> Unprivileged:
    """gpu-0 in MIG mode, which NVML does not let this agent manage, and gpu-1 without MIG."""
    if request.param == "simulated":
        profile = simulated.parse_profile(UNPRIVILEGED_PROFILE)
        return Unprivileged(
            simulated.SimulatedBackend(profile, NODE, hardware_dir=tmp_path / "hardware")
        )
    plain = FakeGpu(uuid="GPU-5f2a1c3e-0001-4000-8000-000000000001", bus_id=b"00000000:2A:00.0")
    fake = FakeNvml([a100_in_mig_mode(uuid="GPU-5f2a1c3e-0000-4000-8000-000000000000"), plain])
    fake.privileged = False  # no CAP_SYS_ADMIN, no NVIDIA_MIG_CONFIG_DEVICES
    return Unprivileged(nvml.NvmlBackend(NODE, nvml=fake), fake)


async def test_a_mig_mode_gpu_nvml_refuses_to_manage_publishes_nothing_and_the_rest_goes_on(
    unprivileged: Unprivileged, tmp_path: Path
) -> None:
    backend = unprivileged.backend
    inventory = await backend.inventory()
    assert [d.name for d in inventory.devices] == ["gpu-1"]  # no partition, no whole GPU
    assert not inventory.counter_sets
    (refusal,) = backend.mig_refusals()
    assert refusal.gpu == "gpu-0"
    assert refusal.call == "nvmlDeviceGetGpuInstancePossiblePlacements"
    assert "agent.mig.manage=true" in str(refusal)
    assert "CAP_SYS_ADMIN and NVIDIA_MIG_CONFIG_DEVICES=all" in str(refusal)

    api = Claims()
    state = agent(Rig("unprivileged", backend, lambda: None, lambda u: {}), tmp_path, api)
    repaired = await state.recover()  # lists MIG instances: refused, and the agent starts
    assert repaired == [f"MIG management refused: {refusal}"]
    value = metrics.AGENT.get_sample_value(
        "dra_gpu_mig_management", {"node": NODE, "gpu": "gpu-0", "state": "refused"}
    )
    assert value == 1
    assert isinstance(await state.prepare(api.add("plain", "gpu-1")), Prepared)
    failed = await state.prepare(api.add("part", P3G))  # allocated before privileges went
    assert isinstance(failed, PrepareFailed)
    assert f"device {P3G} is not on node node-01" in failed.message


async def test_creating_an_instance_without_privileges_says_which_value_to_set(
    unprivileged: Unprivileged,
) -> None:
    with pytest.raises(model.InventoryError) as refused:
        await unprivileged.backend.create_mig_instance(model.MigPlacement("gpu-0", "3g.20gb", 4))
    assert "gpu-0" in str(refused.value)
    assert "agent.mig.manage=true" in str(refused.value)
    if unprivileged.fake is not None:
        assert unprivileged.fake.instances[0] == []


def test_the_fake_refuses_exactly_what_nvml_h_says_needs_a_privileged_user() -> None:
    fake = FakeNvml([a100_in_mig_mode()])
    fake.privileged = False
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    # Unprivileged: the profiles, the MIG mode, MIG device handles.
    assert fake.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0).sliceCount == 1
    with pytest.raises(fake.NVMLError) as refused:
        fake.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 0, [], None)
    assert refused.value.value == fake.NVML_ERROR_NO_PERMISSION
    assert str(refused.value) == "Insufficient Permissions"
    assert "nvmlDeviceGetGpuInstances" in PRIVILEGED_CALLS
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in PRIVILEGED_CALLS
    assert "nvmlGpuInstanceDestroy" in PRIVILEGED_CALLS
    assert "nvmlDeviceGetGpuInstanceProfileInfo" not in PRIVILEGED_CALLS


# ---- instances of others ----------------------------------------------------------------------


def mig_manager(rig: Rig, tmp_path: Path) -> MigBackend:
    """Another maker of MIG instances on the same GPUs (the GPU Operator's mig-manager)."""
    if rig.fake is not None:
        return nvml.NvmlBackend(NODE, nvml=rig.fake)
    return simulated.SimulatedBackend(
        simulated.parse_profile(PROFILE), NODE, hardware_dir=tmp_path / "run" / "hardware"
    )


async def test_instances_of_others_are_left_alone_and_their_placements_not_offered(
    rig: Rig, tmp_path: Path
) -> None:
    theirs = await mig_manager(rig, tmp_path).create_mig_instance(
        model.MigPlacement("gpu-0", "3g.20gb", 4)
    )
    api = Claims()
    state = agent(rig, tmp_path, api)
    repaired = await state.recover()

    assert await rig.backend.mig_instances() == (theirs,)
    assert repaired == [f"left MIG instance {theirs} alone: not made by this agent"]
    inventory = await rig.backend.inventory()
    offered = {mig.placement_of(d) for d in inventory.devices}
    # Nothing over its memory slices 4-7; what fits in slices 0-3 and 4 compute slices is.
    for device in inventory.devices:
        start, size = device.attributes["placementStart"], device.attributes["memorySlices"]
        assert isinstance(start, model.IntValue)
        assert isinstance(size, model.IntValue)
        assert start.value + size.value <= 4, device.name
    assert model.MigPlacement("gpu-0", "4g.20gb", 0) in offered
    assert model.MigPlacement("gpu-0", "3g.20gb", 0) in offered
    assert model.MigPlacement("gpu-0", "3g.20gb", 4) not in offered
    (counters,) = inventory.counter_sets
    assert dict(counters.counters) == {
        **{f"memory-slice-{i}": 1 for i in range(4)},
        "compute-slices": 4,
        "media-extensions": 1,
    }
    # A claim of the agent's goes beside it; unprepare takes only its own.
    ref = api.add("a", "gpu-0-mig-4g-20gb-0")
    assert isinstance(await state.prepare(ref), Prepared)
    assert await state.unprepare(ref) is None
    assert await rig.backend.mig_instances() == (theirs,)
    # A restart changes nothing: still theirs.
    assert await agent(rig, tmp_path, api).recover() == repaired
    assert await rig.backend.mig_instances() == (theirs,)


async def test_an_agent_that_owns_the_layout_destroys_the_instances_it_does_not_record(
    rig: Rig, tmp_path: Path
) -> None:
    theirs = await mig_manager(rig, tmp_path).create_mig_instance(
        model.MigPlacement("gpu-0", "3g.20gb", 4)
    )
    state = agent(rig, tmp_path, Claims(), own_layout=True)
    assert await state.recover() == [f"destroyed MIG instance {theirs}: no prepared claim holds it"]
    assert await rig.backend.mig_instances() == ()
    assert len((await rig.backend.inventory()).devices) == 25


async def test_a_half_made_instance_of_ours_is_destroyed_while_others_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Killed between the GPU instance and its compute instance: a GI without a CI, which
    # nothing records; the intents file says it is ours.
    fake = FakeNvml([a100_in_mig_mode()])
    backend = nvml.NvmlBackend(NODE, nvml=fake)
    rig = Rig("nvml", backend, lambda: fake.reset(0), lambda u: {}, fake)
    theirs = await mig_manager(rig, tmp_path).create_mig_instance(
        model.MigPlacement("gpu-0", "1g.5gb", 0)
    )

    def killed(gpu_instance: Any, profile_id: int) -> Any:
        raise Killed

    api = Claims()
    ref = api.add("a", P3G)
    monkeypatch.setattr(fake, "nvmlGpuInstanceCreateComputeInstance", killed)
    with pytest.raises(Killed):
        await agent(rig, tmp_path, api).prepare(ref)
    monkeypatch.undo()
    half = [i for i in await backend.mig_instances() if i.placement.profile == "3g.20gb"]
    assert [i.compute_instance for i in half] == [None]

    restarted = agent(rig, tmp_path, api)
    repaired = await restarted.recover()
    assert await backend.mig_instances() == (theirs,)
    assert f"destroyed MIG instance {half[0]}: no prepared claim holds it" in repaired
    assert isinstance(await restarted.prepare(ref), Prepared)


def spec_device_nodes(tmp_path: Path, ref: ClaimRef) -> list[str]:
    spec = json.loads((tmp_path / "run" / "cdi" / cdi.spec_file_name(DRIVER, ref.uid)).read_text())
    (device,) = spec["devices"]
    return [node["path"] for node in device["containerEdits"].get("deviceNodes", [])]


async def test_an_instance_created_again_with_other_ids_gets_its_own_capability_nodes(
    tmp_path: Path,
) -> None:
    # A driver root whose capability minors follow the GPU instance id: gi<g> -> 100 + 10 * g.
    root = tmp_path / "driver"
    (root / "dev").mkdir(parents=True)
    (root / "dev/nvidia0").touch()
    (root / "proc").mkdir()
    (root / "proc/devices").write_text("Character devices:\n195 nvidia\n237 nvidia-caps\n")
    for gi in (1, 2):
        caps = root / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{gi}"
        (caps / "ci0").mkdir(parents=True)
        (caps / "access").write_text(f"DeviceFileMinor: {100 + 10 * gi}\nDeviceFileMode: 292\n")
        (caps / "ci0/access").write_text(f"DeviceFileMinor: {101 + 10 * gi}\nDeviceFileMode: 292\n")
    fake = FakeNvml([a100_in_mig_mode()])
    rig = Rig(
        "nvml",
        nvml.NvmlBackend(NODE, nvml=fake, driver_root=root),
        lambda: fake.reset(0),
        lambda uuid: {"NVIDIA_VISIBLE_DEVICES": uuid},
        fake,
    )
    api = Claims()
    a, b = api.add("a", P3G), api.add("b", P1G)
    state = agent(rig, tmp_path, api)
    assert isinstance(await state.prepare(a), Prepared)  # GPU instance 1
    assert isinstance(await state.prepare(b), Prepared)  # GPU instance 2
    cap = "/dev/nvidia-caps/nvidia-cap"
    assert spec_device_nodes(tmp_path, a) == ["/dev/nvidia0", f"{cap}110", f"{cap}111"]
    state.close()

    rig.reboot()
    shutil.rmtree(tmp_path / "run" / "cdi")
    restarted = agent(rig, tmp_path, api)
    await restarted.recover()  # b's placement comes first now: it is GPU instance 1, a is 2

    (instance,) = recorded(tmp_path)["a"]
    assert instance.gpu_instance == 2
    assert spec_device_nodes(tmp_path, a) == ["/dev/nvidia0", f"{cap}120", f"{cap}121"]
    assert spec_device_nodes(tmp_path, b) == ["/dev/nvidia0", f"{cap}110", f"{cap}111"]
    await rig.backend.aclose()

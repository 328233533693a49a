"""The fake pynvml and the nvml backend answer as NVIDIA's go-nvml mock machines do.

The oracle is hack/nvmlref (go-nvml's pkg/nvml/mock machines; see tests/unit/devices/nvmlref.py
for what the mock does not model, which is compared nowhere here). For every machine:

- ``devices.gpu_models`` is the oracle's data, field by field (NVML's ids and the errata the
  mock is known to have are the only differences, and each erratum must still be the mock's);
- the fake, configured as the machine from the oracle's dump, answers every GPU instance
  profile, placement and compute instance profile call as the oracle does, in and out of MIG
  mode, and creates, lists and destroys instances where the oracle does;
- ``NvmlBackend`` over that fake publishes the inventory, slices and MIG partitions the oracle's
  data implies.

Run alone: ``.venv/bin/pytest tests/unit/devices/test_nvml_oracle.py``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_gpu.agent import slices
from dra_gpu.devices import gpu_models, mig, model, nvml
from dra_gpu.devices.nvml import instances as nvml_instances
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeGpu, FakeNvml
from tests.unit.devices.nvmlref import MACHINES, Oracle, build_oracle, value

pytestmark = pytest.mark.binaries

MODEL_OF = {m.machine: m for m in gpu_models.MODELS.values()}
CODES = {
    "ERROR_INVALID_ARGUMENT": fake_pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "ERROR_NOT_SUPPORTED": fake_pynvml.NVML_ERROR_NOT_SUPPORTED,
}


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    with Oracle(build_oracle()) as running:
        yield running


@pytest.fixture(scope="module")
def dumps(oracle: Oracle) -> dict[str, dict[str, Any]]:
    return {machine: oracle.dump(machine) for machine in MACHINES}


def test_every_machine_has_a_gpu_model() -> None:
    assert sorted(MODEL_OF) == sorted(MACHINES)


def fake_gpu(device: dict[str, Any], gpu_model: gpu_models.GpuModel, mig_mode: int) -> FakeGpu:
    """A fake GPU answering what the oracle's ``device`` answers. The mock leaves ``busId``
    empty; its own bus id (``0000:<index>:00.0``) is given in NVML's form."""
    domain, rest = device["mockPciBusId"].split(":", 1)
    return FakeGpu(
        name=value(device["name"]),
        uuid=value(device["uuid"]),
        memory_total=value(device["memory"])["total"],
        brand=value(device["brand"]),
        architecture=value(device["architecture"]),
        compute_capability=tuple(value(device["cudaComputeCapability"])),
        bus_id=f"{int(domain, 16):08X}:{rest.upper()}".encode(),
        mig_mode=mig_mode,
        mig_table=mig.table_of(gpu_model),
        gpu_model=gpu_model,
    )


def fake_machine(dump: dict[str, Any], mig_gpus: set[int] = frozenset()) -> FakeNvml:  # type: ignore[assignment]
    gpu_model = MODEL_OF[dump["machine"]]
    gpus = [
        fake_gpu(device, gpu_model, 1 if i in mig_gpus else 0)
        for i, device in enumerate(dump["devices"])
    ]
    fake = FakeNvml(
        gpus,
        driver_version=value(dump["driverVersion"]),
        cuda_driver_version=value(dump["cudaDriverVersion"]),
    )
    fake.nvmlInit()
    return fake


def oracle_placements(profile: dict[str, Any]) -> list[tuple[int, int]]:
    return [(p["start"], p["size"]) for p in value(profile["placements"])]


@pytest.mark.parametrize("machine", MACHINES)
def test_the_gpu_model_is_the_oracles_data(dumps: dict[str, dict[str, Any]], machine: str) -> None:
    dump = dumps[machine]
    gpu_model = MODEL_OF[machine]
    first = dump["devices"][0]
    assert value(first["memory"])["total"] == gpu_model.memory_mib * 2**20
    for device in dump["devices"][1:]:  # every GPU of a machine is the same model
        assert device["gpuInstanceProfiles"] == first["gpuInstanceProfiles"]
    for answer in first["gpuInstanceProfiles"]:
        enum = answer["profile"]
        ours = gpu_model.by_enum(enum)
        if answer["return"] != "SUCCESS":
            assert ours is None, (machine, enum)
            expected = "ERROR_INVALID_ARGUMENT" if enum >= 18 else "ERROR_NOT_SUPPORTED"
            assert answer["return"] == expected
            continue
        assert ours is not None, (machine, enum)
        info = answer["info"]
        erratum = gpu_models.MOCK_ERRATA.get((gpu_model.key, enum), gpu_models.Erratum())
        assert info["id"] == enum  # the mock's id is the enum; NVML's is ours.id
        assert (info["sliceCount"], info["instanceCount"], info["memorySizeMB"]) == (
            ours.compute_slices,
            ours.instance_count,
            ours.memory_mib,
        ), (machine, ours.name)
        placements = [(start, ours.memory_slices) for start in ours.starts]
        assert oracle_placements(answer) == list(erratum.placements or placements), ours.name
        assert answer["nvlibName"] == (erratum.nvlib_name or ours.name)
        computes = [
            gpu_models.ComputeProfile(
                c["profile"], c["info"]["sliceCount"], c["info"]["instanceCount"]
            )
            for c in answer["computeInstanceProfiles"]
            if c["return"] == "SUCCESS"
        ]
        assert tuple(computes) == ours.compute_profiles, ours.name
    supported = {a["profile"] for a in first["gpuInstanceProfiles"] if a["return"] == "SUCCESS"}
    assert supported == {p.enum for p in gpu_model.profiles}
    # NVML's ids are distinct (they are what creation and listing take).
    assert len({p.id for p in gpu_model.profiles}) == len(gpu_model.profiles)


def _code(call: Any, *args: Any) -> int | None:
    try:
        call(*args)
    except fake_pynvml.NVMLError as err:
        return err.value
    return None


@pytest.mark.parametrize("mig_mode", [0, 1])
@pytest.mark.parametrize("machine", MACHINES)
def test_the_fake_answers_profile_calls_as_the_oracle(
    dumps: dict[str, dict[str, Any]], machine: str, mig_mode: int
) -> None:
    dump = dumps[machine]
    gpu_model = MODEL_OF[machine]
    fake = fake_machine(dump, {0} if mig_mode else set())
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    for answer in dump["devices"][0]["gpuInstanceProfiles"]:
        enum = answer["profile"]
        if answer["return"] != "SUCCESS":
            code = _code(fake.nvmlDeviceGetGpuInstanceProfileInfo, handle, enum)
            assert code == CODES[answer["return"]], (machine, enum)
            continue
        info = fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        ours = gpu_model.by_enum(enum)
        assert ours is not None
        expected = answer["info"]
        assert info.id == ours.id  # NVML's id, not the enum (the mock's answer)
        assert (info.sliceCount, info.instanceCount, info.memorySizeMB) == (
            expected["sliceCount"],
            expected["instanceCount"],
            expected["memorySizeMB"],
        )
        assert info.name == f"MIG {ours.name}"
        # Placements, in MIG mode or not (nvml.h), by NVML's id.
        found = (fake_pynvml.c_nvmlGpuInstancePlacement_t * 32)()
        count = ctypes.c_uint(0)
        fake.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, found, ctypes.byref(count))
        got = [(found[i].start, found[i].size) for i in range(count.value)]
        erratum = gpu_models.MOCK_ERRATA.get((gpu_model.key, enum), gpu_models.Erratum())
        if erratum.placements is None:
            assert got == oracle_placements(answer), ours.name
        else:
            assert got == [(s, ours.memory_slices) for s in ours.starts]


@pytest.mark.parametrize("machine", MACHINES)
def test_instances_are_created_listed_and_destroyed_as_the_oracle_does(
    oracle: Oracle, dumps: dict[str, dict[str, Any]], machine: str
) -> None:
    """Each placement of each profile, one at a time, on GPU 0 in MIG mode: a GPU instance, a
    compute instance spanning it (and every compute profile it offers), listed, destroyed."""
    oracle.ask("reset", machine)
    assert oracle.ask("setMigMode", machine, gpu=0, mode=1)["return"] == "SUCCESS"
    gpu_model = MODEL_OF[machine]
    fake = fake_machine(dumps[machine], {0})
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    by_enum = {a["profile"]: a for a in dumps[machine]["devices"][0]["gpuInstanceProfiles"]}
    for ours in gpu_model.profiles:
        info = fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, ours.enum)
        for start in ours.starts:
            where = fake_pynvml.c_nvmlGpuInstancePlacement_t()
            where.start, where.size = start, ours.memory_slices
            created = oracle.ask(
                "createGpuInstance",
                machine,
                gpu=0,
                profile=ours.enum,
                placement={"start": start, "size": ours.memory_slices},
            )
            assert created["return"] == "SUCCESS"
            gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(where))
            gi_info = fake.nvmlGpuInstanceGetInfo(gi)
            assert (gi_info.placement.start, gi_info.placement.size) == (
                created["placement"]["start"],
                created["placement"]["size"],
            )
            assert created["profileId"] == ours.enum
            assert gi_info.profileId == ours.id
            # Every compute instance profile: the same answer from both.
            for c in by_enum[ours.enum]["computeInstanceProfiles"]:
                code = _code(
                    fake.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                    gi,
                    c["profile"],
                    fake_pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                assert code == (None if c["return"] == "SUCCESS" else CODES[c["return"]])
            full = nvml_instances._COMPUTE_PROFILE_OF_SLICES[ours.compute_slices]
            ci = oracle.ask(
                "createComputeInstance", machine, gpu=0, gpuInstance=created["id"], profile=full
            )
            assert ci["return"] == "SUCCESS"
            ci_info = fake.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, full, fake_pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            compute = fake.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            assert fake.nvmlComputeInstanceGetInfo(compute).profileId == ci["profileId"] == full
            listed = oracle.ask("listGpuInstances", machine, gpu=0)["gpuInstances"]
            assert [(g["profile"], g["placement"]["start"]) for g in listed] == [(ours.enum, start)]
            assert [c["profileId"] for c in listed[0]["computeInstances"]] == [full]
            handles = (fake_pynvml.c_nvmlGpuInstance_t * 32)()
            count = ctypes.c_uint(0)
            fake.nvmlDeviceGetGpuInstances(handle, info.id, handles, ctypes.byref(count))
            assert count.value == 1
            for request in (
                {"op": "destroyComputeInstance", "computeInstance": ci["id"]},
                {"op": "destroyGpuInstance"},
            ):
                op = request.pop("op")
                assert (
                    oracle.ask(op, machine, gpu=0, gpuInstance=created["id"], **request)["return"]
                    == "SUCCESS"
                )
            fake.nvmlComputeInstanceDestroy(compute)
            fake.nvmlGpuInstanceDestroy(gi)
            assert oracle.ask("listGpuInstances", machine, gpu=0)["gpuInstances"] == []
            assert fake.instances[0] == []


@pytest.mark.parametrize("method", ["GetMaxMigDeviceCount", "GetGpuInstanceById"])
def test_what_the_mock_does_not_model_is_said_so(oracle: Oracle, method: str) -> None:
    # The fake keeps nvml.h's behaviour for these; the docstring of nvmlref lists them.
    assert oracle.ask("call", "dgxa100", gpu=0, method=method) == {"modeled": False}


@pytest.mark.parametrize("machine", MACHINES)
async def test_the_nvml_backend_publishes_what_the_oracle_says(
    dumps: dict[str, dict[str, Any]], machine: str
) -> None:
    """GPU 0 in MIG mode, the others not: names, attributes, memory, partitions, counters."""
    dump = dumps[machine]
    gpu_model = MODEL_OF[machine]
    fake = fake_machine(dump, {0})
    fake.nvmlShutdown()
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        inventory = await backend.inventory()
    by_name = inventory.by_name
    brands = {14: "NVIDIA"}
    architectures = {7: "Ampere", 9: "Hopper", 10: "Blackwell"}
    for index, device in enumerate(dump["devices"][1:], start=1):
        gpu = by_name[f"gpu-{index}"]
        major, minor = value(device["cudaComputeCapability"])
        assert gpu.uuid == value(device["uuid"])
        assert dict(gpu.capacity) == {
            "memory": model.format_bytes(value(device["memory"])["total"])
        }
        assert gpu.attributes["productName"] == model.StringValue(value(device["name"]))
        assert gpu.attributes["brand"] == model.StringValue(brands[value(device["brand"])])
        assert gpu.attributes["architecture"] == model.StringValue(
            architectures[value(device["architecture"])]
        )
        assert gpu.attributes["cudaComputeCapability"] == model.VersionValue(f"{major}.{minor}.0")
        driver = model.normalize_version(value(dump["driverVersion"]))  # "560.28.03"
        cuda = nvml.cuda_version(value(dump["cudaDriverVersion"]))
        assert gpu.attributes["driverVersion"] == model.VersionValue(driver)
        assert gpu.attributes["cudaDriverVersion"] == model.VersionValue(cuda)
        assert gpu.attributes["migCapable"] == model.BoolValue(True)
        assert gpu.attributes[model.PCI_BUS_ID_ATTRIBUTE] == model.StringValue(
            device["mockPciBusId"]
        )
        assert gpu.partition_of is None
        assert not gpu.consumes
    # GPU 0: one partition per placement NVML gives, memory as NVML reports it.
    parts = {d.name: d for d in inventory.devices if d.partition_of == "gpu-0"}
    expected: dict[str, tuple[str, dict[str, int]]] = {}
    for profile in gpu_model.profiles:
        table_profile = next(p for p in mig.table_of(gpu_model).profiles if p.name == profile.name)
        for start in profile.starts:
            placement = mig.Placement(table_profile, start)
            expected[mig.partition_name_of("gpu-0", placement)] = (
                model.format_bytes(profile.memory_mib * 2**20),
                placement.counters(),
            )
    assert sorted(parts) == sorted(expected)
    for name, (memory, counters) in expected.items():
        assert dict(parts[name].capacity) == {"memory": memory}, name
        assert dict(parts[name].consumes) == {"gpu-0-counters": counters}, name
        product = model.StringValue(value(dump["devices"][0]["name"]))
        assert parts[name].attributes["migModel"] == product
    (counter_set,) = inventory.counter_sets
    assert counter_set.name == "gpu-0-counters"
    assert {k: v for k, v in counter_set.counters.items() if k.startswith("memory-slice-")} == {
        mig.memory_slice_counter(i): 1 for i in range(mig.MEMORY_SLICES)
    }
    # The slices carry every device and the counter set.
    bodies = slices.build_slices(
        "node-01", "uid-1", "gpu.example.com", inventory.devices, 1,
        counter_sets=inventory.counter_sets,
    )  # fmt: skip
    published = [d["name"] for b in bodies for d in b["spec"].get("devices", [])]
    assert sorted(published) == sorted(d.name for d in inventory.devices if d.healthy)
    sets = [c["name"] for b in bodies for c in b["spec"].get("sharedCounters", [])]
    assert sets == ["gpu-0-counters"]


def test_the_fakes_profile_ids_are_nvmls_not_the_enum() -> None:
    """The defect the issue names: the fake answered the enum as ``info.id`` (0 for 1g.5gb)."""
    fake = FakeNvml([fake_pynvml.a100_in_mig_mode()])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    ids = {
        enum: fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum).id
        for enum in (0, 7, 9, 1, 2, 3, 4)
    }
    assert ids == {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0}
    assert pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE == 0


def test_placements_are_answered_out_of_mig_mode() -> None:
    """The defect the issue names: the fake refused placements unless MIG mode was on."""
    fake = FakeNvml([FakeGpu(mig_mode=0)])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    info = fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, 2)  # 3g.40gb
    found = (fake_pynvml.c_nvmlGpuInstancePlacement_t * 32)()
    count = ctypes.c_uint(0)
    fake.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, found, ctypes.byref(count))
    assert [(found[i].start, found[i].size) for i in range(count.value)] == [(0, 4), (4, 4)]
    # Creating needs MIG mode.
    where = fake_pynvml.c_nvmlGpuInstancePlacement_t()
    where.start, where.size = 0, 4
    code = _code(
        fake.nvmlDeviceCreateGpuInstanceWithPlacement, handle, info.id, ctypes.byref(where)
    )
    assert code == fake_pynvml.NVML_ERROR_NOT_SUPPORTED

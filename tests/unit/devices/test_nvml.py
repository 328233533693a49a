"""The NVML backend reads GPUs off the event loop, publishes API-valid values, and never hides
an NVML failure behind an empty inventory."""

import asyncio
import importlib
import inspect
import threading
import warnings
from pathlib import Path

import pytest

from dra_gpu.devices import edits, gpu_models, mig, model, nvml
from dra_gpu.devices.nvml import instances as nvml_instances
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeGpu, FakeNvml, a100_in_mig_mode


def _api(device: model.Device) -> dict[str, object]:
    return {k: v.to_api() for k, v in device.attributes.items()}


async def test_two_h100s_become_gpu_0_and_gpu_1_with_their_attributes() -> None:
    async with nvml.NvmlBackend("node-01", nvml=FakeNvml()) as backend:
        inventory = await backend.inventory()
    assert inventory.node == "node-01"
    gpu0, gpu1 = inventory.devices
    assert (gpu0.name, gpu1.name) == ("gpu-0", "gpu-1")
    assert gpu1.uuid == "GPU-5f2a1c3e-0001-4000-8000-000000000001"
    assert _api(gpu1) == {
        "index": {"int": 1},
        "uuid": {"string": "GPU-5f2a1c3e-0001-4000-8000-000000000001"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "NVIDIA"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "migCapable": {"bool": True},
        "resource.kubernetes.io/pciBusID": {"string": "0000:2a:00.0"},
    }
    # Exact, so compareTo(quantity("80Gi")) sees the real 81559 MiB and not a rounded value.
    assert dict(gpu0.capacity) == {"memory": "81559Mi"}
    assert gpu0.memory_bytes == 85520809984


@pytest.mark.parametrize(
    ("driver", "cuda", "capability", "expected"),
    [
        ("550.54.15", 12040, (9, 0), ("550.54.15", "12.4.0", "9.0.0")),
        ("535.104", 12020, (8, 0), ("535.104.0", "12.2.0", "8.0.0")),
        ("550.54.05", 11080, (7, 5), ("550.54.5", "11.8.0", "7.5.0")),
        (b"570.86.10\x00", 12080, (10, 0), ("570.86.10", "12.8.0", "10.0.0")),
    ],
)
async def test_nvml_versions_become_semver(
    driver: str, cuda: int, capability: tuple[int, int], expected: tuple[str, str, str]
) -> None:
    fake = FakeNvml([FakeGpu(compute_capability=capability)], cuda_driver_version=cuda)
    fake.driver_version = driver  # older pynvml releases hand back bytes
    (gpu,) = (await nvml.NvmlBackend("n", nvml=fake).inventory()).devices
    versions = tuple(
        gpu.attributes[k].value
        for k in ("driverVersion", "cudaDriverVersion", "cudaComputeCapability")
    )
    assert versions == expected


async def test_gpu_without_mig_support_is_not_mig_capable() -> None:
    fake = FakeNvml(
        [FakeGpu(mig_capable=False, brand=fake_pynvml.NVML_BRAND_TESLA, architecture=99)]
    )
    (gpu,) = (await nvml.NvmlBackend("n", nvml=fake).inventory()).devices
    assert gpu.attributes["migCapable"] == model.BoolValue(False)
    assert gpu.attributes["brand"] == model.StringValue("Tesla")
    assert gpu.attributes["architecture"] == model.StringValue("Unknown")


async def test_unsupported_optional_reads_leave_the_attribute_out_or_unknown() -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetArchitecture": fake_pynvml.NVML_ERROR_NOT_SUPPORTED})
    fake = FakeNvml(
        [gpu],
        errors={"nvmlSystemGetCudaDriverVersion_v2": fake_pynvml.NVML_ERROR_NOT_SUPPORTED},
    )
    (device,) = (await nvml.NvmlBackend("n", nvml=fake).inventory()).devices
    assert "cudaDriverVersion" not in device.attributes
    assert device.attributes["architecture"] == model.StringValue("Unknown")


async def test_nvml_error_names_the_call_and_gpu() -> None:
    gpus = fake_pynvml.two_h100s()
    gpus[1].errors["nvmlDeviceGetMemoryInfo"] = fake_pynvml.NVML_ERROR_GPU_IS_LOST
    backend = nvml.NvmlBackend("node-01", nvml=FakeNvml(gpus))
    with pytest.raises(model.InventoryError) as err:
        await backend.inventory()
    assert str(err.value) == "node node-01: GPU 1: NVML nvmlDeviceGetMemoryInfo failed: GPU is lost"
    assert isinstance(err.value.__cause__, fake_pynvml.NVMLError_GpuIsLost)


async def test_mig_mode_errors_other_than_not_supported_are_not_swallowed() -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetMigMode": fake_pynvml.NVML_ERROR_UNKNOWN})
    with pytest.raises(model.InventoryError, match="GPU 0: NVML nvmlDeviceGetMigMode failed"):
        await nvml.NvmlBackend("n", nvml=FakeNvml([gpu])).inventory()


async def test_failed_init_is_an_error_not_an_empty_inventory_and_is_retried() -> None:
    fake = FakeNvml(errors={"nvmlInit": fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    backend = nvml.NvmlBackend("node-01", nvml=fake)
    with pytest.raises(model.InventoryError) as err:
        await backend.inventory()
    assert str(err.value) == "node node-01: NVML nvmlInit failed: Driver Not Loaded"
    del fake.errors["nvmlInit"]
    assert len((await backend.inventory()).devices) == 2


async def test_unreadable_driver_version_names_the_gpu() -> None:
    fake = FakeNvml([FakeGpu()], driver_version="r550")
    with pytest.raises(model.InventoryError, match=r"node n: GPU 0: 'r550' cannot be read"):
        await nvml.NvmlBackend("n", nvml=fake).inventory()


async def test_nvml_runs_off_the_event_loop() -> None:
    fake = FakeNvml()
    async with nvml.NvmlBackend("n", nvml=fake) as backend:
        await backend.inventory()
    loop_thread = threading.get_ident()
    assert fake.call_threads  # the fake saw every call
    assert all(thread != loop_thread for _, thread in fake.call_threads)


async def test_nvml_is_initialised_once_and_shut_down_on_close() -> None:
    fake = FakeNvml()
    backend = nvml.NvmlBackend("n", nvml=fake)
    await asyncio.gather(backend.inventory(), backend.inventory(), backend.inventory())
    assert (fake.init_calls, fake.shutdown_calls) == (1, 0)
    await backend.aclose()
    await backend.aclose()  # a second close is harmless
    assert (fake.init_calls, fake.shutdown_calls, fake.initialised) == (1, 1, 0)


def test_pci_bus_ids_take_the_kernel_form() -> None:
    assert nvml.pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert nvml.pci_bus_id("0001:AF:1F.7") == "0001:af:1f.7"
    with pytest.raises(model.InventoryError, match="not of the form"):
        nvml.pci_bus_id("3b:00")


def test_cuda_driver_versions_decode_major_and_minor() -> None:
    assert [nvml.cuda_version(v) for v in (12040, 11080, 12100, 13000)] == [
        "12.4.0",
        "11.8.0",
        "12.10.0",
        "13.0.0",
    ]


def test_the_fake_matches_the_installed_pynvml() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the "pynvml" shim says to use nvidia-ml-py
        real = importlib.import_module("pynvml")  # nvidia-ml-py: a dependency of ours
    assert issubclass(real.NVMLError_NotSupported, real.NVMLError)
    assert isinstance(real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED), real.NVMLError_NotSupported)
    assert isinstance(
        fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_NOT_SUPPORTED),
        fake_pynvml.NVMLError_NotSupported,
    )
    for name in (
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_GPU_IS_LOST",
        "NVML_ERROR_TIMEOUT",
        "NVML_BRAND_TESLA",
        "nvmlEventTypeXidCriticalError",
        "nvmlEventTypeDoubleBitEccError",
        "NVML_ERROR_NOT_FOUND",
        "NVML_ERROR_INVALID_ARGUMENT",
        "NVML_ERROR_IN_USE",
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
        "NVML_ERROR_INSUFFICIENT_SIZE",
        "NVML_DEVICE_MIG_ENABLE",
        "NVML_GPU_INSTANCE_PROFILE_COUNT",
        "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED",
        "c_nvmlGpuInstancePlacement_t",
        "c_nvmlGpuInstance_t",
    ):
        assert getattr(real, name) == getattr(fake_pynvml, name), name
    # The fake's models ask for each profile by pynvml's enum (and answer NVML's own id).
    for profile, constant in (
        ("1g.5gb", "NVML_GPU_INSTANCE_PROFILE_1_SLICE"),
        ("1g.5gb+me", "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"),
        ("1g.10gb", "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"),
        ("2g.10gb", "NVML_GPU_INSTANCE_PROFILE_2_SLICE"),
        ("3g.20gb", "NVML_GPU_INSTANCE_PROFILE_3_SLICE"),
        ("4g.20gb", "NVML_GPU_INSTANCE_PROFILE_4_SLICE"),
        ("7g.40gb", "NVML_GPU_INSTANCE_PROFILE_7_SLICE"),
    ):
        (found,) = [p for p in gpu_models.A100_40GB.profiles if p.name == profile]
        assert found.enum == getattr(real, constant), profile
    assert (
        fake_pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT == real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
    )
    # The compute instance profile of each slice count, as the backend asks for it.
    for slices, constant in ((1, "1"), (2, "2"), (3, "3"), (4, "4"), (6, "6"), (7, "7"), (8, "8")):
        name = f"NVML_COMPUTE_INSTANCE_PROFILE_{constant}_SLICE"
        assert nvml_instances._COMPUTE_PROFILE_OF_SLICES[slices] == getattr(real, name), name
    # The ctypes structs' fields the backend reads.
    for struct, fields in (
        ("c_nvmlGpuInstanceProfileInfo_v2_t", {"id", "sliceCount", "instanceCount", "name"}),
        ("c_nvmlGpuInstanceInfo_t", {"id", "profileId", "placement"}),
        ("c_nvmlComputeInstanceInfo_t", {"id", "profileId"}),
        ("c_nvmlComputeInstanceProfileInfo_v2_t", {"id", "sliceCount"}),
        ("c_nvmlGpuInstancePlacement_t", {"start", "size"}),
    ):
        assert fields <= {f[0] for f in getattr(real, struct)._fields_}, struct
    for name, fake_fn in inspect.getmembers(FakeNvml(), inspect.ismethod):
        if not name.startswith("nvml"):
            continue
        real_params = list(inspect.signature(getattr(real, name)).parameters)
        assert list(inspect.signature(fake_fn).parameters) == real_params, name
    used = [n for n in dir(nvml.NvmlApi) if n.startswith(("nvml", "NVML", "c_nvml"))]
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in used
    assert "nvmlEventSetWait_v2" in used
    assert "nvmlDeviceRegisterEvents" in used
    assert all(hasattr(real, n) and hasattr(FakeNvml, n) for n in used)
    # The event data's fields, as the backend reads them from pynvml's ctypes struct.
    real_fields = [f[0] for f in real.c_nvmlEventData_t._fields_]
    assert real_fields == list(fake_pynvml._EventData.__dataclass_fields__)


async def test_a_container_sees_its_gpu_through_nvidia_visible_devices(tmp_path: Path) -> None:
    async with nvml.NvmlBackend("node-01", nvml=FakeNvml(), driver_root=tmp_path) as backend:
        gpu = (await backend.inventory()).devices[1]
        claim = await backend.container_edits([edits.GivenDevice(gpu)])
        assert dict(claim.common.env) == {"NVIDIA_VISIBLE_DEVICES": gpu.uuid}


async def test_a_gpu_in_mig_mode_publishes_the_placements_nvml_reports() -> None:
    fake = FakeNvml(
        [
            a100_in_mig_mode(),
            FakeGpu(uuid="GPU-1", mig_mode=0),  # MIG-capable, MIG mode off: whole only
        ]
    )
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        inventory = await backend.inventory()
    by_name = inventory.by_name
    parts = [d for d in inventory.devices if d.partition_of == "gpu-0"]
    # Every placement of NVIDIA's table, named as the simulated backend names them.
    assert sorted(d.name for d in parts) == sorted(
        mig.partition_name_of("gpu-0", p) for p in mig.placements(mig.A100_40GB)
    )
    part = by_name["gpu-0-mig-3g-20gb-4"]
    assert dict(part.capacity) == {"memory": "19968Mi"}  # as NVML reports it, not the name
    assert part.attributes["profile"] == model.StringValue("3g.20gb")
    assert part.attributes["placementStart"] == model.IntValue(4)
    assert dict(part.consumes) == {
        "gpu-0-counters": {
            "memory-slice-4": 1,
            "memory-slice-5": 1,
            "memory-slice-6": 1,
            "memory-slice-7": 1,
            "compute-slices": 3,
        }
    }
    assert by_name["gpu-0-mig-1g-5gb-me-3"].consumes["gpu-0-counters"]["media-extensions"] == 1
    assert [c.name for c in inventory.counter_sets] == ["gpu-0-counters"]
    assert by_name["gpu-1"].partition_of is None
    assert not by_name["gpu-1"].consumes
    assert [d.name for d in inventory.devices if d.partition_of == "gpu-1"] == []


async def test_mig_instances_are_made_and_unmade_through_nvml() -> None:
    fake = FakeNvml([FakeGpu(mig_mode=1, mig_table=mig.H100_80GB)])
    async with nvml.NvmlBackend("node-01", nvml=fake) as backend:
        placement = model.MigPlacement("gpu-0", "3g.40gb", 0)
        created = await backend.create_mig_instance(placement)
        assert created == model.MigInstance(placement, 1, 0, fake.mig_uuids(0)[0])
        # Asked again (a retried prepare): the same one, not a second.
        assert await backend.create_mig_instance(placement) == created
        assert await backend.mig_instances() == (created,)
        # The hardware's refusal names the GPU and the call.
        with pytest.raises(
            model.InventoryError,
            match=r"GPU 0: NVML nvmlDeviceCreateGpuInstance"
            r"WithPlacement failed: Insufficient Resources",
        ):
            await backend.create_mig_instance(model.MigPlacement("gpu-0", "4g.40gb", 0))
        await backend.destroy_mig_instance(created)
        assert await backend.mig_instances() == ()
        assert fake.instances[0] == []
        await backend.destroy_mig_instance(created)  # gone already: not an error

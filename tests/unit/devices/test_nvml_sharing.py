"""NVML GPUs shared by the agent's ``--shared-gpus`` setting: the GPUs it names get the very
``sharing`` a simulated GPU's profile block gives, checked against the memory NVML reports;
every mistake names the setting and the field; a GPU in MIG mode stays partitioned; and a
prepared share reaches the container as ``NVIDIA_VISIBLE_DEVICES`` plus the share variables."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.agent.state import DeviceState, Prepared
from dra_gpu.devices import model, nvml, sharing, simulated
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeNvml
from tests.unit.agent.test_share_prepare import SHARE_A, Api, Sink, container_env

SOURCE = "--shared-gpus / DRA_GPU_SHARED_GPUS"
UUID_0, UUID_1 = (gpu.uuid for gpu in fake_pynvml.two_h100s())
POLICY = "{default: 8Gi, min: 4Gi, step: 4Gi}"


def backend(setting: str, fake: FakeNvml | None = None) -> nvml.NvmlBackend:
    shared = sharing.parse_shared_gpus(setting, source=SOURCE)
    return nvml.NvmlBackend("node-01", nvml=fake or FakeNvml(), shared_gpus=shared)


async def shared_devices(setting: str, fake: FakeNvml | None = None) -> dict[str, str | None]:
    async with backend(setting, fake) as gpus:
        inventory = await gpus.inventory()
    return {d.name: d.sharing.mode if d.sharing else None for d in inventory.devices}


async def test_the_named_gpu_is_shared_as_a_simulated_gpu_with_that_block_is() -> None:
    async with backend(f"[{{gpus: [1], mode: MPS, memory: {POLICY}}}]") as gpus:
        gpu0, gpu1 = (await gpus.inventory()).devices
    profile = simulated.parse_profile(
        "nodes: {n: {devices: [{memory: 81559Mi, "
        f"sharing: {{mode: MPS, memory: {POLICY}}}}}]}}}}"
    )
    (simulated_gpu,) = profile.inventory("n").devices
    assert gpu0.sharing is None
    assert gpu1.sharing == simulated_gpu.sharing
    assert gpu1.sharing == model.Sharing("MPS", model.MemoryPolicy("8Gi", "4Gi", step="4Gi"))


@pytest.mark.parametrize(
    ("setting", "shared"),
    [
        (f"{{gpus: all, memory: {POLICY}}}", {"gpu-0": "TimeSlicing", "gpu-1": "TimeSlicing"}),
        (f'{{gpus: ["{UUID_0}"], memory: {POLICY}}}', {"gpu-0": "TimeSlicing", "gpu-1": None}),
        (
            f"[{{gpus: [0], mode: MPS, memory: {POLICY}}}, "
            f'{{gpus: ["{UUID_1}"], memory: {POLICY}}}]',
            {"gpu-0": "MPS", "gpu-1": "TimeSlicing"},
        ),
        ("", {"gpu-0": None, "gpu-1": None}),
        ("[]", {"gpu-0": None, "gpu-1": None}),
    ],
)
async def test_gpus_are_named_by_index_or_uuid_or_all(
    setting: str, shared: dict[str, str | None]
) -> None:
    assert await shared_devices(setting) == shared


async def test_a_policy_that_does_not_fit_the_gpus_memory_names_gpu_setting_and_field() -> None:
    with pytest.raises(model.InventoryError) as raised:
        await shared_devices(
            f"[{{gpus: [0], memory: {POLICY}}}, "
            "{gpus: [1], memory: {default: 96Gi, min: 96Gi}}]"
        )
    assert str(raised.value) == (
        f"node node-01: GPU 1: {SOURCE}: [1].memory.min: 96Gi is more than the memory (81559Mi)"
    )


async def test_a_gpu_named_by_its_index_and_by_its_uuid_is_an_error_naming_both_entries() -> None:
    setting = f'[{{gpus: [1], memory: {POLICY}}}, {{gpus: ["{UUID_1}"], memory: {POLICY}}}]'
    with pytest.raises(model.InventoryError) as raised:
        await shared_devices(setting)
    assert str(raised.value) == (
        f"node node-01: GPU 1: {SOURCE}: [1].gpus: GPU 1 ({UUID_1}) is already shared by [0]; "
        "name each GPU once"
    )


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ("{gpus: all}", "memory: required (default and min at least)"),
        (
            "{memory: {default: 8Gi, min: 4Gi}}",
            'gpus: required: all, or a list of indexes and "GPU-" UUIDs',
        ),
        (
            f"{{gpus: [], memory: {POLICY}}}",
            "gpus: expected all or a non-empty list of GPUs, got a list",
        ),
        (
            f"{{gpus: [gpu-0], memory: {POLICY}}}",
            "gpus[0]: 'gpu-0' is neither an NVML index (0, 1, ...) nor a UUID (\"GPU-...\")",
        ),
        (
            f"{{gpus: [true], memory: {POLICY}}}",
            'gpus[0]: True is neither an NVML index (0, 1, ...) nor a UUID ("GPU-...")',
        ),
        (
            f"[{{gpus: [0], memory: {POLICY}}}, {{gpus: [1, 0], memory: {POLICY}}}]",
            "[1].gpus[1]: GPU 0 is already named at [0].gpus[0]",
        ),
        (
            f"[{{gpus: all, memory: {POLICY}}}, {{gpus: [1], memory: {POLICY}}}]",
            "[0].gpus: all leaves no GPU for the other entries; list the GPUs of each",
        ),
        (
            f"{{gpus: all, mode: Exclusive, memory: {POLICY}}}",
            "mode: 'Exclusive' is not one of TimeSlicing, MPS",
        ),
        (
            f"{{gpus: all, memory: {POLICY}, share: 2}}",
            "share: unknown field (known: activeThreadPercentage, gpus, memory, mode, timeSlice)",
        ),
        (
            "{gpus: all, memory: {default: 8Gi, min: 4Gi, limit: 1Gi}}",
            "memory.limit: unknown field (known: default, max, min, step)",
        ),
        (
            "{gpus: all, memory: {default: 8Gi, min: -4Gi}}",
            "memory.min: '-4Gi' must be more than zero",
        ),
        (
            "[{gpus: all, memory: {default: 10Gi, min: 4Gi, step: 4Gi}}]",
            "[0].memory.default: 10Gi is not min 4Gi plus a whole number of steps of 4Gi",
        ),
        (
            "{gpus: all, memory: {default: 2Gi, min: 4Gi}}",
            "memory.default: 2Gi is less than min 4Gi",
        ),
        ("gpus: all\ngpus: [0]", "line 2, column 1: duplicate key 'gpus'"),
        ("7", "expected a list of entries, got a number"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_setting_and_the_field(
    setting: str, error: str
) -> None:
    with pytest.raises(model.InventoryError) as raised:
        sharing.parse_shared_gpus(setting, source=SOURCE)
    assert str(raised.value) == f"{SOURCE}: {error}"


async def test_a_named_gpu_in_mig_mode_stays_partitioned_and_the_skip_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpus = fake_pynvml.two_h100s()
    gpus[0].mig_mode = fake_pynvml.NVML_DEVICE_MIG_ENABLE
    shared = backend(f"{{gpus: all, mode: MPS, memory: {POLICY}}}", FakeNvml(gpus))
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        first = await shared.inventory()
        second = await shared.inventory()
    await shared.aclose()
    assert first == second
    by_name = first.by_name
    assert "gpu-0" not in by_name  # published MIG-partitioned: its partitions, not shared
    assert any(d.partition_of == "gpu-0" for d in first.devices)
    assert by_name["gpu-1"].sharing is not None
    assert [r.getMessage() for r in caplog.records] == [
        "node node-01: GPU 0 is in MIG mode, so it is published MIG-partitioned and not shared, "
        f"although {SOURCE} names it (gpus)"
    ]


async def test_names_this_node_does_not_have_are_passed_over_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    setting = f'{{gpus: [1, 5, "GPU-elsewhere"], memory: {POLICY}}}'
    shared = backend(setting)
    with caplog.at_level(logging.INFO, logger=nvml.__name__):
        await shared.inventory()
        inventory = await shared.inventory()
    await shared.aclose()
    assert [d.sharing is not None for d in inventory.devices] == [False, True]
    assert [r.getMessage() for r in caplog.records] == [
        f"node node-01: {SOURCE}: gpus: GPU 5 is not on this node: passed over",
        f"node node-01: {SOURCE}: gpus: GPU-elsewhere is not on this node: passed over",
    ]


@pytest.mark.parametrize(
    ("mode", "mps"),
    [("MPS", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M"}), ("TimeSlicing", {})],
)
async def test_a_prepared_share_of_an_nvml_gpu_names_its_uuid_and_the_share(
    tmp_path: Path, mode: str, mps: dict[str, str]
) -> None:
    gpus = backend(f"{{gpus: [0], mode: {mode}, memory: {POLICY}}}")

    async def inventory(fresh: bool) -> Any:
        return await gpus.inventory()

    api = Api()
    state = DeviceState(
        api=api,  # type: ignore[arg-type]  # prepare only GETs claims
        driver="gpu.example.com",
        node="node-01",
        container_edits=gpus.container_edits,
        cdi_dir=tmp_path / "cdi",
        checkpoint_file=tmp_path / "checkpoint.json",
        inventory=inventory,
        status=Sink(),
    )
    answer = await state.prepare(api.add("a", (SHARE_A, "12Gi")))
    await gpus.aclose()

    assert isinstance(answer, Prepared)
    assert container_env(tmp_path, "uid-a") == {
        "NVIDIA_VISIBLE_DEVICES": UUID_0,
        "DRA_GPU_SHARING_STRATEGY": mode,
        "DRA_GPU_MEMORY_LIMIT": "12Gi",
        "DRA_GPU_SHARE_ID": SHARE_A,
        **mps,
    }

"""Fake NVML machines for ``hack/gpu-check --nvml-module tests.unit.commands.gpu_check_fakes:...``.

``machine()``: an A100 40GB in MIG mode (gpu-0) with one MIG instance someone else made (a
1g.5gb at start 0, as the GPU Operator's mig-manager would leave it), then two H100s (gpu-1,
gpu-2), from ``inventory/fake_pynvml.py``. ``unprivileged()``: the same machine, the caller
not privileged. ``no_driver()``: NVML that does not initialise.

The script runs in a subprocess, so the fake writes what happened to it when that process ends,
to the file ``$GPU_CHECK_FAKE_LOG`` names: every NVML call it received (its own record, not the
script's), and its MIG instances and compute modes then. The test compares them with what was
there before.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
from typing import Any

from tests.support import fake_pynvml as fake

A100_UUID = "GPU-a1000000-0000-4000-8000-000000000000"
H100_UUIDS = (
    "GPU-5f2a1c3e-0000-4000-8000-000000000000",
    "GPU-5f2a1c3e-0001-4000-8000-000000000001",
)
BUS_IDS = ("0000:07:00.0", "0000:18:00.0", "0000:2a:00.0")
LOG_ENV = "GPU_CHECK_FAKE_LOG"


class RecordingNvml(fake.FakeNvml):
    """The fake, with the one system call gpu-check reads that the backend does not."""

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return f"12.{self.driver_version}"  # NVML's form: "12.550.54.15"

    def snapshot(self) -> dict[str, Any]:
        return {
            "calls": [name for name, _ in self.call_threads],
            "instances": {
                str(index): [
                    {
                        "id": g.id,
                        "profile": g.placement.profile.name,
                        "start": g.placement.start,
                        "computes": [c.uuid for c in g.computes],
                    }
                    for g in instances
                ]
                for index, instances in self.instances.items()
            },
            "compute_modes": {str(k): v for k, v in self.compute_modes.items()},
            "initialised": self.initialised,
        }


def machine() -> RecordingNvml:
    gpus = [
        fake.a100_in_mig_mode(
            uuid=A100_UUID,
            bus_id=b"00000000:07:00.0",
            architecture=fake.NVML_DEVICE_ARCH_AMPERE,
            compute_capability=(8, 0),
        ),
        *fake.two_h100s(),
    ]
    nvml = RecordingNvml(gpus)
    _make_instance(nvml, 0, "1g.5gb", 0)
    before = nvml.snapshot()
    nvml.call_threads.clear()
    _log_at_exit(nvml, before)
    return nvml


def unprivileged() -> RecordingNvml:
    """``machine()`` run by a user NVML refuses MIG's privileged calls (NO_PERMISSION)."""
    nvml = machine()
    nvml.privileged = False
    return nvml


def no_driver() -> RecordingNvml:
    nvml = RecordingNvml(errors={"nvmlInit": fake.NVML_ERROR_DRIVER_NOT_LOADED})
    _log_at_exit(nvml, nvml.snapshot())
    return nvml


def _make_instance(nvml: RecordingNvml, index: int, profile_name: str, start: int) -> None:
    """A GPU and compute instance made through the fake's NVML calls, as nvidia-smi would."""
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    for enum in range(fake.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except fake.NVMLError:
            continue
        name = info.name.decode() if isinstance(info.name, bytes) else info.name
        if name == f"MIG {profile_name}":
            break
    else:
        raise AssertionError(f"no MIG profile {profile_name}")
    where = fake.c_nvmlGpuInstancePlacement_t()
    where.start = start
    profile = next(p for p in nvml.gpus[index].mig_table.profiles if p.name == profile_name)
    where.size = profile.memory_slices
    gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, info.id, ctypes.byref(where)
    )
    compute = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gpu_instance, 0, fake.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, compute.id)
    nvml.nvmlShutdown()


def _log_at_exit(nvml: RecordingNvml, before: dict[str, Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return

    def write() -> None:
        with open(path, "w") as out:
            json.dump({"before": before, "after": nvml.snapshot()}, out)

    atexit.register(write)

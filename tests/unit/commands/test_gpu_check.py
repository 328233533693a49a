"""``hack/gpu-check``, run as a user runs it (a subprocess), against the fake pynvml.

The machine (``gpu_check_fakes.machine``): an A100 in MIG mode with a MIG instance someone else
made, and two H100s; a driver root with their device nodes and MIG capability files, a sysfs
with their PCIe roots. The report must have every section, the 2-GPU claim's spec must give both
GPUs, and the fake's own record must show that the script changed nothing: no mutating NVML
call reached it, its MIG instances and compute modes are as before.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from tests.support import fake_pynvml
from tests.unit.commands import gpu_check_fakes as fakes

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "gpu-check"
NODE = "node-01"
CAPS_MAJOR = 237


def driver_root(root: Path) -> Path:
    """/dev and /proc as a host with the three GPUs has them (minors 0..2, as NVML numbers
    them); no /dev/nvidia-uvm-tools, and one of the two MIG capability nodes."""
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in (
        "nvidia0",
        "nvidia1",
        "nvidia2",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-caps/nvidia-cap12",
    ):
        (dev / name).write_text("")
    proc = root / "proc"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    )
    (proc / "devices").write_text(
        f"Character devices:\n  1 mem\n195 nvidia-frontend\n{CAPS_MAJOR} nvidia-caps\n\n"
        "Block devices:\n  8 sd\n"
    )
    gi = proc / "driver/nvidia/capabilities/gpu0/mig/gi1"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 12\nDeviceFileMode: 292\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 13\nDeviceFileMode: 292\n")
    return root


def sysfs(root: Path) -> Path:
    """The three GPUs under PCIe roots pci0000:00 (the A100) and pci0000:17 (the H100s)."""
    for bus_id, parent, numa in zip(
        fakes.BUS_IDS, ("pci0000:00", "pci0000:17", "pci0000:17"), (0, 0, 1), strict=True
    ):
        device = root / "devices" / parent / "0000:00:01.0" / bus_id
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
        links = root / "bus/pci/devices"
        links.mkdir(parents=True, exist_ok=True)
        (links / bus_id).symlink_to(f"../../../devices/{parent}/0000:00:01.0/{bus_id}")
    return root


def run_check(
    tmp: Path, factory: str, *extra: str, argv0: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    log = tmp / "fake-log.json"
    venv = tmp / "venv"  # what the script's shebang runs: this interpreter, with its packages
    python = venv / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        fakes.LOG_ENV: str(log),
        "VIRTUAL_ENV": str(venv),
    }
    command = [*(argv0 if argv0 is not None else [sys.executable, str(SCRIPT)])]
    done = subprocess.run(
        [
            *command,
            "--nvml-module",
            f"tests.unit.commands.gpu_check_fakes:{factory}",
            "--node",
            NODE,
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, json.loads(log.read_text())


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpu-check")
    out = tmp / "report.json"
    done, fake_log = run_check(
        tmp,
        "machine",
        "--driver-root",
        str(driver_root(tmp / "root")),
        "--sysfs",
        str(sysfs(tmp / "sys")),
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert json.loads(out.read_text()) == report
    return {"report": report, "fake": fake_log, "stderr": done.stderr}


def test_the_report_has_every_section_and_none_failed(checked: dict[str, Any]) -> None:
    report = checked["report"]
    for section in ("host", "nvml", "inventory", "slices", "cdi", "health", "mig"):
        assert section in report
        assert not (isinstance(report[section], dict) and "error" in report[section]), section
    assert report["host"]["proc_driver_version"].startswith("NVRM version:")
    assert "dev/nvidia0" in report["host"]["dev_nodes"]
    assert report["nvml"] == {
        "initialised": True,
        "driver_version": "550.54.15",
        "nvml_version": "12.550.54.15",
        "cuda_driver_version": "12.4.0",
        "device_count": 3,
    }
    assert report["nvml_calls_refused"] == []
    assert "Traceback" not in checked["stderr"]


def test_the_inventory_and_slices_are_the_backends(checked: dict[str, Any]) -> None:
    report = checked["report"]
    devices = {d["name"]: d for d in report["inventory"]["devices"]}
    assert [devices["gpu-1"]["uuid"], devices["gpu-2"]["uuid"]] == list(fakes.H100_UUIDS)
    attributes = devices["gpu-2"]["attributes"]
    assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:17"}
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": 1}
    partitions = [d for d in devices.values() if d["partition_of"] == "gpu-0"]
    assert partitions, "the MIG-mode A100 publishes its partitions"
    # The instance someone else made at 1g.5gb start 0: that placement is not offered.
    assert not any(
        d["attributes"]["profile"] == {"string": "1g.5gb"}
        and d["attributes"]["placementStart"] == {"int": 0}
        for d in partitions
    )
    assert report["inventory"]["counter_sets"]
    published = [d["name"] for s in report["slices"] for d in s["spec"].get("devices", [])]
    assert sorted(published) == sorted(devices)
    assert {s["spec"]["nodeName"] for s in report["slices"]} == {NODE}


def spec_nodes(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["path"]: n for n in claim["device_nodes"]}


def test_a_2_gpu_claim_spec_gives_both_gpus(checked: dict[str, Any]) -> None:
    claim = checked["report"]["cdi"]["claim_of_2_gpus"]
    assert claim["devices"] == ["gpu-1", "gpu-2"]
    env = claim["spec"]["containerEdits"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(fakes.H100_UUIDS)}" in env
    assert claim["visible_devices"] == list(fakes.H100_UUIDS)
    nodes = spec_nodes(claim)
    assert {"/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"} == set(nodes)
    assert all(n["exists"] for n in nodes.values())
    per_device = [
        [n["path"] for n in d["containerEdits"].get("deviceNodes", [])]
        for d in claim["spec"]["devices"]
    ]
    assert per_device == [["/dev/nvidia1"], ["/dev/nvidia2"]]
    assert claim["control_nodes_left_out"] == ["/dev/nvidia-uvm-tools"]
    assert len(claim["cdi_device_ids"]) == 2


def test_a_1_gpu_claim_spec_gives_one(checked: dict[str, Any]) -> None:
    claim = checked["report"]["cdi"]["claim_of_1_gpu"]
    assert claim["visible_devices"] == [fakes.H100_UUIDS[0]]
    assert set(spec_nodes(claim)) == {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}


def test_health_registration_is_reported_per_gpu(checked: dict[str, Any]) -> None:
    health = checked["report"]["health"]
    for gpu in ("gpu-0", "gpu-1", "gpu-2"):
        assert health["gpus"][gpu]["registration"] == "ok"
        assert health["gpus"][gpu]["registered"] == ["DoubleBitEccError", "XidCriticalError"]
    assert "no event within" in health["gpus"]["wait"]
    assert health["backend_monitored"] == {
        "gpus": {"gpu-0": True, "gpu-1": True, "gpu-2": True},
        "complete": True,
    }
    assert health["backend_faults"] == []


def test_mig_modes_placements_and_instances_are_read(checked: dict[str, Any]) -> None:
    mig = checked["report"]["mig"]
    a100, h100 = mig["gpus"]["gpu-0"], mig["gpus"]["gpu-1"]
    assert a100["mode"] == {"current": "enabled", "pending": "enabled"}
    assert h100["mode"] == {"current": "disabled", "pending": "disabled"}
    by_name = {p["name"]: p for p in a100["profiles"]}
    assert by_name["MIG 1g.5gb"]["id"] == 19  # NVML's id, not the enum's 0
    assert [p["start"] for p in by_name["MIG 1g.5gb"]["placements"]] == list(range(7))
    assert [p["start"] for p in by_name["MIG 7g.40gb"]["placements"]] == [0]
    # Placements are answered whether or not MIG mode is on (nvml.h).
    assert any(p["placements"] for p in h100["profiles"])
    [instance] = mig["instances"]
    before = checked["fake"]["before"]["instances"]["0"]
    assert instance["uuid"] == before[0]["computes"][0]
    assert (instance["profile"], instance["start"]) == ("1g.5gb", 0)
    caps = {n["path"]: n for n in instance["capability_nodes"]}
    assert caps["/dev/nvidia-caps/nvidia-cap12"]["exists"] is True
    assert caps["/dev/nvidia-caps/nvidia-cap12"]["spec"]["major"] == CAPS_MAJOR
    assert caps["/dev/nvidia-caps/nvidia-cap13"]["exists"] is False


MUTATING = (
    "Set",
    "Create",
    "Destroy",
    "Reset",
    "Clear",
)


def test_the_check_changed_nothing_on_the_gpus(checked: dict[str, Any]) -> None:
    fake, report = checked["fake"], checked["report"]
    calls = fake["after"]["calls"]
    assert calls, "the fake's record is empty: it was not the NVML used"
    mutating = [
        c
        for c in calls
        if c not in {"nvmlEventSetCreate", "nvmlEventSetFree", "nvmlEventSetWait_v2"}
        and any(word in c for word in MUTATING)
    ]
    assert mutating == []
    assert fake["after"]["instances"] == fake["before"]["instances"]
    assert fake["after"]["compute_modes"] == {}
    assert fake["after"]["initialised"] == 0, "every nvmlInit has its nvmlShutdown"
    assert dict(collections.Counter(calls)) == report["nvml_calls"]


def test_an_unprivileged_caller_gets_a_report_with_the_refusals(tmp_path: Path) -> None:
    done, fake_log = run_check(
        tmp_path,
        "unprivileged",
        "--driver-root",
        str(driver_root(tmp_path / "root")),
        "--sysfs",
        str(sysfs(tmp_path / "sys")),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    names = [d["name"] for d in report["inventory"]["devices"]]
    assert {"gpu-1", "gpu-2"} <= set(names)
    assert any("gpu-0" in r for r in report["inventory"]["mig_refusals"])
    placements = [p["placements"] for p in report["mig"]["gpus"]["gpu-0"]["profiles"]]
    assert placements
    assert all("Insufficient Permissions" in p["error"] for p in placements)
    assert report["cdi"]["claim_of_2_gpus"]["visible_devices"] == list(fakes.H100_UUIDS)
    assert fake_log["after"]["instances"] == fake_log["before"]["instances"]


def test_without_nvml_it_says_why_and_exits_1(tmp_path: Path) -> None:
    # Run by its shebang, as a user on the GPU machine runs it.
    done, _ = run_check(tmp_path, "no_driver", argv0=[str(SCRIPT)])
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["nvml"]["initialised"] is False
    assert "Driver Not Loaded" in report["nvml"]["error"]
    assert "kernel" in report["host"]


def load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "hack" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceSetMigMode",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceDestroy",
        "nvmlComputeInstanceDestroy",
        "nvmlDeviceSetComputeMode",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceClearEccErrorCounts",
        "nvmlDeviceSetPersistenceMode",
    ],
)
def test_the_guard_refuses_a_call_that_changes_a_gpu(call: str) -> None:
    # The real module: the guard refuses before anything is called (nothing is initialised).
    gpu_check = load_gpu_check()
    guard = gpu_check.ReadOnlyNvml(pynvml)
    with pytest.raises(gpu_check.MutatingCall, match=call):
        getattr(guard, call)
    assert guard.refused == [call]
    assert guard.calls == {}


def test_the_guard_lets_through_only_reads_of_the_real_pynvml() -> None:
    gpu_check = load_gpu_check()
    functions = [n for n in dir(pynvml) if n.startswith("nvml") and callable(getattr(pynvml, n))]
    allowed = [n for n in functions if gpu_check.is_read_only(n)]
    assert "nvmlDeviceGetGpuInstancePossiblePlacements" in allowed
    assert "nvmlDeviceRegisterEvents" in allowed
    for name in allowed:
        before_get = name.removeprefix("nvml").split("Get", 1)[0]
        assert "Get" in name or name in gpu_check._ALSO_ALLOWED, name
        assert not any(w in before_get for w in ("Set", "Create", "Destroy", "Reset")) or (
            name in gpu_check._ALSO_ALLOWED
        ), name
    guard = gpu_check.ReadOnlyNvml(fake_pynvml.FakeNvml())
    guard.nvmlInit()
    assert guard.nvmlDeviceGetCount() == 2
    assert guard.calls == {"nvmlInit": 1, "nvmlDeviceGetCount": 1}

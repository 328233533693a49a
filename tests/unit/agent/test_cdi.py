"""CDI names and per-claim spec files: the IDs we return resolve in the specs we write."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from dra_gpu.agent import cdi, files
from dra_gpu.devices import edits

DRIVER = "gpu.example.com"
UID = "6f1d3e0a-93c4-4c1e-a2b5-0d8c2f5e7a11"


@pytest.fixture
def strict_umask() -> Iterator[None]:
    """A umask that would make files 0600 unless the writer sets the mode itself."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def test_names_follow_the_cdi_conventions() -> None:
    assert cdi.cdi_vendor(DRIVER) == "k8s.gpu.example.com"
    assert cdi.cdi_kind(DRIVER) == "k8s.gpu.example.com/gpu"
    assert cdi.cdi_device_name(UID, "gpu-0") == f"{UID}-gpu-0"
    assert cdi.cdi_device_id(DRIVER, UID, "gpu-0") == f"k8s.gpu.example.com/gpu={UID}-gpu-0"
    assert cdi.spec_file_name(DRIVER, UID) == f"k8s.gpu.example.com-gpu_{UID}.json"


def test_device_ids_resolve_to_names_in_the_written_spec(tmp_path: Path) -> None:
    devices = [("gpu-0", {"GPU_DEVICE_0": "gpu-0"}), ("gpu-1", {"GPU_DEVICE_1": "gpu-1"})]
    path = cdi.write_claim_spec(tmp_path, cdi.claim_spec(DRIVER, UID, devices), claim_uid=UID)

    on_disk = json.loads(path.read_text())
    assert path.name == cdi.spec_file_name(DRIVER, UID)
    for device, _ in devices:
        # What a runtime does with an ID: split "<vendor>/<class>=<name>", find kind, then name.
        kind, _, name = cdi.cdi_device_id(DRIVER, UID, device).partition("=")
        assert on_disk["kind"] == kind
        assert name in [d["name"] for d in on_disk["devices"]]
    env = {d["name"]: d["containerEdits"]["env"] for d in on_disk["devices"]}
    assert env == {f"{UID}-gpu-0": ["GPU_DEVICE_0=gpu-0"], f"{UID}-gpu-1": ["GPU_DEVICE_1=gpu-1"]}


def test_device_names_are_unique_per_claim() -> None:
    other_uid = "0b7e2c55-1d2f-4a8e-9c3b-5e6f7a8b9c0d"
    assert cdi.cdi_device_name(UID, "gpu-0") != cdi.cdi_device_name(other_uid, "gpu-0")
    assert cdi.cdi_device_id(DRIVER, UID, "gpu-0") != cdi.cdi_device_id(DRIVER, UID, "gpu-1")
    with pytest.raises(ValueError, match="'gpu-0' is listed twice"):
        cdi.claim_spec(DRIVER, UID, [("gpu-0", {"A": "1"}), ("gpu-0", {"A": "1"})])


@pytest.mark.parametrize(
    ("claim_uid", "version"),
    [
        ("6f1d3e0a-93c4-4c1e-a2b5-0d8c2f5e7a11", "0.5.0"),  # digit first: needs 0.5.0
        ("af1d3e0a-93c4-4c1e-a2b5-0d8c2f5e7a11", "0.3.0"),
    ],
)
def test_cdi_version_is_the_lowest_the_names_need(claim_uid: str, version: str) -> None:
    assert (
        cdi.claim_spec(DRIVER, claim_uid, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])["cdiVersion"]
        == version
    )


def test_each_device_gets_the_environment_it_was_given() -> None:
    spec = cdi.claim_spec(DRIVER, UID, [("gpu-0", {"NVIDIA_VISIBLE_DEVICES": "GPU-8a3f"})])
    assert spec["devices"][0]["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-8a3f"]}


@pytest.mark.parametrize("claim_uid", ["../escape", "a/b", "", ".hidden", "uid-"])
def test_claim_uids_that_are_no_cdi_names_are_rejected(tmp_path: Path, claim_uid: str) -> None:
    with pytest.raises(cdi.InvalidCdiName):
        cdi.spec_file_name(DRIVER, claim_uid)
    with pytest.raises(cdi.InvalidCdiName):
        cdi.claim_spec(DRIVER, claim_uid, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    with pytest.raises(cdi.InvalidCdiName):
        cdi.delete_claim_spec(tmp_path / "cdi", DRIVER, claim_uid)


def test_bad_inputs_to_a_spec_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        cdi.claim_spec(DRIVER, UID, [])
    with pytest.raises(ValueError, match="not an environment name"):
        cdi.claim_spec(DRIVER, UID, [("gpu-0", {"A=B": "c"})])
    with pytest.raises(cdi.InvalidCdiName):
        cdi.cdi_kind("bad/driver")


def test_a_spec_cannot_be_filed_under_another_claim(tmp_path: Path) -> None:
    spec = cdi.claim_spec(DRIVER, UID, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    with pytest.raises(ValueError, match="belong to another claim"):
        cdi.write_claim_spec(tmp_path, spec, claim_uid="another-uid")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("durable", [True, False], ids=["fsynced", "not-fsynced"])
def test_write_is_atomic_no_temp_files_left(
    tmp_path: Path, strict_umask: None, durable: bool
) -> None:
    cdi_dir = tmp_path / "cdi"  # created on demand
    first = cdi.claim_spec(DRIVER, UID, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    second = cdi.claim_spec(DRIVER, UID, [("gpu-1", {"GPU_DEVICE_1": "gpu-1"})])
    cdi.write_claim_spec(cdi_dir, first, claim_uid=UID, durable=durable)
    path = cdi.write_claim_spec(cdi_dir, second, claim_uid=UID, durable=durable)

    assert [p.name for p in cdi_dir.iterdir()] == [path.name]
    assert json.loads(path.read_text()) == second
    assert path.read_bytes() == cdi.spec_bytes(second)
    # Runtimes run as root but need not: the spec is world-readable whatever the umask.
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    files.atomic_write(path, b"old")
    with pytest.raises(TypeError):
        files.atomic_write(path, cast(bytes, "not bytes"))  # fails after the temp file exists
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_atomic_write_into_a_missing_directory_says_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as raised:
        files.atomic_write(tmp_path / "missing" / "spec.json", b"{}")
    assert any(str(tmp_path / "missing") in note for note in raised.value.__notes__)


@pytest.mark.parametrize("durable", [True, False], ids=["fsynced", "not-fsynced"])
def test_delete_is_idempotent(tmp_path: Path, durable: bool) -> None:
    spec = cdi.claim_spec(DRIVER, UID, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    path = cdi.write_claim_spec(tmp_path, spec, claim_uid=UID)
    assert cdi.delete_claim_spec(tmp_path, DRIVER, UID, durable=durable) is True
    assert not path.exists()
    assert cdi.delete_claim_spec(tmp_path, DRIVER, UID, durable=durable) is False
    assert cdi.delete_claim_spec(tmp_path / "never-created", DRIVER, UID) is False


def test_read_returns_what_was_written_or_none(tmp_path: Path) -> None:
    spec = cdi.claim_spec(DRIVER, UID, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    assert cdi.read_claim_spec(tmp_path, DRIVER, UID) is None
    cdi.write_claim_spec(tmp_path, spec, claim_uid=UID)
    assert cdi.read_claim_spec(tmp_path, DRIVER, UID) == spec
    (tmp_path / cdi.spec_file_name(DRIVER, UID)).write_text("[]")
    with pytest.raises(ValueError, match="not an object"):
        cdi.read_claim_spec(tmp_path, DRIVER, UID)


def test_list_finds_only_this_drivers_claim_specs(tmp_path: Path) -> None:
    other_uid = "0b7e2c55-1d2f-4a8e-9c3b-5e6f7a8b9c0d"
    for claim_uid in (UID, other_uid):
        spec = cdi.claim_spec(DRIVER, claim_uid, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
        cdi.write_claim_spec(tmp_path, spec, claim_uid=claim_uid)
    foreign = cdi.claim_spec("gpu.example.com-gpu", UID, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    cdi.write_claim_spec(tmp_path, foreign, claim_uid=UID)
    strays: dict[str, str] = {
        "nvidia.yaml": "",
        f".{cdi.spec_file_name(DRIVER, 'a1')}.x1y2{files.TEMP_SUFFIX}": "",
    }
    for name, content in strays.items():
        (tmp_path / name).write_text(content)

    assert cdi.list_claim_specs(tmp_path, DRIVER) == {
        UID: tmp_path / cdi.spec_file_name(DRIVER, UID),
        other_uid: tmp_path / cdi.spec_file_name(DRIVER, other_uid),
    }
    assert cdi.list_claim_specs(tmp_path / "missing", DRIVER) == {}


def test_claim_edits_go_to_the_specs_own_container_edits_with_nodes_and_mounts() -> None:
    common = edits.Edits(
        {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
        (edits.DeviceNode("/dev/nvidiactl"),),
        (edits.Mount("/var/lib/dra-gpu/sharing/gpu-0/pipe", "/tmp/nvidia-mps"),),
    )
    caps = edits.DeviceNode("/dev/nvidia-caps/nvidia-cap30", "c", 237, 30, 0o444)
    spec = cdi.claim_spec(
        DRIVER, "a" + UID[1:], [("gpu-0", edits.Edits({"X": "1"}, (caps,)))], common
    )
    assert spec["cdiVersion"] == "0.3.0"  # none of it needs a later version
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
        "mounts": [
            {
                "hostPath": "/var/lib/dra-gpu/sharing/gpu-0/pipe",
                "containerPath": "/tmp/nvidia-mps",
                "options": ["rw", "nosuid", "nodev", "bind"],
            }
        ],
    }
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/nvidia-caps/nvidia-cap30",
            "type": "c",
            "major": 237,
            "minor": 30,
            "fileMode": 0o444,
        }
    ]


@pytest.mark.parametrize(
    ("device", "common", "error"),
    [
        (edits.Edits({"A": "1"}), edits.Edits({"A": "2"}), "sets A, which the claim's edits set"),
        (edits.Edits(), None, "no container edits"),
        (edits.Edits(device_nodes=(edits.DeviceNode("dev/x"),)), None, "not an absolute path"),
        (
            edits.Edits({"A": "1"}),
            edits.Edits(mounts=(edits.Mount("/a", "b"),)),
            "mount container path 'b' is not an absolute path",
        ),
        (edits.Edits(device_nodes=(edits.DeviceNode("/d", "x"),)), None, "type 'x' is not c or b"),
    ],
)
def test_a_spec_cdi_would_refuse_or_misread_is_never_built(
    device: edits.Edits, common: edits.Edits | None, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        cdi.claim_spec(DRIVER, UID, [("gpu-0", device)], common)

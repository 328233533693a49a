"""A claim's CDI spec gives its containers every GPU of the claim: one claim-wide
``NVIDIA_VISIBLE_DEVICES``, the control device nodes once, each GPU's ``/dev/nvidia<minor>``
and a MIG device's capability nodes (the nvml backend over the fake NVML and a fake driver
root), merged as CDI merges them. Real files under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_gpu.agent import cdi, checkpoint
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import DeviceState, Prepared
from dra_gpu.devices import edits, model, nvml, nvml_cdi, simulated
from tests.support.fake_pynvml import FakeNvml, a100_in_mig_mode, two_h100s
from tests.unit.agent import rig
from tests.unit.agent.rig import ClaimsApi

DRIVER = "gpu.example.com"
NODE = "node-01"


class Api(ClaimsApi):
    def add(self, name: str, *devices: str) -> ClaimRef:
        results = [
            {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
        ]
        return self.allocate(name, results)


def driver_root(tmp_path: Path, *nodes: str) -> Path:
    root = tmp_path / "root"
    for node in nodes:
        (root / node.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / node.lstrip("/")).touch()  # existence is all the backend checks
    return root


def agent(tmp_path: Path, backend: model.Backend, api: Api) -> DeviceState:
    return rig.device_state(tmp_path, backend, api)


def spec_of(tmp_path: Path, uid: str) -> cdi.CdiSpec:
    spec: cdi.CdiSpec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid)).read_text())
    return spec


def container_view(spec: cdi.CdiSpec) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """What a container given every device of ``spec`` gets, as CDI's cache injects them:
    the spec's edits, then each device's; env by key (a later value wins), device nodes by
    path (a later one replaces an earlier one)."""
    env: dict[str, str] = {}
    nodes: dict[str, dict[str, Any]] = {}
    applied: list[cdi.ContainerEdits] = [spec.get("containerEdits") or {"env": []}]
    for e in applied + [d["containerEdits"] for d in spec["devices"]]:
        for item in e["env"]:
            key, _, value = item.partition("=")
            env[key] = value
        nodes.update({n["path"]: dict(n) for n in e.get("deviceNodes", [])})
    return env, list(nodes.values())


async def test_a_container_of_a_two_gpu_claim_sees_both_gpus(tmp_path: Path) -> None:
    # Before: each device's edits set NVIDIA_VISIBLE_DEVICES, and CDI keeps the last one.
    root = driver_root(
        tmp_path, "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"
    )
    api = Api()
    async with nvml.NvmlBackend(NODE, nvml=FakeNvml(two_h100s()), driver_root=root) as backend:
        answer = await agent(tmp_path, backend, api).prepare(api.add("two", "gpu-0", "gpu-1"))
    assert isinstance(answer, Prepared)
    spec = spec_of(tmp_path, "uid-two")
    env, nodes = container_view(spec)
    uuids = [gpu.uuid for gpu in two_h100s()]
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert {n["path"] for n in nodes} == {
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",  # /dev/nvidia-uvm-tools is not there: left out, as nvcdi does
    }
    # Each CDI device keeps its own node and its ID; the common nodes are the spec's.
    assert [d["containerEdits"].get("deviceNodes") for d in spec["devices"]] == [
        [{"path": "/dev/nvidia0"}],
        [{"path": "/dev/nvidia1"}],
    ]
    assert [d.cdi_device_ids for d in answer.devices] == [
        (f"k8s.{DRIVER}/gpu=uid-two-gpu-0",),
        (f"k8s.{DRIVER}/gpu=uid-two-gpu-1",),
    ]
    assert spec["cdiVersion"] == "0.3.0"  # deviceNodes without hostPath, spec-level edits


async def test_a_simulated_two_gpu_claim_lists_both_gpus_claim_wide(tmp_path: Path) -> None:
    profile = simulated.parse_profile(
        f"nodes:\n  {NODE}:\n    devices:\n    - memory: 24Gi\n    - memory: 8Gi\n"
    )
    backend = simulated.SimulatedBackend(profile, NODE)
    api = Api()
    answer = await agent(tmp_path, backend, api).prepare(api.add("two", "gpu-0", "gpu-1"))
    assert isinstance(answer, Prepared)
    env, nodes = container_view(spec_of(tmp_path, "uid-two"))
    gpus = (await backend.inventory()).devices
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{gpus[0].uuid},{gpus[1].uuid}"
    assert (env["GPU_DEVICE_0"], env["GPU_DEVICE_1"]) == ("gpu-0", "gpu-1")
    assert nodes == []


def test_a_mig_device_gets_its_parent_node_and_both_capability_nodes(tmp_path: Path) -> None:
    root = driver_root(tmp_path, "/dev/nvidia3", "/dev/nvidiactl")
    (root / "proc").mkdir()
    (root / "proc/devices").write_text(
        "Character devices:\n195 nvidia\n237 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n"
        "259 blkext\n"
    )
    caps = root / "proc/driver/nvidia/capabilities/gpu3/mig/gi2"
    (caps / "ci0").mkdir(parents=True)
    (caps / "access").write_text("DeviceFileMinor: 30\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (caps / "ci0/access").write_text("DeviceFileMinor: 31\nDeviceFileMode: 292\n")
    parent = model.gpu_device(
        index=3,
        uuid="GPU-3",
        memory="40Gi",
        product_name="A100",
        brand="NVIDIA",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        driver_version="550.54.15",
        mig_capable=True,
    )
    part = model.Device(
        name="gpu-3-mig-3g-20gb-4",
        uuid="MIG-abc",
        attributes={},
        capacity={"memory": "20Gi"},
        partition_of="gpu-3",
    )
    instance = model.MigInstance(model.MigPlacement("gpu-3", "3g.20gb", 4), 2, 0, "MIG-abc")
    claim = nvml_cdi.claim_edits(
        root, [edits.GivenDevice(parent), edits.GivenDevice(part, instance)], {3: 3}
    )
    assert claim.common.env == {"NVIDIA_VISIBLE_DEVICES": "GPU-3,MIG-abc"}
    assert claim.per_device[1].device_nodes == (
        edits.DeviceNode("/dev/nvidia3"),
        edits.DeviceNode("/dev/nvidia-caps/nvidia-cap30", "c", 237, 30, 292),
        edits.DeviceNode("/dev/nvidia-caps/nvidia-cap31", "c", 237, 31, 292),
    )


async def test_a_mig_partition_prepared_on_the_fake_nvml_names_its_mig_uuid_claim_wide(
    tmp_path: Path,
) -> None:
    api = Api()
    async with nvml.NvmlBackend(
        NODE, nvml=FakeNvml([a100_in_mig_mode()]), driver_root=driver_root(tmp_path)
    ) as backend:
        inventory = await backend.inventory()
        part = next(d for d in inventory.devices if d.partition_of is not None)
        state = agent(tmp_path, backend, api)
        ref = api.add("mig", part.name)
        answer = await state.prepare(ref)
        assert isinstance(answer, Prepared)
        env, _ = container_view(spec_of(tmp_path, "uid-mig"))
        (instance,) = state.prepared.claims["uid-mig"].mig_instances()
        assert env["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
        assert await state.unprepare(ref) is None


def test_a_spec_with_claim_edits_is_still_read_by_the_previous_version(tmp_path: Path) -> None:
    # The previous version's checkpoint decoder requires devices[].containerEdits.env and
    # ignores the rest; a spec written now keeps env in every device, even an empty one.
    common = edits.Edits({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, (edits.DeviceNode("/dev/x"),))
    spec = cdi.claim_spec(
        DRIVER,
        "uid-1",
        [("gpu-0", edits.Edits(device_nodes=(edits.DeviceNode("/dev/nvidia0"),)))],
        common,
    )
    assert spec["devices"][0]["containerEdits"]["env"] == []
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]
    # A recorded MIG device created again with another UUID: the claim's list names the new.
    old = model.MigInstance(model.MigPlacement("gpu-0", "1g.5gb", 0), 1, 0, "GPU-b")
    new = model.MigInstance(old.placement, 2, 0, "MIG-new")
    record = checkpoint.PreparedClaim(
        "uid-1",
        "ns",
        "c",
        (checkpoint.RecordedDevice(("gpu",), NODE, "gpu-0", ("id",), mig_instance=old),),
        spec,
    ).with_mig_instance("gpu-0", new)
    assert record.cdi_spec is not None
    assert record.cdi_spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-a,MIG-new"]

"""Nodes whose workloads get GPUs through CDI only (``--toolkit-cdi-kind``): prepare answers,
for each device, the NVIDIA Container Toolkit's own CDI device (a GPU's ``nvidia.com/gpu=GPU-
<uuid>``, a MIG partition its parent GPU's) before ours, so the container gets the driver from
the toolkit's spec and our spec's edits last; records of the previous version (one ID) answer
as they were; off by default. Real files under tmp_path; the container's view is computed as
CDI's ``Cache.InjectDevices`` computes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import config
from dra_gpu.agent import cdi, checkpoint, runner, toolkit
from dra_gpu.agent.checkpoint import v1
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import DeviceState, Prepared
from dra_gpu.devices import model, nvml, simulated
from tests.support.fake_pynvml import FakeNvml, a100_in_mig_mode, two_h100s
from tests.unit.agent.rig import ClaimsApi, device_state

DRIVER = "gpu.example.com"
NODE = "node-01"
KIND = "nvidia.com/gpu"
OURS = f"k8s.{DRIVER}/gpu"
PARENT = "GPU-aaaaaaaa-0000-4000-8000-0000000000a0"
MIG_PROFILE = f"""\
nodes:
  {NODE}:
    devices:
    - {{memory: 40Gi, migCapable: true, mig: A100-40GB, uuid: {PARENT}}}
"""
P3G = "gpu-0-mig-3g-20gb-4"


class Api(ClaimsApi):
    def add(self, name: str, *devices: str) -> ClaimRef:
        results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
        return self.allocate(name, results)


def agent(tmp_path: Path, backend: model.Backend, api: Api, kind: str = KIND) -> DeviceState:
    """The agent as it starts (the checkpoint on disk loaded), set up for CDI only."""
    state = device_state(tmp_path, backend, api, toolkit_cdi_kind=kind)
    state.load(checkpoint.read_checkpoint(tmp_path / "checkpoint.json"))
    return state


def toolkit_spec(uuids: list[str]) -> dict[str, Any]:
    """What ``nvidia-ctk cdi generate --device-name-strategy=uuid`` writes, in short: the
    driver and NVIDIA_VISIBLE_DEVICES=void for every device, each GPU's node per device."""
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [
                {"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1"}
            ],
        },
        "devices": [
            {"name": u, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
            for i, u in enumerate(uuids)
        ],
    }


def injected(specs: list[dict[str, Any]], ids: list[str]) -> tuple[dict[str, str], set[str]]:
    """The env and mounts of a container given ``ids``, as CDI injects them: each spec's
    top-level edits the first time one of its devices comes, then the device's; a later value
    of a variable replaces an earlier one (``Cache.InjectDevices``, ``ContainerEdits.Apply``)."""
    by_id = {
        f"{s['kind']}={d['name']}": (s, d["containerEdits"]) for s in specs for d in s["devices"]
    }
    env: dict[str, str] = {}
    mounts: set[str] = set()
    seen: list[int] = []
    for device_id in ids:
        spec, edits = by_id[device_id]  # KeyError: unresolvable, the container would not start
        applied = [edits]
        if id(spec) not in seen:
            seen.append(id(spec))
            applied.insert(0, spec.get("containerEdits", {}))
        for e in applied:
            env.update(item.split("=", 1) for item in e.get("env", []))
            mounts.update(m["containerPath"] for m in e.get("mounts", []))
    return env, mounts


def ours(tmp_path: Path, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(
        (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid)).read_text()
    )
    return spec


async def test_a_two_gpu_claim_answers_both_gpus_toolkit_devices_before_ours(
    tmp_path: Path,
) -> None:
    api = Api()
    uuids = [gpu.uuid for gpu in two_h100s()]
    async with nvml.NvmlBackend(NODE, nvml=FakeNvml(two_h100s())) as backend:
        answer = await agent(tmp_path, backend, api).prepare(api.add("two", "gpu-0", "gpu-1"))
    assert isinstance(answer, Prepared)
    expected = [
        (f"{KIND}={uuids[0]}", f"{OURS}=uid-two-gpu-0"),
        (f"{KIND}={uuids[1]}", f"{OURS}=uid-two-gpu-1"),
    ]
    assert [d.cdi_device_ids for d in answer.devices] == expected
    # The checkpoint records both, and a restarted agent answers them.
    (record,) = checkpoint.read_checkpoint(tmp_path / "checkpoint.json").claims.values()
    assert [d.cdi_device_ids for d in record.devices] == expected

    # The kubelet hands a container every ID in order: the toolkit's driver comes with it,
    # and our NVIDIA_VISIBLE_DEVICES (both GPUs) wins over the toolkit's "void".
    env, mounts = injected(
        [toolkit_spec(uuids), ours(tmp_path, "uid-two")], [i for d in expected for i in d]
    )
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert mounts == {"/usr/lib/libcuda.so.1"}


async def test_ours_first_would_leave_the_toolkits_void() -> None:
    # Why the toolkit's device comes first: the other order lets its spec's edits come last.
    spec = toolkit_spec(["GPU-a"])
    claim = {
        "kind": OURS,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a"]},
        "devices": [{"name": "u-gpu-0", "containerEdits": {"env": []}}],
    }
    first, _ = injected([spec, claim], [f"{KIND}=GPU-a", f"{OURS}=u-gpu-0"])
    last, _ = injected([spec, claim], [f"{OURS}=u-gpu-0", f"{KIND}=GPU-a"])
    assert (first["NVIDIA_VISIBLE_DEVICES"], last["NVIDIA_VISIBLE_DEVICES"]) == ("GPU-a", "void")


@pytest.mark.parametrize("backend_name", ["simulated", "nvml"])
async def test_a_mig_partition_answers_its_parent_gpus_toolkit_device(
    tmp_path: Path, backend_name: str
) -> None:
    backend: Any
    if backend_name == "simulated":
        backend = simulated.SimulatedBackend(
            simulated.parse_profile(MIG_PROFILE), NODE, hardware_dir=tmp_path / "hw"
        )
        parent = PARENT
    else:
        gpu = a100_in_mig_mode()
        backend = nvml.NvmlBackend(NODE, nvml=FakeNvml([gpu]))
        parent = gpu.uuid
    api = Api()
    try:
        answer = await agent(tmp_path, backend, api).prepare(api.add("m", P3G))
        (instance,) = await backend.mig_instances()
    finally:
        await backend.aclose()
    assert isinstance(answer, Prepared)
    # Not the MIG device made just now (no spec generated at node set-up can know it).
    assert instance.uuid.startswith("MIG-")
    assert instance.uuid != parent
    assert [d.cdi_device_ids for d in answer.devices] == [
        (f"{KIND}={parent}", f"{OURS}=uid-m-{P3G}")
    ]


async def test_off_by_default_a_claim_answers_exactly_as_before(tmp_path: Path) -> None:
    api = Api()
    async with nvml.NvmlBackend(NODE, nvml=FakeNvml(two_h100s())) as backend:
        answer = await agent(tmp_path, backend, api, kind="").prepare(
            api.add("two", "gpu-0", "gpu-1")
        )
    assert isinstance(answer, Prepared)
    assert [d.cdi_device_ids for d in answer.devices] == [
        (f"{OURS}=uid-two-gpu-0",),
        (f"{OURS}=uid-two-gpu-1",),
    ]
    assert config.AgentSettings(node_name=NODE, profile=Path("p")).toolkit_cdi_kind == ""


async def test_a_record_of_the_previous_version_keeps_answering_its_one_id(
    tmp_path: Path,
) -> None:
    api = Api()
    ref = api.add("old", "gpu-0")
    async with nvml.NvmlBackend(NODE, nvml=FakeNvml(two_h100s())) as backend:
        first = await agent(tmp_path, backend, api, kind="").prepare(ref)  # the previous setup
        shutil.rmtree(tmp_path / "cdi")  # a reboot: the spec is written again from the record
        again = await agent(tmp_path, backend, api).prepare(ref)
    assert isinstance(first, Prepared)
    assert isinstance(again, Prepared)
    assert [d.cdi_device_ids for d in again.devices] == [(f"{OURS}=uid-old-gpu-0",)]
    assert (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, ref.uid)).exists()


def test_the_decoder_reads_a_record_with_both_ids_as_a_list_of_ids() -> None:
    # The record's format is v1 as before: cdi_device_ids was always a list (the previous
    # version's decoder is this one, unchanged), so it reads and answers both IDs.
    device = checkpoint.RecordedDevice(
        ("gpu",), NODE, "gpu-0", (f"{KIND}=GPU-a", f"{OURS}=u-gpu-0")
    )
    claim = checkpoint.PreparedClaim("u", "ns", "c", (device,), None)
    content, _ = v1.dump_checksummed(checkpoint.Checkpoint({"u": claim}))
    loaded = checkpoint.load(content)
    assert loaded.claims["u"].devices[0].cdi_device_ids == (f"{KIND}=GPU-a", f"{OURS}=u-gpu-0")
    assert json.loads(content)["data"]["claims"][0]["devices"][0]["cdi_device_ids"] == [
        f"{KIND}=GPU-a",
        f"{OURS}=u-gpu-0",
    ]


def test_declared_reads_the_toolkits_yaml_and_json_specs_of_the_kind(tmp_path: Path) -> None:
    assert toolkit.declared(tmp_path / "absent", KIND) is None
    (tmp_path / "k8s.gpu.example.com-gpu_u.json").write_text(
        json.dumps({"cdiVersion": "0.3.0", "kind": OURS, "devices": [{"name": "u-gpu-0"}]})
    )
    (tmp_path / "broken.yaml").write_text("kind: [")
    assert toolkit.declared(tmp_path, KIND) is None  # no spec of the kind: not set up
    (tmp_path / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: GPU-a\n"
        "- name: all\ncontainerEdits: {env: [NVIDIA_VISIBLE_DEVICES=void]}\n"
    )
    assert toolkit.declared(tmp_path, KIND) == {"0", "GPU-a", "all"}


def test_missing_names_the_gpus_and_mig_parents_no_spec_declares() -> None:
    gpu = model.Device("gpu-0", "GPU-a", {}, {})
    partition = model.Device(
        "gpu-1-mig-1g-5gb-0",
        "MIG-x",
        {"parentUUID": model.StringValue("GPU-b")},
        {},
        partition_of="gpu-1",
    )
    assert toolkit.missing({"GPU-a", "0"}, [gpu, partition]) == ["GPU-b"]
    assert toolkit.missing(None, [gpu, partition]) == ["GPU-a", "GPU-b"]
    message = toolkit.advice(KIND, Path("/var/run/cdi"), ["GPU-b"], any_spec=True, mig=True)
    assert "declare no device GPU-b" in message
    assert "nvidia-ctk cdi generate --device-name-strategy=uuid" in message
    assert "--device-id=" in message
    assert "--output=/var/run/cdi/nvidia.yaml" in message
    plain = toolkit.advice(KIND, Path("/var/run/cdi"), ["GPU-a"], any_spec=False, mig=False)
    assert "no CDI spec in /var/run/cdi is of kind nvidia.com/gpu" in plain
    assert "--device-id" not in plain


def test_the_setting_is_a_flag_with_an_env_twin_and_refuses_a_bad_kind() -> None:
    parser = __import__("argparse").ArgumentParser()
    config.add_arguments(parser, config.AgentSettings)
    args = parser.parse_args(["--node-name", NODE, "--backend", "nvml"])
    settings = config.settings_from(config.AgentSettings, args, {"DRA_GPU_TOOLKIT_CDI_KIND": KIND})
    assert settings.toolkit_cdi_kind == KIND
    with pytest.raises(ValueError, match="--toolkit-cdi-kind / DRA_GPU_TOOLKIT_CDI_KIND"):
        config.AgentSettings(node_name=NODE, backend="nvml", toolkit_cdi_kind="nvidia.com")


class NodeApi:
    """The two calls the start check makes: GET the Node, create an Event."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any]:
        assert path == f"/api/v1/nodes/{NODE}"
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "n"}}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append(body)
        return body


async def test_the_agent_warns_at_start_naming_the_command_when_no_spec_has_the_gpus(
    tmp_path: Path,
) -> None:
    settings = config.AgentSettings(
        node_name=NODE, backend="nvml", cdi_dir=tmp_path / "cdi", toolkit_cdi_kind=KIND
    )
    uuids = [gpu.uuid for gpu in two_h100s()]
    api = NodeApi()
    async with nvml.NvmlBackend(NODE, nvml=FakeNvml(two_h100s())) as backend:

        async def inventory(fresh: bool) -> model.Inventory:
            return await backend.inventory()

        # No spec of the kind at all: a warning and an Event on the Node, naming the command.
        message = await runner.check_toolkit_spec(settings, api, inventory)  # type: ignore[arg-type]
        assert message is not None
        assert f"no CDI spec in {tmp_path / 'cdi'} is of kind {KIND}" in message
        assert [(e["reason"], e["type"]) for e in api.events] == [
            ("ToolkitCdiSpecMissing", "Warning")
        ]
        assert "nvidia-ctk cdi generate --device-name-strategy=uuid" in api.events[0]["note"]

        # A spec that has one GPU (generated before the other was added): that one is named.
        (tmp_path / "cdi").mkdir()
        (tmp_path / "cdi" / "nvidia.json").write_text(json.dumps(toolkit_spec(uuids[:1])))
        message = await runner.check_toolkit_spec(settings, api, inventory)  # type: ignore[arg-type]
        assert message is not None
        assert f"declare no device {uuids[1]}" in message

        # Every GPU's device there: nothing to say.
        (tmp_path / "cdi" / "nvidia.json").write_text(json.dumps(toolkit_spec(uuids)))
        assert await runner.check_toolkit_spec(settings, api, inventory) is None  # type: ignore[arg-type]
    assert len(api.events) == 2

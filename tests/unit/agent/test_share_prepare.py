"""Prepare of shares of a shared GPU: each claim's CDI spec carries its memory share and the
node's sharing mode, and the checkpoint, the kubelet's answer and ``status.devices`` key each
device by (device, shareID). Real files under tmp_path."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import config
from dra_gpu.agent import cdi, checkpoint, claims, mps
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import DeviceState, Prepared
from dra_gpu.devices import model, simulated
from dra_gpu.testing import eventually
from tests.unit.agent import rig
from tests.unit.agent.rig import ClaimsApi

DRIVER = "gpu.example.com"
NODE = "node-01"
SHARE_A = "3e8b1a52-0000-4000-8000-00000000000a"
SHARE_B = "3e8b1a52-0000-4000-8000-00000000000b"


def profile(mode: str, extra: str = "") -> str:
    return f"""\
nodes:
  {NODE}:
    devices:
    - memory: 40Gi
      sharing: {{mode: {mode}, memory: {{default: 8Gi, min: 4Gi, step: 2Gi}}{extra}}}
"""


class Api(ClaimsApi):
    def add(self, name: str, *shares: tuple[str | None, str | None]) -> ClaimRef:
        results = [
            {
                "request": f"gpu{i}",
                "driver": DRIVER,
                "pool": NODE,
                "device": "gpu-0",
                "shareID": share,
                **({"consumedCapacity": {"memory": memory}} if memory else {}),
            }
            for i, (share, memory) in enumerate(shares)
        ]
        return self.allocate(name, results)


class Sink:
    def __init__(self) -> None:
        self.entries: dict[str, list[dict[str, Any]]] = {}

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        self.entries[ref.name] = entries


def agent(tmp_path: Path, mode: str, api: Api, sink: Sink, extra: str = "") -> DeviceState:
    """An agent over the simulated backend, whose MPS daemons are the stand-in (real
    processes, stopped by the ``daemons`` fixture)."""
    backend = simulated.SimulatedBackend(
        simulated.parse_profile(profile(mode, extra)), NODE, hardware_dir=tmp_path / "hw"
    )

    sharing = mps.Sharing(tmp_path / "sharing", config.STANDIN_MPS_CONTROL, backend)
    STARTED.append(sharing)
    return rig.device_state(tmp_path, backend, api, sink, sharing=sharing)


STARTED: list[mps.Sharing] = []


@pytest.fixture(autouse=True)
async def daemons() -> AsyncIterator[None]:
    """Every stand-in daemon a test started is stopped after it, whatever it left."""
    yield
    while STARTED:
        await STARTED.pop().sync([])


def spec_envs(tmp_path: Path, uid: str) -> dict[str, dict[str, str]]:
    """Per CDI device, what a container given it sees: the claim's env, then the device's."""
    spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid)).read_text())
    common = spec.get("containerEdits", {}).get("env", [])
    return {
        d["name"]: {
            k: v
            for k, v in (e.split("=", 1) for e in common + d["containerEdits"]["env"])
            if k != "NVIDIA_VISIBLE_DEVICES"
        }
        for d in spec["devices"]
    }


def container_env(tmp_path: Path, uid: str) -> dict[str, str]:
    """What a container given every device of the claim sees, merged as CDI merges: the
    spec's edits, then each device's, a later value replacing an earlier one by key."""
    spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid)).read_text())
    env: dict[str, str] = {}
    for edits in [spec.get("containerEdits", {"env": []})] + [
        d["containerEdits"] for d in spec["devices"]
    ]:
        env.update(e.split("=", 1) for e in edits["env"])
    return env


async def test_two_claims_sharing_a_gpu_under_mps_each_get_their_share(tmp_path: Path) -> None:
    api, sink = Api(), Sink()
    state = agent(tmp_path, "MPS", api, sink)
    a = api.add("a", (SHARE_A, "8Gi"))
    b = api.add("b", (SHARE_B, "16Gi"))

    answer_a, answer_b = await state.prepare(a), await state.prepare(b)

    assert isinstance(answer_a, Prepared)
    assert isinstance(answer_b, Prepared)
    assert [(d.device, d.share_id) for d in answer_a.devices] == [("gpu-0", SHARE_A)]
    (device_id,) = answer_b.devices[0].cdi_device_ids
    assert device_id == f"k8s.{DRIVER}/gpu=uid-b-gpu-0-{SHARE_B}"
    assert spec_envs(tmp_path, "uid-b") == {
        f"uid-b-gpu-0-{SHARE_B}": {
            "GPU_DEVICE_0": "gpu-0",
            "DRA_GPU_SHARING_STRATEGY": "MPS",
            "DRA_GPU_MEMORY_LIMIT": "16Gi",
            "DRA_GPU_SHARE_ID": SHARE_B,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16384M",
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        }
    }
    assert spec_envs(tmp_path, "uid-a")[f"uid-a-gpu-0-{SHARE_A}"]["DRA_GPU_MEMORY_LIMIT"] == "8Gi"
    on_disk = checkpoint.read_checkpoint(tmp_path / "checkpoint.json")
    assert [d.share_id for d in on_disk.claims["uid-b"].devices] == [SHARE_B]
    ((entry,),) = [sink.entries["b"]]
    assert (entry["device"], entry["shareID"]) == ("gpu-0", SHARE_B)
    assert entry["data"]["memoryShare"] == "16Gi"


async def test_one_claim_may_hold_two_shares_of_one_gpu(tmp_path: Path) -> None:
    api, sink = Api(), Sink()
    state = agent(tmp_path, "TimeSlicing", api, sink)
    ref = api.add("two", (SHARE_A, None), (SHARE_B, "4Gi"))

    answer = await state.prepare(ref)

    assert isinstance(answer, Prepared)
    assert [(d.request_names, d.share_id) for d in answer.devices] == [
        (("gpu0",), SHARE_A),
        (("gpu1",), SHARE_B),
    ]
    envs = spec_envs(tmp_path, "uid-two")
    # Claim-wide, in the claim's order of its shares: the first takes the default.
    assert container_env(tmp_path, "uid-two")["DRA_GPU_MEMORY_LIMIT"] == "8Gi,4Gi"
    assert container_env(tmp_path, "uid-two")["DRA_GPU_SHARE_ID"] == f"{SHARE_A},{SHARE_B}"
    assert all(e["DRA_GPU_SHARING_STRATEGY"] == "TimeSlicing" for e in envs.values())
    assert not any("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in e for e in envs.values())
    assert [e["shareID"] for e in sink.entries["two"]] == [SHARE_A, SHARE_B]
    assert await state.unprepare(ref) is None
    assert checkpoint.read_checkpoint(tmp_path / "checkpoint.json").claims == {}


@pytest.mark.parametrize("mode", ["TimeSlicing", "MPS"])
async def test_a_gpu_allocated_whole_gets_no_share_variables(tmp_path: Path, mode: str) -> None:
    # 1.35: the API server dropped the sharing fields, so the scheduler allocates it whole.
    api, sink = Api(), Sink()
    state = agent(tmp_path, mode, api, sink)
    answer = await state.prepare(api.add("whole", (None, None)))
    assert isinstance(answer, Prepared)
    assert answer.devices[0].share_id is None
    assert spec_envs(tmp_path, "uid-whole") == {
        "uid-whole-gpu-0": {"GPU_DEVICE_0": "gpu-0", "DRA_GPU_SHARING_STRATEGY": "Exclusive"}
    }
    assert "shareID" not in sink.entries["whole"][0]


def standin(tmp_path: Path) -> dict[str, Any] | None:
    """What gpu-0's stand-in MPS daemon says it enforces (None: no daemon)."""
    path = tmp_path / "sharing" / "gpu-0" / "pipe" / "dra-gpu-standin.json"
    return json.loads(path.read_text()) if path.exists() else None


def gpu_settings(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "hw" / f"{NODE}-gpu-settings.json"
    settings: dict[str, str] = (
        json.loads(path.read_text()).get("gpu-0", {}) if path.exists() else {}
    )
    return settings


async def test_two_mps_shares_in_one_container_keep_both_limits(tmp_path: Path) -> None:
    # One variable per share would leave the container the last share's limit (CDI merges
    # env by key): the claim's limit for its GPU is the sum of its shares, claim-wide.
    api, sink = Api(), Sink()
    state = agent(tmp_path, "MPS", api, sink)
    ref = api.add("two", (SHARE_A, "8Gi"), (SHARE_B, "4Gi"))
    assert isinstance(await state.prepare(ref), Prepared)
    env = container_env(tmp_path, "uid-two")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288M"
    assert env["DRA_GPU_MEMORY_LIMIT"] == "8Gi,4Gi"
    assert env["DRA_GPU_SHARE_ID"] == f"{SHARE_A},{SHARE_B}"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == mps.PIPE_IN_CONTAINER


async def test_the_mps_daemon_runs_from_the_first_share_to_the_last(tmp_path: Path) -> None:
    api, sink = Api(), Sink()
    state = agent(tmp_path, "MPS", api, sink, ", activeThreadPercentage: 40")
    a, b = api.add("a", (SHARE_A, "8Gi")), api.add("b", (SHARE_B, "16Gi"))
    assert standin(tmp_path) is None

    assert isinstance(await state.prepare(a), Prepared)
    first = standin(tmp_path)
    assert first is not None  # running before the first share's answer
    uuid = first["visibleDevices"]
    assert first["defaultDevicePinnedMemLimit"] == {uuid: "8192M"}  # the policy's default
    assert first["defaultActiveThreadPercentage"] == 40
    assert gpu_settings(tmp_path) == {"computeMode": "EXCLUSIVE_PROCESS"}
    spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, "uid-a")).read_text())
    assert {(m["hostPath"], m["containerPath"]) for m in spec["containerEdits"]["mounts"]} == {
        (str(tmp_path / "sharing" / "gpu-0" / "pipe"), "/tmp/nvidia-mps"),
        ("/dev/shm", "/dev/shm"),
    }
    assert container_env(tmp_path, "uid-a")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"

    assert isinstance(await state.prepare(b), Prepared)
    assert await state.unprepare(a) is None
    still = standin(tmp_path)
    assert still is not None
    assert still["pid"] == first["pid"]  # one daemon for both shares

    assert await state.unprepare(b) is None
    assert standin(tmp_path) is None
    assert not mps.is_daemon(first["pid"], "dra_gpu.agent.mps_standin")
    assert gpu_settings(tmp_path) == {"computeMode": "DEFAULT"}
    assert not (tmp_path / "sharing" / "gpu-0").exists()


async def test_a_restarted_agent_adopts_the_daemon_and_starts_a_dead_one_again(
    tmp_path: Path,
) -> None:
    api, sink = Api(), Sink()
    ref = api.add("a", (SHARE_A, "8Gi"))
    assert isinstance(await agent(tmp_path, "MPS", api, sink).prepare(ref), Prepared)
    before = standin(tmp_path)
    assert before is not None

    # A new agent process: it reads the checkpoint and finds the daemon still running.
    again = agent(tmp_path, "MPS", api, sink)
    again.load(checkpoint.read_checkpoint(tmp_path / "checkpoint.json"))
    assert not any("MPS" in line for line in await again.recover())
    adopted = standin(tmp_path)
    assert adopted is not None
    assert adopted["pid"] == before["pid"]

    # The daemon crashes (its files stay behind); the next start cleans up and starts one.
    os.kill(before["pid"], signal.SIGKILL)
    await eventually(
        lambda: not mps.is_daemon(before["pid"], "dra_gpu.agent.mps_standin") or None,
        timeout=10,
        what="the daemon gone",
    )
    third = agent(tmp_path, "MPS", api, sink)
    third.load(checkpoint.read_checkpoint(tmp_path / "checkpoint.json"))
    lines = await third.recover()
    assert "cleaned up after the MPS daemon of gpu-0, which had died" in lines
    restarted = standin(tmp_path)
    assert restarted is not None
    assert restarted["pid"] != before["pid"]
    assert await third.unprepare(ref) is None
    assert standin(tmp_path) is None


async def test_a_time_sliced_gpu_gets_its_time_slice_while_shared(tmp_path: Path) -> None:
    api, sink = Api(), Sink()
    state = agent(tmp_path, "TimeSlicing", api, sink, ", timeSlice: Short")
    ref = api.add("a", (SHARE_A, None))
    assert isinstance(await state.prepare(ref), Prepared)
    assert gpu_settings(tmp_path) == {"timeSlice": "Short"}
    assert standin(tmp_path) is None  # no MPS daemon for time-slicing
    assert await state.unprepare(ref) is None
    assert gpu_settings(tmp_path) == {"timeSlice": "Default"}


def test_mps_limits_name_each_gpu_by_its_place_in_nvidia_visible_devices() -> None:
    policy = model.Sharing("MPS", model.MemoryPolicy("8Gi", "4Gi"), active_thread_percentage=30)
    gpus = [
        model.Device(f"gpu-{i}", f"GPU-{i}", {}, {"memory": "40Gi"}, sharing=policy)
        for i in range(2)
    ]
    whole = model.Device("gpu-2", "GPU-2", {}, {"memory": "40Gi"})
    pairs = [
        (claims.AllocatedDevice("a", NODE, "gpu-2"), whole),
        (
            claims.AllocatedDevice("b", NODE, "gpu-1", share_id="s1", consumed={"memory": "4Gi"}),
            gpus[1],
        ),
        (claims.AllocatedDevice("c", NODE, "gpu-0", share_id="s2"), gpus[0]),
    ]
    assert claims.share_env(pairs) == {
        "DRA_GPU_MEMORY_LIMIT": "4Gi,8Gi",
        "DRA_GPU_SHARE_ID": "s1,s2",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=4096M,2=8192M",  # GPU-2 is ordinal 0
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }


async def test_a_claim_with_mps_shares_of_two_gpus_is_refused(tmp_path: Path) -> None:
    policy = model.Sharing("MPS", model.MemoryPolicy("8Gi", "4Gi"))
    sharing = mps.Sharing(tmp_path, config.STANDIN_MPS_CONTROL)
    shares = [mps.SharedGpu(f"gpu-{i}", f"GPU-{i}", policy) for i in range(2)]
    with pytest.raises(mps.MpsError, match="MPS shares of gpu-0 and gpu-1"):
        await sharing.hold("uid", shares)
    assert not os.listdir(tmp_path)  # nothing started

"""Prepare of shares of a shared GPU: each claim's CDI spec carries its memory share and the
node's sharing mode, and the checkpoint, the kubelet's answer and ``status.devices`` key each
device by (device, shareID). Real files under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.agent import cdi, checkpoint
from dra_gpu.agent.claims import ClaimRef, ClaimUID
from dra_gpu.agent.state import DeviceState, Prepared
from dra_gpu.devices import simulated

DRIVER = "gpu.example.com"
NODE = "node-01"
SHARE_A = "3e8b1a52-0000-4000-8000-00000000000a"
SHARE_B = "3e8b1a52-0000-4000-8000-00000000000b"


def profile(mode: str) -> str:
    return f"""\
nodes:
  {NODE}:
    devices:
    - memory: 40Gi
      sharing: {{mode: {mode}, memory: {{default: 8Gi, min: 4Gi, step: 2Gi}}}}
"""


class Api:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

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
        self.claims[name] = {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": results}}},
        }
        return ClaimRef("ns", name, ClaimUID(f"uid-{name}"))

    async def get(self, path: str) -> dict[str, Any]:
        return self.claims[path.rsplit("/", 1)[1]]


class Sink:
    def __init__(self) -> None:
        self.entries: dict[str, list[dict[str, Any]]] = {}

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        self.entries[ref.name] = entries


def agent(tmp_path: Path, mode: str, api: Api, sink: Sink) -> DeviceState:
    backend = simulated.SimulatedBackend(simulated.parse_profile(profile(mode)), NODE)

    async def inventory(fresh: bool) -> Any:
        return await backend.inventory()

    return DeviceState(
        api=api,  # type: ignore[arg-type]  # prepare only GETs claims
        driver=DRIVER,
        node=NODE,
        container_env=backend.container_env,
        cdi_dir=tmp_path / "cdi",
        checkpoint_file=tmp_path / "checkpoint.json",
        inventory=inventory,
        status=sink,
    )


def spec_envs(tmp_path: Path, uid: str) -> dict[str, dict[str, str]]:
    spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid)).read_text())
    return {
        d["name"]: dict(e.split("=", 1) for e in d["containerEdits"]["env"])
        for d in spec["devices"]
    }


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
    assert envs[f"uid-two-gpu-0-{SHARE_A}"]["DRA_GPU_MEMORY_LIMIT"] == "8Gi"  # the default
    assert envs[f"uid-two-gpu-0-{SHARE_B}"]["DRA_GPU_MEMORY_LIMIT"] == "4Gi"
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

"""The checkpoint's versioning rule (``agent.checkpoint``): what this version writes, the previous
version reads. The previous reader is the last one that read only the snapshot (no journal),
taken from git history (``data/checkpoint_before_journal.py.txt``); real files under tmp_path."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

from dra_gpu.agent import cdi, checkpoint
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import Prepared
from dra_gpu.devices import model, simulated
from tests.unit.agent import rig
from tests.unit.agent.rig import ClaimsApi

DRIVER = "gpu.example.com"
NODE = "node-01"
PREVIOUS = Path(__file__).parent / "data" / "checkpoint_before_journal.py.txt"
PROFILE = f"nodes:\n  {NODE}:\n    devices:\n    - count: 4\n      memory: 8Gi\n"


def previous_reader() -> Any:
    """The snapshot-only checkpoint module, loaded under a name of its own."""
    module = types.ModuleType("checkpoint_before_journal")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(PREVIOUS.read_text(), str(PREVIOUS), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def as_seen(claims: Any) -> dict[str, tuple[Any, ...]]:
    """Claims by UID as both versions see them: names, devices and their CDI IDs, spec."""
    return {
        uid: (
            c.namespace,
            c.name,
            tuple((d.pool, d.device, tuple(d.cdi_device_ids)) for d in c.devices),
            c.cdi_spec,
        )
        for uid, c in claims.items()
    }


def gpu(api: ClaimsApi, name: str, device: str) -> ClaimRef:
    return api.allocate(
        name, [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]
    )


async def test_after_a_clean_stop_the_previous_reader_sees_every_claim_the_journal_held(
    tmp_path: Path,
) -> None:
    api = ClaimsApi()
    backend = simulated.SimulatedBackend(simulated.parse_profile(PROFILE), NODE)
    state = rig.device_state(tmp_path, backend, api)
    state.load(checkpoint.read_checkpoint(tmp_path / "checkpoint.json"))
    refs = [gpu(api, f"c{i}", f"gpu-{i}") for i in range(3)]
    for ref in refs:
        assert isinstance((await state.prepare_all([ref]))[ref.uid], Prepared)
    assert (await state.unprepare_all([refs[1]]))[refs[1].uid] is None
    path = tmp_path / "checkpoint.json"
    journal = checkpoint.journal_path(path)
    assert len(journal.read_bytes().splitlines()) == 5  # header, three puts, a delete

    # Before the stop, the snapshot alone would lack them: the fold is what makes a rollback
    # safe for a reader that knows no journal.
    before = previous_reader().load(path.read_bytes())
    assert set(before.claims) == set()

    await state.aclose()  # the clean stop

    old = previous_reader().load(path.read_bytes())
    assert set(old.claims) == {refs[0].uid, refs[2].uid}
    assert as_seen(old.claims) == as_seen(checkpoint.read_checkpoint(path).claims)


def test_the_optional_keys_added_within_v1_are_ignored_by_the_previous_reader(
    tmp_path: Path,
) -> None:
    spec = cdi.claim_spec(DRIVER, "u1", [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    device = checkpoint.RecordedDevice(
        ("gpu",), NODE, "gpu-0", (cdi.cdi_device_id(DRIVER, "u1", "gpu-0"),), share_id="s-1"
    )
    mig = model.MigInstance(model.MigPlacement("gpu-1", "1g.10gb", 0), 1, 0, "MIG-1")
    partition = checkpoint.RecordedDevice(
        ("gpu",), NODE, "gpu-1-mig-1g.10gb-0", ("k8s.x/gpu=u1-p",), mig_instance=mig
    )
    written = checkpoint.Checkpoint(
        {"u1": checkpoint.PreparedClaim("u1", "ns", "c1", (device, partition), spec)}
    )
    path = tmp_path / "checkpoint.json"
    checkpoint.write_checkpoint(path, written)

    old = previous_reader().load(path.read_bytes())

    assert as_seen(old.claims) == as_seen(written.claims)
    assert not any("share_id" in f.name for f in dataclasses.fields(old.claims["u1"].devices[0]))

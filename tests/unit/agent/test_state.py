"""DeviceState without the API: recovery of the CDI directory from the checkpoint, unprepare of
claims it never prepared, and group-committed checkpoint writes. Real files under tmp_path."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

from dra_gpu.agent import cdi, checkpoint, claims
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.state import CLAIM_READS, DeviceState, Prepared, PrepareFailed
from dra_gpu.agent.status import StatusSink
from dra_gpu.devices import model
from dra_gpu.devices.simulated import Profile, SimulatedBackend
from dra_gpu.resource.bodies import ClaimUID

DRIVER = "gpu.example.com"
SIMULATED = SimulatedBackend(Profile("test", {}), "node-01")


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        self.calls.append((ref.uid, entries))


def state(
    tmp_path: Path, sink: StatusSink | None = None, *, api: Any = None, gpus: int = 0
) -> DeviceState:
    """An agent's state on node-01 over ``tmp_path``; with ``gpus``, an inventory of that
    many 80Gi GPUs (else none is read); ``api`` is None where the paths never reach it."""
    devices = tuple(
        model.gpu_device(
            index=i,
            uuid=f"GPU-{i}",
            memory="80Gi",
            product_name="sim",
            brand="sim",
            architecture="sim",
            cuda_compute_capability="9.0",
            driver_version="550.0",
            mig_capable=False,
        )
        for i in range(gpus)
    )

    async def inventory(fresh: bool) -> model.Inventory:
        assert devices, "not needed here"
        return model.Inventory("node-01", devices)

    return DeviceState(
        api=api,
        driver=DRIVER,
        node="node-01",
        container_edits=SIMULATED.container_edits,
        cdi_dir=tmp_path / "cdi",
        checkpoint_file=tmp_path / "checkpoint" / "checkpoint.json",
        inventory=inventory,
        status=sink or RecordingSink(),
    )


def prepared(uid: str) -> checkpoint.PreparedClaim:
    spec = cdi.claim_spec(DRIVER, uid, [("gpu-0", {"GPU_DEVICE_0": "gpu-0"})])
    device = checkpoint.RecordedDevice(
        ("gpu",), "node-01", "gpu-0", (cdi.cdi_device_id(DRIVER, uid, "gpu-0"),)
    )
    return checkpoint.PreparedClaim(uid, "ns", f"claim-{uid}", (device,), spec)


async def test_recover_rewrites_lost_specs_and_deletes_unrecorded_ones(tmp_path: Path) -> None:
    agent = state(tmp_path)
    agent.load(checkpoint.Checkpoint({"u1": prepared("u1")}))
    leaked = prepared("u2")
    assert leaked.cdi_spec is not None
    cdi.write_claim_spec(tmp_path / "cdi", leaked.cdi_spec, claim_uid="u2")

    repaired = await agent.recover()

    assert repaired == [
        "deleted CDI spec of unrecorded claim u2",
        "re-wrote CDI spec of claim ns/claim-u1",
    ]
    assert set(cdi.list_claim_specs(tmp_path / "cdi", DRIVER)) == {"u1"}
    assert await agent.recover() == []


async def test_prepare_of_a_recorded_claim_answers_from_the_checkpoint(tmp_path: Path) -> None:
    agent = state(tmp_path)
    record = prepared("u1")
    agent.load(checkpoint.Checkpoint({"u1": record}))
    assert await agent.prepare(ClaimRef("ns", "claim-u1", ClaimUID("u1"))) == Prepared.of(record)
    # ... and a spec lost in a reboot is written again on the way.
    assert (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, "u1")).exists()


async def test_unprepare_of_an_unknown_claim_succeeds_and_removes_a_stray_spec(
    tmp_path: Path,
) -> None:
    sink = RecordingSink()
    agent = state(tmp_path, sink)
    stray = prepared("u9").cdi_spec
    assert stray is not None
    cdi.write_claim_spec(tmp_path / "cdi", stray, claim_uid="u9")
    ref = ClaimRef("ns", "gone", ClaimUID("u9"))
    assert await agent.unprepare(ref) is None
    assert await agent.unprepare(ref) is None
    assert cdi.list_claim_specs(tmp_path / "cdi", DRIVER) == {}
    assert sink.calls == []  # nothing of ours was ever in its status


async def test_concurrent_unprepares_share_checkpoint_writes_and_lose_nothing(
    tmp_path: Path,
) -> None:
    sink = RecordingSink()
    agent = state(tmp_path, sink)
    uids = [f"u{i}" for i in range(50)]
    agent.load(checkpoint.Checkpoint({uid: prepared(uid) for uid in uids}))
    keep = uids[:10]
    results = await asyncio.gather(
        *(agent.unprepare(ClaimRef("ns", f"claim-{u}", ClaimUID(u))) for u in uids[10:])
    )
    assert results == [None] * 40
    on_disk = checkpoint.read_checkpoint(tmp_path / "checkpoint" / "checkpoint.json")
    assert sorted(on_disk.claims) == sorted(keep)
    assert sorted(agent.prepared.claims) == sorted(keep)
    assert sorted(uid for uid, entries in sink.calls if entries == []) == sorted(uids[10:])


async def test_recover_rewrites_a_spec_that_a_power_cut_left_empty_or_stale(
    tmp_path: Path,
) -> None:
    # Specs are not fsync'd (the checkpoint is the durable record): after a power cut one may
    # be there by name with no content, or with an older content.
    agent = state(tmp_path)
    agent.load(checkpoint.Checkpoint({"u1": prepared("u1"), "u2": prepared("u2")}))
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, "u1")).write_bytes(b"")
    other = cdi.claim_spec(DRIVER, "u2", [("gpu-1", {"GPU_DEVICE_0": "gpu-1"})])
    cdi.write_claim_spec(tmp_path / "cdi", other, claim_uid="u2")

    repaired = await agent.recover()

    assert repaired == [
        "re-wrote damaged CDI spec of claim ns/claim-u1",
        "re-wrote damaged CDI spec of claim ns/claim-u2",
    ]
    for uid in ("u1", "u2"):
        assert cdi.read_claim_spec(tmp_path / "cdi", DRIVER, uid) == prepared(uid).cdi_spec
    assert await agent.recover() == []


async def test_a_claim_whose_spec_cannot_be_removed_stays_recorded_the_others_go(
    tmp_path: Path,
) -> None:
    agent = state(tmp_path)
    uids = [f"u{i}" for i in range(5)]
    agent.load(checkpoint.Checkpoint({uid: prepared(uid) for uid in uids}))
    for uid in uids:
        spec = prepared(uid).cdi_spec
        assert spec is not None
        cdi.write_claim_spec(tmp_path / "cdi", spec, claim_uid=uid)
    # A directory where u3's spec should be: unlinking it fails, in the commit's thread.
    stuck = tmp_path / "cdi" / cdi.spec_file_name(DRIVER, "u3")
    stuck.unlink()
    stuck.mkdir()

    results = await asyncio.gather(
        *(agent.unprepare(ClaimRef("ns", f"claim-{u}", ClaimUID(u))) for u in uids)
    )

    assert [r is None for r in results] == [True, True, True, False, True]
    on_disk = checkpoint.read_checkpoint(tmp_path / "checkpoint" / "checkpoint.json")
    assert sorted(on_disk.claims) == ["u3"]
    assert sorted(agent.prepared.claims) == ["u3"]


async def test_closing_folds_the_journal_into_the_snapshot_an_older_agent_would_read(
    tmp_path: Path,
) -> None:
    agent = state(tmp_path)
    agent.load(checkpoint.Checkpoint({u: prepared(u) for u in ("u1", "u2")}))
    assert await agent.unprepare(ClaimRef("ns", "claim-u1", ClaimUID("u1"))) is None
    path = tmp_path / "checkpoint" / "checkpoint.json"
    assert set(checkpoint.load(path.read_bytes()).claims) == {"u1", "u2"}, "in the journal"
    assert set(checkpoint.read_checkpoint(path).claims) == {"u2"}

    agent.close()

    assert set(checkpoint.load(path.read_bytes()).claims) == {"u2"}
    assert set(checkpoint.read_checkpoint(path).claims) == {"u2"}


class ClaimsOnly:
    """The one API call prepare makes: GET of a claim, from a dict; counts reads at once."""

    def __init__(self, claims: dict[str, dict[str, Any]]) -> None:
        self.claims = claims
        self.reading = 0
        self.most_at_once = 0

    async def get(self, path: str) -> dict[str, Any]:
        self.reading += 1
        self.most_at_once = max(self.most_at_once, self.reading)
        try:
            await asyncio.sleep(0)  # another prepare may start its read meanwhile
            await asyncio.sleep(0)
            return self.claims[path.rsplit("/", 1)[1]]
        finally:
            self.reading -= 1


def allocated_claim(name: str, uid: str, device: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-01", "device": device}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def test_a_burst_of_prepares_reads_a_bounded_number_of_claims_at_once(
    tmp_path: Path,
) -> None:
    claims = {f"c{i}": allocated_claim(f"c{i}", f"u{i}", f"gpu-{i % 8}") for i in range(200)}
    api = ClaimsOnly(claims)
    agent = state(tmp_path, api=api, gpus=8)
    refs = [ClaimRef("ns", f"c{i}", ClaimUID(f"u{i}")) for i in range(200)]

    results = await agent.prepare_all(refs)

    assert [r for r in results.values() if isinstance(r, PrepareFailed)] == []
    assert api.most_at_once == CLAIM_READS
    assert len(cdi.list_claim_specs(tmp_path / "cdi", DRIVER)) == 200
    on_disk = checkpoint.read_checkpoint(tmp_path / "checkpoint" / "checkpoint.json")
    assert set(on_disk.claims) == {f"u{i}" for i in range(200)}


async def test_a_retired_agent_writes_nothing_and_resumes_from_what_the_other_left(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint" / "checkpoint.json"
    old = state(tmp_path)
    old.load(checkpoint.Checkpoint({"u1": prepared("u1"), "u3": prepared("u3")}))
    assert await old.unprepare(ClaimRef("ns", "claim-u1", ClaimUID("u1"))) is None

    # Another agent took over the kubelet's sockets, and with them the shared directories.
    old.retire("another agent serves the kubelet")
    for uid in ("u2", "u3"):  # unknown, recorded: not even a stray spec is deleted
        refused = await old.unprepare(ClaimRef("ns", f"claim-{uid}", ClaimUID(uid)))
        assert refused is not None
        assert refused.message == (
            f"ResourceClaim ns/claim-{uid}: this agent no longer serves the node: "
            "another agent serves the kubelet"
        )
    assert await old.release_stale() == []
    theirs = checkpoint.Checkpoint({"u4": prepared("u4")})
    checkpoint.write_checkpoint(path, theirs)  # what the other agent wrote meanwhile
    await old.aclose()
    assert checkpoint.read_checkpoint(path) == theirs, "no snapshot of ours over theirs"

    # The other agent went away; ours are the sockets again.
    repaired = await old.resume(checkpoint.read_checkpoint(path))
    assert repaired == ["re-wrote CDI spec of claim ns/claim-u4"]
    assert old.retired is None
    assert old.prepared == theirs
    assert await old.unprepare(ClaimRef("ns", "claim-u4", ClaimUID("u4"))) is None
    assert checkpoint.read_checkpoint(path) == checkpoint.Checkpoint()


async def test_a_health_change_rewrites_the_status_of_the_claims_holding_the_device(
    tmp_path: Path,
) -> None:
    sink = RecordingSink()
    api = ClaimsOnly(
        {
            "on-0": allocated_claim("on-0", "u0", "gpu-0"),
            "on-1": allocated_claim("on-1", "u1", "gpu-1"),
        }
    )
    agent = state(tmp_path, sink, api=api, gpus=2)
    refs = [ClaimRef("ns", "on-0", ClaimUID("u0")), ClaimRef("ns", "on-1", ClaimUID("u1"))]
    await agent.prepare_all(refs)
    sink.calls.clear()

    when = datetime.datetime(2026, 3, 1, 12, 3, tzinfo=datetime.UTC)
    sick = claims.health_condition(False, "DeviceUnhealthy", "XID 79", when)
    agent.device_health("gpu-0", sick)
    [(uid, [entry])] = sink.calls
    assert (uid, entry["device"]) == ("u0", "gpu-0"), "only the claim holding gpu-0"
    assert [c["type"] for c in entry["conditions"]] == ["Ready", "Healthy"]
    assert entry["conditions"][1] == sick

    well = claims.health_condition(True, "DeviceRecovered", "quiet", when)
    agent.device_health("gpu-0", well)
    [(_, [again])] = sink.calls[1:]
    assert [c["status"] for c in again["conditions"]] == ["True", "True"], "replaced, not added"

    # A claim unprepared meanwhile is not written again.
    agent.device_health("gpu-1", sick)
    await agent.unprepare_all([refs[1]])
    sink.calls.clear()
    agent.device_health("gpu-1", well)
    assert sink.calls == []

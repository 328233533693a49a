"""The checkpoint survives restarts intact, and a damaged one is refused with a precise reason."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.agent import cdi, checkpoint, files
from dra_gpu.agent.checkpoint import Checkpoint, CorruptCheckpoint, PreparedClaim, RecordedDevice
from dra_gpu.agent.claims import AllocatedDevice
from dra_gpu.devices import model

DRIVER = "gpu.example.com"
UID = "6f1d3e0a-93c4-4c1e-a2b5-0d8c2f5e7a11"


def prepared_claim(uid: str = UID, devices: tuple[str, ...] = ("gpu-0",)) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="default",
        name=f"claim-{uid[:4]}",
        devices=tuple(
            RecordedDevice(
                request_names=("gpu",),
                pool="node-01",
                device=device,
                cdi_device_ids=(cdi.cdi_device_id(DRIVER, uid, device),),
            )
            for device in devices
        ),
        cdi_spec=cdi.claim_spec(
            DRIVER, uid, [(d, {f"GPU_DEVICE_{i}": d}) for i, d in enumerate(devices)]
        ),
    )


def canonical_checksum(data: Any) -> str:
    """The file format's checksum rule, restated: sha256 of sorted, compact, ASCII JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def rewrite(path: Path, edit: Any, *, fix_checksum: bool) -> None:
    """Change the stored document, optionally re-signing it as a careless tool would."""
    document = json.loads(path.read_bytes())
    edit(document)
    if fix_checksum:
        document["checksum"] = canonical_checksum(document["data"])
    path.write_text(json.dumps(document))


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoint.json"
    state = Checkpoint().with_claim(prepared_claim()).with_claim(prepared_claim("a2", ("gpu-1",)))
    checkpoint.write_checkpoint(path, state)
    return path


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "plugin" / "checkpoint.json"  # the directory is created on demand
    state = (
        Checkpoint()
        .with_claim(prepared_claim(devices=("gpu-0", "gpu-1")))
        .with_claim(PreparedClaim("u2", "team-a", "no-spec", devices=()))
    )
    checkpoint.write_checkpoint(path, state)
    assert checkpoint.read_checkpoint(path) == state
    assert checkpoint.load(checkpoint.dump(state)) == state


def test_the_stored_spec_rewrites_the_same_cdi_file(tmp_path: Path) -> None:
    # After a reboot /var/run/cdi is empty; the recorded spec makes the recorded IDs resolve.
    claim = prepared_claim(devices=("gpu-0", "gpu-1"))
    path = tmp_path / "checkpoint.json"
    checkpoint.write_checkpoint(path, Checkpoint().with_claim(claim))
    restored = checkpoint.read_checkpoint(path).claims[UID]
    assert restored.cdi_spec is not None
    spec_path = cdi.write_claim_spec(tmp_path / "cdi", restored.cdi_spec, claim_uid=UID)
    names = {d["name"] for d in json.loads(spec_path.read_text())["devices"]}
    for device in restored.devices:
        for device_id in device.cdi_device_ids:
            assert device_id.partition("=")[2] in names


def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.read_checkpoint(tmp_path / "absent.json") == Checkpoint()


def test_with_and_without_return_new_checkpoints() -> None:
    empty = Checkpoint()
    one = empty.with_claim(prepared_claim())
    assert empty.claims == {}
    assert set(one.claims) == {UID}
    assert one.without_claim(UID) == empty
    assert one.without_claim("never-prepared") == one
    replaced = one.with_claim(prepared_claim(devices=("gpu-1",)))
    assert [d.device for d in replaced.claims[UID].devices] == ["gpu-1"]
    assert [d.device for d in one.claims[UID].devices] == ["gpu-0"]


def test_claims_cannot_be_changed_in_place_or_misfiled() -> None:
    state = Checkpoint().with_claim(prepared_claim())
    with pytest.raises(TypeError):
        state.claims["x"] = prepared_claim("x")  # type: ignore[index]
    with pytest.raises(ValueError, match="filed under UID other"):
        Checkpoint({"other": prepared_claim()})


def test_dump_is_deterministic() -> None:
    a, b = prepared_claim("a1"), prepared_claim("b2")
    assert checkpoint.dump(Checkpoint({"a1": a, "b2": b})) == checkpoint.dump(
        Checkpoint({"b2": b, "a1": a})
    )


def test_file_is_private_and_no_temp_files_are_left(stored: Path) -> None:
    checkpoint.write_checkpoint(stored, Checkpoint())
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert [p.name for p in stored.parent.iterdir()] == [stored.name]


def test_truncated_file_is_corrupt(stored: Path) -> None:
    content = stored.read_bytes()
    stored.write_bytes(content[: len(content) // 2])
    with pytest.raises(CorruptCheckpoint, match="not valid JSON, truncated") as raised:
        checkpoint.read_checkpoint(stored)
    assert raised.value.path == stored
    assert str(stored) in str(raised.value)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "the top level: expected an object, found list"),
        (b'{"checksum": "x", "data": {}}', "missing key 'version'"),
        (b'{"version": "v1"}', "missing key(s) 'checksum', 'data'"),
        (b'{"version": "v1", "checksum": 7, "data": {}}', "checksum: expected a string"),
    ],
)
def test_malformed_documents_say_what_is_wrong(content: bytes, reason: str) -> None:
    with pytest.raises(CorruptCheckpoint) as raised:
        checkpoint.load(content)
    assert reason in raised.value.reason


def test_bad_checksum_is_corrupt(stored: Path) -> None:
    def rename_claim(document: Any) -> None:
        document["data"]["claims"][0]["name"] = "someone-else"

    rewrite(stored, rename_claim, fix_checksum=False)
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        checkpoint.read_checkpoint(stored)


def test_unknown_version_is_rejected_naming_it(stored: Path) -> None:
    def bump(document: Any) -> None:
        document["version"] = "v9"

    rewrite(stored, bump, fix_checksum=True)
    with pytest.raises(CorruptCheckpoint) as raised:
        checkpoint.read_checkpoint(stored)
    assert raised.value.reason == "unknown checkpoint version 'v9'; this agent reads 'v1'"


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda d: d["data"]["claims"][0]["devices"][0].update(pool=3),
            "data.claims[0].devices[0].pool: expected a string, found int",
        ),
        (
            lambda d: d["data"]["claims"][1].update(devices=None),
            "data.claims[1].devices: expected a list, found null",
        ),
        (
            lambda d: d["data"]["claims"][0]["devices"][0].pop("cdi_device_ids"),
            "data.claims[0].devices[0]: missing key 'cdi_device_ids'",
        ),
        (
            lambda d: d["data"]["claims"][0]["cdi_spec"]["devices"][0]["containerEdits"].update(
                env=[1]
            ),
            "data.claims[0].cdi_spec.devices[0].containerEdits.env[0]: expected a string",
        ),
        (
            lambda d: d["data"]["claims"].append(d["data"]["claims"][0]),
            f"data.claims[2]: claim UID {UID} appears twice",
        ),
    ],
    ids=["pool-int", "devices-null", "ids-missing", "env-int", "uid-twice"],
)
def test_wrong_field_types_are_named(stored: Path, edit: Any, reason: str) -> None:
    # Re-signed, so only the field check can catch it: a bug or a hand edit, not a torn write.
    rewrite(stored, edit, fix_checksum=True)
    with pytest.raises(CorruptCheckpoint) as raised:
        checkpoint.read_checkpoint(stored)
    assert reason in raised.value.reason


def test_quarantine_keeps_the_bad_file(stored: Path) -> None:
    stored.write_bytes(b'{"version": "v1", "chec')
    now = datetime.datetime(2026, 3, 1, 12, 30, 5, tzinfo=datetime.UTC)

    first = checkpoint.quarantine(stored, now=now)
    assert first.name == "checkpoint.json.corrupt-20260301T123005Z"
    assert first.read_bytes() == b'{"version": "v1", "chec'
    assert not stored.exists()
    assert checkpoint.read_checkpoint(stored) == Checkpoint()

    # A second bad file in the same second must not overwrite the first one.
    stored.write_bytes(b"second")
    second = checkpoint.quarantine(stored, now=now)
    assert second.name == "checkpoint.json.corrupt-20260301T123005Z-1"
    assert first.read_bytes() == b'{"version": "v1", "chec'
    assert second.read_bytes() == b"second"


# --- the journal --------------------------------------------------------------------------------


def test_journal_appends_read_back_over_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    a, b = prepared_claim("a1"), prepared_claim("b2", ("gpu-1",))
    journal = checkpoint.Journal(path, Checkpoint({"a1": a}))
    state = Checkpoint({"a1": a})
    for change in ([checkpoint.Put(b)], [checkpoint.Delete("a1"), checkpoint.Delete("zz")]):
        for c in change:
            state = c.apply(state)
        journal.append(change, state)
    journal.close()

    assert checkpoint.read_checkpoint(path) == Checkpoint({"b2": b})
    assert checkpoint.load(path.read_bytes()) == Checkpoint({"a1": a}), "the snapshot is older"
    assert stat.S_IMODE(checkpoint.journal_path(path).stat().st_mode) == 0o600
    lines = checkpoint.journal_path(path).read_bytes().splitlines()
    assert [sorted(json.loads(line)) for line in lines[1:]] == [["change", "checksum"]] * 3


def test_an_append_cut_short_by_a_crash_is_dropped_a_damaged_line_before_others_is_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    a, b = prepared_claim("a1"), prepared_claim("b2")
    journal = checkpoint.Journal(path, Checkpoint())
    journal.append([checkpoint.Put(a)], Checkpoint({"a1": a}))
    journal.append([checkpoint.Put(b)], Checkpoint({"a1": a, "b2": b}))
    journal.close()
    journal_file = checkpoint.journal_path(path)
    whole = journal_file.read_bytes()
    first, second = whole.splitlines()[1:]

    journal_file.write_bytes(whole[: -len(second) // 2])  # the last append, half written
    assert checkpoint.read_checkpoint(path) == Checkpoint({"a1": a})

    journal_file.write_bytes(whole.replace(first, first.replace(b'"a1"', b'"x1"')))
    with pytest.raises(CorruptCheckpoint, match="journal line 2: checksum mismatch") as raised:
        checkpoint.read_checkpoint(path)
    assert raised.value.path == path


def test_a_new_journal_starts_from_a_snapshot_so_nothing_glues_onto_a_damaged_tail(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    a, b = prepared_claim("a1"), prepared_claim("b2")
    journal = checkpoint.Journal(path, Checkpoint())
    journal.append([checkpoint.Put(a)], Checkpoint({"a1": a}))
    journal.close()
    with checkpoint.journal_path(path).open("ab") as torn:
        torn.write(b'{"checksum": "12')  # a crash in the middle of an append

    recorded = checkpoint.read_checkpoint(path)
    journal = checkpoint.Journal(path, recorded)  # as the agent does at its first commit
    journal.append([checkpoint.Put(b)], recorded.with_claim(b))
    journal.close()

    assert checkpoint.read_checkpoint(path) == Checkpoint({"a1": a, "b2": b})
    assert checkpoint.load(path.read_bytes()) == Checkpoint({"a1": a})


def test_a_journal_older_than_its_snapshot_is_ignored_and_a_long_one_is_folded_in(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    a, b = prepared_claim("a1"), prepared_claim("b2")
    journal = checkpoint.Journal(path, Checkpoint(), compact_bytes=10_000)
    journal.append([checkpoint.Put(a)], Checkpoint({"a1": a}))
    # A crash while a new snapshot was written (here: a rebuilt one): the new snapshot is in
    # place, the journal of the old one is still there, and is not applied to it.
    files.atomic_write(path, checkpoint.dump(Checkpoint({"b2": b})), mode=0o600)
    assert checkpoint.read_checkpoint(path) == Checkpoint({"b2": b})
    journal.close()

    state = Checkpoint()
    journal = checkpoint.Journal(path, state, compact_bytes=4_000)
    for i in range(20):  # about 420 bytes each
        claim = prepared_claim(f"c{i}")
        state = state.with_claim(claim)
        journal.append([checkpoint.Put(claim)], state)
    journal.close()
    assert checkpoint.read_checkpoint(path) == state
    assert len(checkpoint.journal_path(path).read_bytes()) < 4_000
    assert len(checkpoint.load(path.read_bytes()).claims) >= 9, "folded into the snapshot"


def test_writing_a_snapshot_drops_the_journal_and_quarantine_keeps_both(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    a = prepared_claim("a1")
    journal = checkpoint.Journal(path, Checkpoint())
    journal.append([checkpoint.Put(a)], Checkpoint({"a1": a}))
    journal.close()
    journal_bytes = checkpoint.journal_path(path).read_bytes()

    now = datetime.datetime(2026, 3, 1, 12, 30, 5, tzinfo=datetime.UTC)
    moved = checkpoint.quarantine(path, now=now)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.json.corrupt-20260301T123005Z",
        "checkpoint.json.journal.corrupt-20260301T123005Z",
    ]
    assert moved.name == "checkpoint.json.corrupt-20260301T123005Z"
    assert (tmp_path / "checkpoint.json.journal.corrupt-20260301T123005Z").read_bytes() == (
        journal_bytes
    )

    checkpoint.Journal(path, Checkpoint({"a1": a})).close()
    checkpoint.write_checkpoint(path, Checkpoint())
    assert not checkpoint.journal_path(path).exists()
    assert checkpoint.read_checkpoint(path) == Checkpoint()


def test_a_whole_last_journal_line_that_says_something_else_is_corrupt_not_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.Journal(path, Checkpoint()).close()
    body = {"rename": "a1"}  # signed as we sign, but no change we ever write
    line = {"checksum": canonical_checksum(body), "change": body}
    with checkpoint.journal_path(path).open("a") as journal:
        journal.write(json.dumps(line) + "\n")
    with pytest.raises(CorruptCheckpoint, match="journal line 2: a change is 'put' or 'delete'"):
        checkpoint.read_checkpoint(path)


def test_the_record_lists_the_allocated_devices_that_the_spec_holds() -> None:
    # Prepare and the rebuild of a corrupt checkpoint both build the record here.
    allocated = [
        AllocatedDevice("gpu", "node-01", "gpu-0"),
        AllocatedDevice("gpu/b", "node-01", "gpu-1"),
    ]
    spec = cdi.claim_spec(DRIVER, UID, [("gpu-1", {"GPU_DEVICE_0": "gpu-1"})])
    record = checkpoint.record_claim(DRIVER, UID, "default", "c", allocated, spec)
    assert record.devices == (
        RecordedDevice(("gpu",), "node-01", "gpu-1", (cdi.cdi_device_id(DRIVER, UID, "gpu-1"),)),
    )
    assert record.cdi_spec == spec
    assert checkpoint.record_claim(DRIVER, UID, "default", "c", allocated, None).devices == ()


MIG = model.MigInstance(model.MigPlacement("gpu-0", "3g.20gb", 4), 2, 0, "MIG-1234")


def test_a_mig_instance_round_trips_and_records_without_one_still_load(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    plain = prepared_claim("a2", ("gpu-1",))
    with_mig = prepared_claim(devices=("gpu-0-mig-3g-20gb-4",)).with_mig_instance(
        "gpu-0-mig-3g-20gb-4", MIG
    )
    state = Checkpoint().with_claim(with_mig).with_claim(plain)
    checkpoint.write_checkpoint(path, state)
    assert checkpoint.read_checkpoint(path) == state
    devices = {c["uid"]: c["devices"][0] for c in json.loads(path.read_bytes())["data"]["claims"]}
    assert devices[UID]["mig_instance"] == {
        "parent": "gpu-0",
        "profile": "3g.20gb",
        "start": 4,
        "gpu_instance": 2,
        "compute_instance": 0,
        "uuid": "MIG-1234",
    }
    assert "mig_instance" not in devices["a2"]  # what an older agent wrote and reads


def test_a_mig_instance_made_again_renames_its_device_in_the_spec() -> None:
    device = "gpu-0-mig-3g-20gb-4"
    claim = PreparedClaim(
        UID,
        "ns",
        "a",
        (RecordedDevice(("gpu",), "node-01", device, (), MIG),),
        cdi.claim_spec(
            DRIVER, UID, [(device, {"NVIDIA_VISIBLE_DEVICES": "MIG-1234", "KEEP": "MIG-12345"})]
        ),
    )
    again = dataclasses.replace(MIG, gpu_instance=1, uuid="MIG-9999")
    updated = claim.with_mig_instance(device, again)
    assert updated.mig_instances() == [again]
    assert updated.cdi_spec is not None
    assert updated.cdi_spec["devices"][0]["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=MIG-9999",
        "KEEP=MIG-12345",  # only values that are the old UUID, whole
    ]


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda i: i.update(start="4"), "mig_instance.start: expected an integer, found str"),
        (lambda i: i.pop("uuid"), "mig_instance: missing key 'uuid'"),
        (
            lambda i: i.update(gpu_instance=True),
            "mig_instance.gpu_instance: expected an integer, found bool",
        ),
    ],
)
def test_a_bad_mig_instance_record_is_named(tmp_path: Path, edit: Any, reason: str) -> None:
    path = tmp_path / "checkpoint.json"
    claim = prepared_claim(devices=("gpu-0-mig-3g-20gb-4",)).with_mig_instance(
        "gpu-0-mig-3g-20gb-4", MIG
    )
    checkpoint.write_checkpoint(path, Checkpoint().with_claim(claim))
    rewrite(
        path,
        lambda d: edit(d["data"]["claims"][0]["devices"][0]["mig_instance"]),
        fix_checksum=True,
    )
    with pytest.raises(CorruptCheckpoint) as raised:
        checkpoint.read_checkpoint(path)
    assert f"data.claims[0].devices[0].{reason}" in raised.value.reason

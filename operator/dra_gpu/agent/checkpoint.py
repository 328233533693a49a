"""Checkpoint of the claims this agent prepared on this node.

Unprepare carries only a claim's namespace, name and UID, the ResourceClaim may be gone by then,
and CDI specs live on a tmpfs that a reboot empties. So this file is how a restarted agent knows
what it prepared: which devices, which CDI IDs it returned, and the spec content to write again.

This module owns the record and its file format; it does not prepare anything, talk to the API
or decide what to do with a corrupt file (``quarantine`` only moves one aside). The record
types are immutable: ``with_claim`` / ``without_claim`` return new checkpoints. The file is a
snapshot, written whole with ``write_checkpoint`` (atomic, mode 0600), plus a journal of the
changes since, which the agent appends with ``Journal.append`` before it answers the kubelet:
one small append and one ``fdatasync`` per group of changes, where a snapshot costs a new
file, its fsync, a rename and the directory's fsync. ``read_checkpoint`` reads both.

File format (version ``v1``)::

    {"version": "v1",
     "checksum": "<sha256 hex of the canonical JSON of data>",
     "data": {"claims": [{"uid": ..., "namespace": ..., "name": ...,
                          "devices": [{"request_names": [...], "pool": ..., "device": ...,
                                       "cdi_device_ids": [...],      (ours last)
                                       "share_id": ...,                (optional)
                                       "mig_instance": {...}}],        (optional)
                          "cdi_spec": {<CDI spec>} or null}]}}

``share_id`` (only for a share of a device several claims hold at once) is the allocation's
``shareID``. ``mig_instance`` (only for a MIG partition whose instance the agent created):
``{"parent": "gpu-0", "profile": "3g.20gb", "start": 4, "gpu_instance": 1,
"compute_instance": 0, "uuid": "MIG-..."}``, enough to destroy it at unprepare and to create
it again after a reboot. Both are optional within ``v1``: older agents read such a file and
ignore the keys.

Canonical JSON = keys sorted, no whitespace, ASCII only. The checksum catches a file that is
complete JSON but not what we wrote (a torn write on a file system without atomic rename, a
hand edit); a truncated file already fails to parse.

Journal (``<checkpoint file>.journal``, version ``v1``), one JSON document per line::

    {"journal": "v1", "snapshot": "<checksum of the snapshot it follows>"}
    {"checksum": "<sha256 of the canonical JSON of change>", "change": {"put": <claim>}}
    {"checksum": "...", "change": {"delete": "<claim UID>"}}

Replayed in order over the snapshot whose checksum the header names; a journal that names
another snapshot (or none exists) is left over from before the last snapshot, which already
holds its changes, and is ignored. Only the last line may be damaged (an append that a crash
cut short was never acknowledged, so it is dropped); a damaged line before a good one makes
the checkpoint corrupt. Appending after a damaged line would glue onto it, so a ``Journal``
starts with a fresh snapshot, and writes one again once the journal has grown
``compact_bytes`` (then the journal starts over).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypedDict, cast

from dra_gpu.agent import cdi, files
from dra_gpu.agent.claims import AllocatedDevice
from dra_gpu.devices import model

CHECKPOINT_VERSION: Final = "v1"
"""The version this agent writes."""

SUPPORTED_VERSIONS: Final = ("v1",)
"""The versions this agent reads. A new format adds its version here and keeps loading v1."""

FILE_MODE: Final = 0o600
"""Only the agent (root) reads it: it names every claim on the node."""


class CorruptCheckpoint(ValueError):
    """The checkpoint file cannot be trusted; ``reason`` says precisely why."""

    def __init__(self, reason: str, path: Path | None = None) -> None:
        self.reason = reason
        self.path = path
        where = f"checkpoint {path}" if path is not None else "checkpoint"
        super().__init__(f"{where} is corrupt: {reason}")


# --- the record ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as returned to the kubelet."""

    request_names: tuple[str, ...]
    """Top-level request names this device serves (``"gpu"``, never ``"gpu/large"``)."""
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    """In the order the runtime applies them: ours last (one, or after the toolkit's own device
    on a node set up for CDI only: ``agent.toolkit``). A record keeps the IDs it was prepared
    with; an older agent reads and answers them as they are."""
    mig_instance: model.MigInstance | None = None
    """The MIG instance created for this device (a MIG partition), destroyed at unprepare."""
    share_id: str | None = None
    """The allocation's share of a device several claims hold at once; None: whole."""


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    """A claim this agent prepared, with everything unprepare and a reboot need."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    cdi_spec: cdi.CdiSpec | None = None
    """The CDI spec written for this claim, kept whole (treat as read-only). Writing it again
    after a reboot makes the recorded ``cdi_device_ids`` resolve again, even if the driver's
    configuration changed in between; None when no spec was needed."""

    def mig_instances(self) -> list[model.MigInstance]:
        return [d.mig_instance for d in self.devices if d.mig_instance is not None]

    def with_mig_instance(
        self,
        device: str,
        instance: model.MigInstance,
        device_nodes: Sequence[cdi.DeviceNode] | None = None,
    ) -> PreparedClaim:
        """This claim with ``instance`` as the MIG instance of ``device``: one created again
        after a reboot, whose MIG device may have another UUID and other GPU and compute
        instance ids. The spec's environment values that named the old UUID for that device
        name the new one; ``device_nodes``, when given, replace that device's ``deviceNodes``
        (the new instance's capability nodes)."""
        old = next(d.mig_instance for d in self.devices if d.device == device)
        devices = tuple(
            dataclasses.replace(d, mig_instance=instance) if d.device == device else d
            for d in self.devices
        )
        spec = self.cdi_spec
        if spec is None:
            return dataclasses.replace(self, devices=devices)
        renamed = old is not None and bool(old.uuid) and old.uuid != instance.uuid
        name = cdi.cdi_device_name(self.uid, device)
        entries: list[cdi.CdiDevice] = []
        for entry in spec["devices"]:
            if entry["name"] == name:
                container_edits = entry["containerEdits"]
                if renamed and old is not None:
                    container_edits = _with_env_value(container_edits, old, instance)
                if device_nodes is not None:
                    container_edits = {**container_edits, "deviceNodes": list(device_nodes)}
                    if not device_nodes:
                        del container_edits["deviceNodes"]
                entry = {**entry, "containerEdits": container_edits}
            entries.append(entry)
        spec = {**spec, "devices": entries}
        if renamed and old is not None and "containerEdits" in spec:
            # The claim's NVIDIA_VISIBLE_DEVICES lists it too.
            spec["containerEdits"] = _with_env_value(spec["containerEdits"], old, instance)
        return dataclasses.replace(self, devices=devices, cdi_spec=spec)


def _with_env_value(
    edits: cdi.ContainerEdits, old: model.MigInstance, new: model.MigInstance
) -> cdi.ContainerEdits:
    """``edits`` with the old MIG device's UUID replaced by the new one's wherever a variable's
    value, or an item of a comma-separated list (``NVIDIA_VISIBLE_DEVICES``), is that UUID."""
    env = []
    for entry in edits["env"]:
        key, _, value = entry.partition("=")
        items = [new.uuid if item == old.uuid else item for item in value.split(",")]
        env.append(f"{key}={','.join(items)}")
    return {**edits, "env": env}


def record_claim(
    driver: str,
    uid: str,
    namespace: str,
    name: str,
    allocated: Iterable[AllocatedDevice],
    spec: cdi.CdiSpec | None,
    mig_instances: Mapping[str, model.MigInstance] | None = None,
    other_ids: Mapping[str, Sequence[str]] | None = None,
) -> PreparedClaim:
    """The record of a claim prepared with ``spec``: one entry for each allocated device that
    the spec holds, with the CDI device ID that resolves to it there (after ``other_ids``, by
    device name: the toolkit's own device, ``agent.toolkit``), and the MIG instance created
    for it (``mig_instances``, by device name) if any.

    Prepare and the rebuild of a corrupt checkpoint (from the API server and the CDI directory)
    both build the record here, so a change of the record is made once."""
    in_spec = {d["name"] for d in spec["devices"]} if spec is not None else set()
    instances = mig_instances or {}
    others = other_ids or {}
    devices = tuple(
        PreparedDevice(
            request_names=(a.base_request,),
            pool=a.pool,
            device=a.device,
            cdi_device_ids=(*others.get(a.device, ()), cdi.cdi_device_id(driver, uid, a.key)),
            mig_instance=instances.get(a.device),
            share_id=a.share_id,
        )
        for a in allocated
        if cdi.cdi_device_name(uid, a.key) in in_spec
    )
    return PreparedClaim(uid, namespace, name, devices, spec)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Every claim prepared on this node, by claim UID."""

    claims: Mapping[str, PreparedClaim] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for uid, claim in self.claims.items():
            if uid != claim.uid:
                raise ValueError(f"claim {claim.uid} is filed under UID {uid}")
        # A read-only view of a private copy: "immutable" must hold for the mapping too.
        object.__setattr__(self, "claims", types.MappingProxyType(dict(self.claims)))

    def with_claim(self, claim: PreparedClaim) -> Checkpoint:
        """A checkpoint that also records ``claim`` (replacing an entry with its UID)."""
        return Checkpoint({**self.claims, claim.uid: claim})

    def without_claim(self, uid: str) -> Checkpoint:
        """A checkpoint without claim ``uid``; the same content if it was not recorded."""
        return Checkpoint({k: v for k, v in self.claims.items() if k != uid})


@dataclasses.dataclass(frozen=True)
class Put:
    """A change: record ``claim`` (replacing an entry with its UID)."""

    claim: PreparedClaim

    def apply(self, checkpoint: Checkpoint) -> Checkpoint:
        return checkpoint.with_claim(self.claim)


@dataclasses.dataclass(frozen=True)
class Delete:
    """A change: forget claim ``uid`` (nothing if it was not recorded)."""

    uid: str

    def apply(self, checkpoint: Checkpoint) -> Checkpoint:
        return checkpoint.without_claim(self.uid)


Change = Put | Delete


# --- JSON bodies --------------------------------------------------------------------------------


class MigInstanceRecord(TypedDict):
    parent: str
    profile: str
    start: int
    gpu_instance: int
    compute_instance: int | None
    uuid: str


class _DeviceRecord(TypedDict):
    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]


class DeviceRecord(_DeviceRecord, total=False):
    mig_instance: MigInstanceRecord
    share_id: str


class ClaimRecord(TypedDict):
    uid: str
    namespace: str
    name: str
    devices: list[DeviceRecord]
    cdi_spec: cdi.CdiSpec | None


class CheckpointData(TypedDict):
    claims: list[ClaimRecord]


class CheckpointFile(TypedDict):
    version: str
    checksum: str
    data: CheckpointData


def dump(checkpoint: Checkpoint) -> bytes:
    """The file content for ``checkpoint``: versioned, checksummed, indented for people."""
    return _dump(checkpoint)[0]


def _dump(checkpoint: Checkpoint) -> tuple[bytes, str]:
    data: CheckpointData = {
        "claims": [_claim_record(checkpoint.claims[uid]) for uid in sorted(checkpoint.claims)]
    }
    document: CheckpointFile = {
        "version": CHECKPOINT_VERSION,
        "checksum": _checksum(data),
        "data": data,
    }
    return json.dumps(document, indent=2).encode() + b"\n", document["checksum"]


def _claim_record(claim: PreparedClaim) -> ClaimRecord:
    return {
        "uid": claim.uid,
        "namespace": claim.namespace,
        "name": claim.name,
        "devices": [_device_record(device) for device in claim.devices],
        "cdi_spec": claim.cdi_spec,
    }


def _device_record(device: PreparedDevice) -> DeviceRecord:
    record: DeviceRecord = {
        "request_names": list(device.request_names),
        "pool": device.pool,
        "device": device.device,
        "cdi_device_ids": list(device.cdi_device_ids),
    }
    if device.share_id is not None:
        record["share_id"] = device.share_id
    instance = device.mig_instance
    if instance is not None:
        record["mig_instance"] = {
            "parent": instance.placement.parent,
            "profile": instance.placement.profile,
            "start": instance.placement.start,
            "gpu_instance": instance.gpu_instance,
            "compute_instance": instance.compute_instance,
            "uuid": instance.uuid,
        }
    return record


def _checksum(data: object) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def load(data: bytes) -> Checkpoint:
    """Parse a checkpoint file's content; CorruptCheckpoint says what is wrong with it."""
    return _load(data)[0]


def _load(data: bytes) -> tuple[Checkpoint, str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptCheckpoint(f"not UTF-8 text (bad byte at offset {error.start})") from None
    if not text.strip():
        raise CorruptCheckpoint("the file is empty (truncated?)")
    try:
        document: Any = json.loads(text)
    except ValueError as error:
        raise CorruptCheckpoint(f"not valid JSON, truncated or damaged: {error}") from None
    except RecursionError:
        raise CorruptCheckpoint("not valid JSON: nested too deeply") from None
    top = _object(document, "the top level")

    # The version decides the meaning of everything else, so it is checked first.
    if "version" not in top:
        raise CorruptCheckpoint("missing key 'version'")
    version = top["version"]
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(repr(v) for v in SUPPORTED_VERSIONS)
        raise CorruptCheckpoint(
            f"unknown checkpoint version {version!r}; this agent reads {supported}"
        )
    missing = [key for key in ("checksum", "data") if key not in top]
    if missing:
        raise CorruptCheckpoint(f"missing key(s) {', '.join(repr(k) for k in missing)}")
    recorded = _string(top["checksum"], "checksum")
    body = _object(top["data"], "data")
    try:
        actual = _checksum(body)
    except ValueError:  # NaN or Infinity: we never write those
        raise CorruptCheckpoint("data holds a number JSON cannot represent") from None
    if recorded != actual:
        raise CorruptCheckpoint(f"checksum mismatch: file says {recorded}, data hashes to {actual}")
    return _checkpoint(body), actual


# --- the journal --------------------------------------------------------------------------------

JOURNAL_VERSION: Final = "v1"
JOURNAL_SUFFIX: Final = ".journal"
COMPACT_BYTES: Final = 1 << 20
"""A journal this long is folded into a new snapshot (about a thousand prepared claims)."""


def journal_path(path: Path) -> Path:
    """The journal of the checkpoint file ``path``."""
    return path.with_name(path.name + JOURNAL_SUFFIX)


def _journal_header(snapshot_checksum: str) -> bytes:
    header = {"journal": JOURNAL_VERSION, "snapshot": snapshot_checksum}
    return json.dumps(header, separators=(",", ":")).encode() + b"\n"


def _journal_line(change: Change) -> bytes:
    body: dict[str, Any]
    if isinstance(change, Put):
        body = {"put": _claim_record(change.claim)}
    else:
        body = {"delete": change.uid}
    line = {"checksum": _checksum(body), "change": body}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _replay(checkpoint: Checkpoint, snapshot_checksum: str, data: bytes) -> Checkpoint:
    """``checkpoint`` with the journal ``data`` applied, if the journal follows it."""
    lines = data.split(b"\n")
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("journal") != JOURNAL_VERSION:
        if len(lines) == 1:
            return checkpoint  # a header cut short: nothing was ever appended
        raise CorruptCheckpoint(f"journal: line 1 is not a {JOURNAL_VERSION} journal header")
    if header.get("snapshot") != snapshot_checksum:
        return checkpoint  # left over from before the snapshot, which holds its changes
    entries = lines[1:]
    while entries and not entries[-1]:
        entries.pop()
    for number, line in enumerate(entries, start=2):
        try:
            change = _change(line, f"journal line {number}")
        except _Torn:
            if number == len(entries) + 1:
                break  # the last append, cut short by a crash: never acknowledged
            raise
        checkpoint = change.apply(checkpoint)
    return checkpoint


class _Torn(CorruptCheckpoint):
    """A journal line that is not what was written whole: a cut-short append, if it is last."""


def _change(line: bytes, where: str) -> Change:
    try:
        document: Any = json.loads(line)
    except ValueError as error:
        raise _Torn(f"{where}: not valid JSON: {error}") from None
    try:
        top = _object(document, where)
        body = _object(_key(top, "change", where), f"{where}.change")
        checksum = _key(top, "checksum", where)
    except CorruptCheckpoint as error:
        raise _Torn(error.reason) from None
    if _checksum(body) != checksum:
        raise _Torn(f"{where}: checksum mismatch")
    if "put" in body:
        return Put(_claim(_object(body["put"], f"{where}.put"), f"{where}.put"))
    if "delete" in body:
        return Delete(_string(body["delete"], f"{where}.delete"))
    raise CorruptCheckpoint(f"{where}: a change is 'put' or 'delete', not {sorted(body)}")


class Journal:
    """The agent's writer of the checkpoint at ``path``: changes appended durably, one
    ``fdatasync`` per call, and a fresh snapshot at start and whenever the journal has grown
    ``compact_bytes``. Blocking: call it from a thread. One writer per file."""

    def __init__(
        self, path: Path, checkpoint: Checkpoint, *, compact_bytes: int = COMPACT_BYTES
    ) -> None:
        self.path = path
        self.compact_bytes = compact_bytes
        self._fd: int | None = None
        self._size = 0
        self.compact(checkpoint)

    def compact(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` as the snapshot and start an empty journal after it."""
        self.close()
        checksum = write_checkpoint(self.path, checkpoint)
        header = _journal_header(checksum)
        journal = journal_path(self.path)
        files.atomic_write(journal, header, mode=FILE_MODE)
        self._fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = len(header)

    def append(self, changes: Sequence[Change], result: Checkpoint) -> None:
        """Record ``changes`` (which turn the checkpoint so far into ``result``) durably."""
        if self._fd is None:  # an earlier append failed half way: start over from a snapshot
            self.compact(result)
            return
        data = b"".join(_journal_line(change) for change in changes)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fdatasync(self._fd)
        except OSError as error:
            self.close()  # what reached the file is unknown: never append after it
            error.add_note(f"appending to the journal of checkpoint {self.path}")
            raise
        self._size += len(data)
        if self._size >= self.compact_bytes:
            self.compact(result)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


# --- validation of parsed JSON ------------------------------------------------------------------


def _checkpoint(body: dict[str, Any]) -> Checkpoint:
    claims: dict[str, PreparedClaim] = {}
    for i, item in enumerate(_list(_key(body, "claims", "data"), "data.claims")):
        claim = _claim(_object(item, f"data.claims[{i}]"), f"data.claims[{i}]")
        if claim.uid in claims:
            raise CorruptCheckpoint(f"data.claims[{i}]: claim UID {claim.uid} appears twice")
        claims[claim.uid] = claim
    return Checkpoint(claims)


def _claim(record: dict[str, Any], where: str) -> PreparedClaim:
    devices = _list(_key(record, "devices", where), f"{where}.devices")
    spec = _key(record, "cdi_spec", where)
    return PreparedClaim(
        uid=_string(_key(record, "uid", where), f"{where}.uid"),
        namespace=_string(_key(record, "namespace", where), f"{where}.namespace"),
        name=_string(_key(record, "name", where), f"{where}.name"),
        devices=tuple(
            _device(_object(item, f"{where}.devices[{j}]"), f"{where}.devices[{j}]")
            for j, item in enumerate(devices)
        ),
        cdi_spec=None if spec is None else _cdi_spec(spec, f"{where}.cdi_spec"),
    )


def _device(record: dict[str, Any], where: str) -> PreparedDevice:
    instance = record.get("mig_instance")
    share = record.get("share_id")
    return PreparedDevice(
        request_names=_strings(_key(record, "request_names", where), f"{where}.request_names"),
        pool=_string(_key(record, "pool", where), f"{where}.pool"),
        device=_string(_key(record, "device", where), f"{where}.device"),
        cdi_device_ids=_strings(_key(record, "cdi_device_ids", where), f"{where}.cdi_device_ids"),
        mig_instance=None
        if instance is None
        else _mig_instance(_object(instance, f"{where}.mig_instance"), f"{where}.mig_instance"),
        share_id=None if share is None else _string(share, f"{where}.share_id"),
    )


def _mig_instance(record: dict[str, Any], where: str) -> model.MigInstance:
    compute = _key(record, "compute_instance", where)
    return model.MigInstance(
        model.MigPlacement(
            _string(_key(record, "parent", where), f"{where}.parent"),
            _string(_key(record, "profile", where), f"{where}.profile"),
            _int(_key(record, "start", where), f"{where}.start"),
        ),
        gpu_instance=_int(_key(record, "gpu_instance", where), f"{where}.gpu_instance"),
        compute_instance=None if compute is None else _int(compute, f"{where}.compute_instance"),
        uuid=_string(_key(record, "uuid", where), f"{where}.uuid"),
    )


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(where, "an integer", value)
    return value


def _cdi_spec(value: object, where: str) -> cdi.CdiSpec:
    # Checked as deep as we will use it: the agent writes it back verbatim after a reboot.
    spec = _object(value, where)
    _string(_key(spec, "cdiVersion", where), f"{where}.cdiVersion")
    _string(_key(spec, "kind", where), f"{where}.kind")
    for k, item in enumerate(_list(_key(spec, "devices", where), f"{where}.devices")):
        device_where = f"{where}.devices[{k}]"
        device = _object(item, device_where)
        _string(_key(device, "name", device_where), f"{device_where}.name")
        edits_where = f"{device_where}.containerEdits"
        edits = _object(_key(device, "containerEdits", device_where), edits_where)
        _strings(_key(edits, "env", edits_where), f"{edits_where}.env")
    if "containerEdits" in spec:  # the claim's edits (written since claim-level edits came)
        edits = _object(spec["containerEdits"], f"{where}.containerEdits")
        _strings(_key(edits, "env", f"{where}.containerEdits"), f"{where}.containerEdits.env")
    return cast(cdi.CdiSpec, spec)


def _key(record: dict[str, Any], key: str, where: str) -> Any:
    if key not in record:
        raise CorruptCheckpoint(f"{where}: missing key {key!r}")
    return record[key]


def _type_error(where: str, expected: str, value: object) -> CorruptCheckpoint:
    found = "null" if value is None else type(value).__name__
    return CorruptCheckpoint(f"{where}: expected {expected}, found {found}")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(where, "an object", value)
    return cast(dict[str, Any], value)


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _type_error(where, "a list", value)
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _type_error(where, "a string", value)
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    return tuple(_string(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


# --- the file -----------------------------------------------------------------------------------


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint stored at ``path`` (its snapshot and journal); an empty one if there is
    no file yet.

    Raises CorruptCheckpoint (naming the path) for a file that cannot be trusted; the caller
    decides whether to ``quarantine`` it.
    """
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return Checkpoint()  # a journal without its snapshot is a leftover: see the format
    try:
        snapshot, checksum = _load(content)
    except CorruptCheckpoint as error:
        raise CorruptCheckpoint(error.reason, path=path) from None
    try:
        journal = journal_path(path).read_bytes()
    except FileNotFoundError:
        return snapshot
    try:
        return _replay(snapshot, checksum, journal)
    except CorruptCheckpoint as error:
        raise CorruptCheckpoint(error.reason, path=path) from None


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> str:
    """Store ``checkpoint`` at ``path`` atomically (mode 0600), creating the directory; an
    older journal goes. Returns the snapshot's checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content, checksum = _dump(checkpoint)
    files.atomic_write(path, content, mode=FILE_MODE)
    files.remove(journal_path(path))
    return checksum


def quarantine(path: Path, *, now: datetime.datetime | None = None) -> Path:
    """Move a bad checkpoint aside to ``<name>.corrupt-<UTC timestamp>`` (its journal, if any,
    to ``<name>.journal.corrupt-<UTC timestamp>``); return the snapshot's new path.

    The files are kept for inspection, never deleted: an earlier quarantined file with the
    same timestamp gets a numbered neighbour instead of being overwritten. ``now`` is for tests.
    """
    moment = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
    target = _aside(path, moment)
    journal = journal_path(path)
    if journal.exists():
        _aside(journal, moment)
    files.fsync_directory(path.parent)
    return target


def _aside(path: Path, moment: datetime.datetime) -> Path:
    base = f"{path.name}.corrupt-{moment:%Y%m%dT%H%M%SZ}"
    target = path.with_name(base)
    attempt = 0
    # Only this agent writes here (one per node), so checking before renaming cannot race.
    while target.exists():
        attempt += 1
        target = path.with_name(f"{base}-{attempt}")
    os.rename(path, target)
    return target

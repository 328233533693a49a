"""Version ``v1`` of the checkpoint file: the snapshot's content, written and read back.

Owns the snapshot's bytes: ``dump`` writes a ``records.Checkpoint`` as a document, ``load``
reads one back and says precisely what is wrong with one it cannot trust (``CorruptCheckpoint``);
a claim's JSON record here is also what a journal line carries (``journal``). Must not touch a
file (``storage`` does) nor decide what to do with a corrupt one.

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
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final, TypedDict, cast

from dra_gpu.agent import cdi
from dra_gpu.agent.checkpoint.records import Checkpoint, PreparedClaim, RecordedDevice
from dra_gpu.devices import model

CHECKPOINT_VERSION: Final = "v1"
"""The version this agent writes."""

SUPPORTED_VERSIONS: Final = ("v1",)
"""The versions this agent reads. A new format adds its version here and keeps loading v1."""


class CorruptCheckpoint(ValueError):
    """The checkpoint file cannot be trusted; ``reason`` says precisely why."""

    def __init__(self, reason: str, path: Path | None = None) -> None:
        self.reason = reason
        self.path = path
        where = f"checkpoint {path}" if path is not None else "checkpoint"
        super().__init__(f"{where} is corrupt: {reason}")


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
    return dump_checksummed(checkpoint)[0]


def dump_checksummed(checkpoint: Checkpoint) -> tuple[bytes, str]:
    """``dump``, and the checksum the file carries (a journal's header names it)."""
    data: CheckpointData = {
        "claims": [claim_record(checkpoint.claims[uid]) for uid in sorted(checkpoint.claims)]
    }
    document: CheckpointFile = {
        "version": CHECKPOINT_VERSION,
        "checksum": checksum(data),
        "data": data,
    }
    return json.dumps(document, indent=2).encode() + b"\n", document["checksum"]


def claim_record(claim: PreparedClaim) -> ClaimRecord:
    """A claim's JSON record: an item of ``data.claims``, and of a journal's ``put``."""
    return {
        "uid": claim.uid,
        "namespace": claim.namespace,
        "name": claim.name,
        "devices": [_device_record(device) for device in claim.devices],
        "cdi_spec": claim.cdi_spec,
    }


def _device_record(device: RecordedDevice) -> DeviceRecord:
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


def checksum(data: object) -> str:
    """The sha256 hex of ``data``'s canonical JSON (ValueError for NaN or Infinity)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def load(data: bytes) -> Checkpoint:
    """Parse a checkpoint file's content; CorruptCheckpoint says what is wrong with it."""
    return load_checksummed(data)[0]


def load_checksummed(data: bytes) -> tuple[Checkpoint, str]:
    """``load``, and the checksum the file carries (the journal to replay names it)."""
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
    top = as_object(document, "the top level")

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
    recorded = as_string(top["checksum"], "checksum")
    body = as_object(top["data"], "data")
    try:
        actual = checksum(body)
    except ValueError:  # NaN or Infinity: we never write those
        raise CorruptCheckpoint("data holds a number JSON cannot represent") from None
    if recorded != actual:
        raise CorruptCheckpoint(f"checksum mismatch: file says {recorded}, data hashes to {actual}")
    return _checkpoint(body), actual


# --- validation of parsed JSON ------------------------------------------------------------------
# (``claim_from``, ``member``, ``as_object`` and ``as_string`` read a journal's lines too)


def _checkpoint(body: dict[str, Any]) -> Checkpoint:
    claims: dict[str, PreparedClaim] = {}
    for i, item in enumerate(_list(member(body, "claims", "data"), "data.claims")):
        claim = claim_from(as_object(item, f"data.claims[{i}]"), f"data.claims[{i}]")
        if claim.uid in claims:
            raise CorruptCheckpoint(f"data.claims[{i}]: claim UID {claim.uid} appears twice")
        claims[claim.uid] = claim
    return Checkpoint(claims)


def claim_from(record: dict[str, Any], where: str) -> PreparedClaim:
    """The claim of its JSON record ``record``, found at ``where`` (CorruptCheckpoint if bad)."""
    devices = _list(member(record, "devices", where), f"{where}.devices")
    spec = member(record, "cdi_spec", where)
    return PreparedClaim(
        uid=as_string(member(record, "uid", where), f"{where}.uid"),
        namespace=as_string(member(record, "namespace", where), f"{where}.namespace"),
        name=as_string(member(record, "name", where), f"{where}.name"),
        devices=tuple(
            _device(as_object(item, f"{where}.devices[{j}]"), f"{where}.devices[{j}]")
            for j, item in enumerate(devices)
        ),
        cdi_spec=None if spec is None else _cdi_spec(spec, f"{where}.cdi_spec"),
    )


def _device(record: dict[str, Any], where: str) -> RecordedDevice:
    instance = record.get("mig_instance")
    share = record.get("share_id")
    return RecordedDevice(
        request_names=_strings(member(record, "request_names", where), f"{where}.request_names"),
        pool=as_string(member(record, "pool", where), f"{where}.pool"),
        device=as_string(member(record, "device", where), f"{where}.device"),
        cdi_device_ids=_strings(member(record, "cdi_device_ids", where), f"{where}.cdi_device_ids"),
        mig_instance=None
        if instance is None
        else _mig_instance(as_object(instance, f"{where}.mig_instance"), f"{where}.mig_instance"),
        share_id=None if share is None else as_string(share, f"{where}.share_id"),
    )


def _mig_instance(record: dict[str, Any], where: str) -> model.MigInstance:
    compute = member(record, "compute_instance", where)
    return model.MigInstance(
        model.MigPlacement(
            as_string(member(record, "parent", where), f"{where}.parent"),
            as_string(member(record, "profile", where), f"{where}.profile"),
            _int(member(record, "start", where), f"{where}.start"),
        ),
        gpu_instance=_int(member(record, "gpu_instance", where), f"{where}.gpu_instance"),
        compute_instance=None if compute is None else _int(compute, f"{where}.compute_instance"),
        uuid=as_string(member(record, "uuid", where), f"{where}.uuid"),
    )


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(where, "an integer", value)
    return value


def _cdi_spec(value: object, where: str) -> cdi.CdiSpec:
    # Checked as deep as we will use it: the agent writes it back verbatim after a reboot.
    spec = as_object(value, where)
    as_string(member(spec, "cdiVersion", where), f"{where}.cdiVersion")
    as_string(member(spec, "kind", where), f"{where}.kind")
    for k, item in enumerate(_list(member(spec, "devices", where), f"{where}.devices")):
        device_where = f"{where}.devices[{k}]"
        device = as_object(item, device_where)
        as_string(member(device, "name", device_where), f"{device_where}.name")
        edits_where = f"{device_where}.containerEdits"
        edits = as_object(member(device, "containerEdits", device_where), edits_where)
        _strings(member(edits, "env", edits_where), f"{edits_where}.env")
    if "containerEdits" in spec:  # the claim's edits (written since claim-level edits came)
        edits = as_object(spec["containerEdits"], f"{where}.containerEdits")
        _strings(member(edits, "env", f"{where}.containerEdits"), f"{where}.containerEdits.env")
    return cast(cdi.CdiSpec, spec)


def member(record: dict[str, Any], key: str, where: str) -> Any:
    """``record[key]``; CorruptCheckpoint, naming ``where``, if it is missing."""
    if key not in record:
        raise CorruptCheckpoint(f"{where}: missing key {key!r}")
    return record[key]


def _type_error(where: str, expected: str, value: object) -> CorruptCheckpoint:
    found = "null" if value is None else type(value).__name__
    return CorruptCheckpoint(f"{where}: expected {expected}, found {found}")


def as_object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(where, "an object", value)
    return cast(dict[str, Any], value)


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _type_error(where, "a list", value)
    return value


def as_string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _type_error(where, "a string", value)
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    return tuple(as_string(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))

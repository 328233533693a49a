"""The checkpoint's journal: the changes since the snapshot, one line each, and their replay.

Owns the journal's lines (``header``, ``line``) and ``replay``, which applies a journal's
content to the snapshot it follows. Must not touch a file: ``storage.Journal`` appends the lines
and ``storage.read_checkpoint`` replays what it reads.

Journal (``<checkpoint file>.journal``, version ``v1``), one JSON document per line::

    {"journal": "v1", "snapshot": "<checksum of the snapshot it follows>"}
    {"checksum": "<sha256 of the canonical JSON of change>", "change": {"put": <claim>}}
    {"checksum": "...", "change": {"delete": "<claim UID>"}}

Replayed in order over the snapshot whose checksum the header names; a journal that names
another snapshot (or none exists) is left over from before the last snapshot, which already
holds its changes, and is ignored. Only the last line may be damaged (an append that a crash
cut short was never acknowledged, so it is dropped); a damaged line before a good one makes
the checkpoint corrupt. Appending after a damaged line would glue onto it, so a
``storage.Journal`` starts with a fresh snapshot, and writes one again once the journal has
grown ``compact_bytes`` (then the journal starts over).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from dra_gpu.agent.checkpoint import v1
from dra_gpu.agent.checkpoint.records import Change, Checkpoint, Delete, Put

JOURNAL_VERSION: Final = "v1"
JOURNAL_SUFFIX: Final = ".journal"


def journal_path(path: Path) -> Path:
    """The journal of the checkpoint file ``path``."""
    return path.with_name(path.name + JOURNAL_SUFFIX)


def header(snapshot_checksum: str) -> bytes:
    """The first line of a journal that follows the snapshot with ``snapshot_checksum``."""
    body = {"journal": JOURNAL_VERSION, "snapshot": snapshot_checksum}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def line(change: Change) -> bytes:
    """The journal line of ``change``."""
    body: dict[str, Any]
    if isinstance(change, Put):
        body = {"put": v1.claim_record(change.claim)}
    else:
        body = {"delete": change.uid}
    document = {"checksum": v1.checksum(body), "change": body}
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def replay(checkpoint: Checkpoint, snapshot_checksum: str, data: bytes) -> Checkpoint:
    """``checkpoint`` with the journal ``data`` applied, if the journal follows it."""
    lines = data.split(b"\n")
    try:
        first = json.loads(lines[0])
    except ValueError:
        first = None
    if not isinstance(first, dict) or first.get("journal") != JOURNAL_VERSION:
        if len(lines) == 1:
            return checkpoint  # a header cut short: nothing was ever appended
        raise v1.CorruptCheckpoint(f"journal: line 1 is not a {JOURNAL_VERSION} journal header")
    if first.get("snapshot") != snapshot_checksum:
        return checkpoint  # left over from before the snapshot, which holds its changes
    entries = lines[1:]
    while entries and not entries[-1]:
        entries.pop()
    for number, entry in enumerate(entries, start=2):
        try:
            change = _change(entry, f"journal line {number}")
        except _Torn:
            if number == len(entries) + 1:
                break  # the last append, cut short by a crash: never acknowledged
            raise
        checkpoint = change.apply(checkpoint)
    return checkpoint


class _Torn(v1.CorruptCheckpoint):
    """A journal line that is not what was written whole: a cut-short append, if it is last."""


def _change(entry: bytes, where: str) -> Change:
    try:
        document: Any = json.loads(entry)
    except ValueError as error:
        raise _Torn(f"{where}: not valid JSON: {error}") from None
    try:
        top = v1.as_object(document, where)
        body = v1.as_object(v1.member(top, "change", where), f"{where}.change")
        checksum = v1.member(top, "checksum", where)
    except v1.CorruptCheckpoint as error:
        raise _Torn(error.reason) from None
    if v1.checksum(body) != checksum:
        raise _Torn(f"{where}: checksum mismatch")
    if "put" in body:
        return Put(v1.claim_from(v1.as_object(body["put"], f"{where}.put"), f"{where}.put"))
    if "delete" in body:
        return Delete(v1.as_string(body["delete"], f"{where}.delete"))
    raise v1.CorruptCheckpoint(f"{where}: a change is 'put' or 'delete', not {sorted(body)}")

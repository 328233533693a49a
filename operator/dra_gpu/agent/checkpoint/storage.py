"""The checkpoint's files: the snapshot and its journal on disk.

Owns every read and write of them. The snapshot is written whole with ``write_checkpoint``
(atomic, mode 0600); the journal of the changes since, which the agent appends with
``Journal.append`` before it answers the kubelet, costs one small append and one ``fdatasync``
per group of changes, where a snapshot costs a new file, its fsync, a rename and the
directory's fsync. ``read_checkpoint`` reads both. Must not decide what to do with a corrupt
file: ``quarantine`` only moves one aside. Blocking: async callers run it in a thread.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from dra_gpu.agent import files
from dra_gpu.agent.checkpoint import journal, v1
from dra_gpu.agent.checkpoint.records import Change, Checkpoint

FILE_MODE: Final = 0o600
"""Only the agent (root) reads it: it names every claim on the node."""

COMPACT_BYTES: Final = 1 << 20
"""A journal this long is folded into a new snapshot (about a thousand prepared claims)."""


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
        snapshot, checksum = v1.load_checksummed(content)
    except v1.CorruptCheckpoint as error:
        raise v1.CorruptCheckpoint(error.reason, path=path) from None
    try:
        changes = journal.journal_path(path).read_bytes()
    except FileNotFoundError:
        return snapshot
    try:
        return journal.replay(snapshot, checksum, changes)
    except v1.CorruptCheckpoint as error:
        raise v1.CorruptCheckpoint(error.reason, path=path) from None


FileState = tuple[tuple[int, int, int, int, int] | None, ...]
"""What ``files_state`` says of a checkpoint's two files."""


def files_state(path: Path) -> FileState:
    """The identity, size and modification times of the snapshot at ``path`` and of its
    journal (None for a file that is not there): what another writer's change changes. Every
    write replaces the snapshot (a new inode) or appends to the journal (a new size), so two
    equal states mean nobody wrote in between."""
    found: list[tuple[int, int, int, int, int] | None] = []
    for file in (path, journal.journal_path(path)):
        try:
            st = file.stat()
        except FileNotFoundError:
            found.append(None)
            continue
        found.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(found)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> str:
    """Store ``checkpoint`` at ``path`` atomically (mode 0600), creating the directory; an
    older journal goes. Returns the snapshot's checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content, checksum = v1.dump_checksummed(checkpoint)
    files.atomic_write(path, content, mode=FILE_MODE)
    files.remove(journal.journal_path(path))
    return checksum


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
        header = journal.header(checksum)
        path = journal.journal_path(self.path)
        files.atomic_write(path, header, mode=FILE_MODE)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = len(header)

    def append(self, changes: Sequence[Change], result: Checkpoint) -> None:
        """Record ``changes`` (which turn the checkpoint so far into ``result``) durably."""
        if self._fd is None:  # an earlier append failed half way: start over from a snapshot
            self.compact(result)
            return
        data = b"".join(journal.line(change) for change in changes)
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


def quarantine(path: Path, *, now: datetime.datetime | None = None) -> Path:
    """Move a bad checkpoint aside to ``<name>.corrupt-<UTC timestamp>`` (its journal, if any,
    to ``<name>.journal.corrupt-<UTC timestamp>``); return the snapshot's new path.

    The files are kept for inspection, never deleted: an earlier quarantined file with the
    same timestamp gets a numbered neighbour instead of being overwritten. ``now`` is for tests.
    """
    moment = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
    target = _aside(path, moment)
    journal_file = journal.journal_path(path)
    if journal_file.exists():
        _aside(journal_file, moment)
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

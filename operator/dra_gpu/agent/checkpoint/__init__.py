"""Checkpoint of the claims this agent prepared on this node.

Unprepare carries only a claim's namespace, name and UID, the ResourceClaim may be gone by then,
and CDI specs live on a tmpfs that a reboot empties. So this file is how a restarted agent knows
what it prepared: which devices, which CDI IDs it returned, and the spec content to write again.

The package owns the record and its files; it does not prepare anything, talk to the API or
decide what to do with a corrupt file (``quarantine`` only moves one aside). Its modules:

    records   the record in memory (``Checkpoint``, ``PreparedClaim``, ``RecordedDevice``) and
              its changes (``Put``, ``Delete``); immutable
    v1        the snapshot's file format, version ``v1``: ``dump``, ``load``, ``CorruptCheckpoint``
    journal   the journal's lines (the changes since the snapshot) and their replay
    storage   the files: ``read_checkpoint``, ``write_checkpoint``, ``Journal``, ``quarantine``

Versioning rule: what one version writes, the previous version reads. An agent of version N
may be rolled back to N-1 (``helm rollback``), and in a rolling update the two run side by side
on one node (``commits.SerializeLock`` keeps them apart), so:

- The snapshot is always written in a format the previous version reads: ``v1`` until a
  release whose predecessor already reads its successor. A change within ``v1`` only adds
  optional keys (as ``share_id`` and ``mig_instance`` were added) that older readers ignore
  and whose absence newer readers accept; a key is never renamed, retyped or made required.
- A new format gets a new version string, is read by one release (added to
  ``v1.SUPPORTED_VERSIONS``) before a later release writes it, and the release that writes it
  still reads every version the previous one wrote.
- The journal is an addition the snapshot does not depend on: a clean stop folds it into the
  snapshot (``DeviceState.aclose``, also folding in what another agent journaled), so a
  reader of the snapshot alone (agents before the journal) sees every prepared claim; and a
  journal whose header names another snapshot is ignored, so an older snapshot writer's file
  is never misread with a stale journal.
- Tested: ``tests/unit/agent/test_checkpoint_versions.py`` reads what this code writes (with a
  journal, then a clean stop) with the last snapshot-only reader, taken from git history.

Callers use the names below as ``checkpoint.X``.
"""

from dra_gpu.agent.checkpoint.journal import journal_path
from dra_gpu.agent.checkpoint.records import (
    Change,
    Checkpoint,
    Delete,
    PreparedClaim,
    Put,
    RecordedDevice,
    changes_between,
    merged,
    record_claim,
)
from dra_gpu.agent.checkpoint.storage import (
    FileState,
    Journal,
    files_state,
    quarantine,
    read_checkpoint,
    write_checkpoint,
)
from dra_gpu.agent.checkpoint.v1 import CorruptCheckpoint, dump, load

__all__ = [
    "Change",
    "Checkpoint",
    "CorruptCheckpoint",
    "Delete",
    "FileState",
    "Journal",
    "PreparedClaim",
    "Put",
    "RecordedDevice",
    "changes_between",
    "dump",
    "files_state",
    "journal_path",
    "load",
    "merged",
    "quarantine",
    "read_checkpoint",
    "record_claim",
    "write_checkpoint",
]

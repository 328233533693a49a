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
    record_claim,
)
from dra_gpu.agent.checkpoint.storage import (
    Journal,
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
    "Journal",
    "PreparedClaim",
    "Put",
    "RecordedDevice",
    "dump",
    "journal_path",
    "load",
    "quarantine",
    "read_checkpoint",
    "record_claim",
    "write_checkpoint",
]

"""Group commit of the agent's checkpoint: changes queued together, written in one go.

A prepare or an unprepare gets its answer only once its change is on stable storage: an append
to the checkpoint's journal and one ``fdatasync`` (``checkpoint.Journal``). Whoever finds no
write in progress writes every change queued meanwhile, in one thread, so claims prepared at
the same time share one append; each change may bring blocking file work (its claim's CDI spec
written or deleted), done by the same thread just before the append, and a change whose file
work failed is left out of it.

Owns the checkpoint as committed (``GroupCommit.committed``, which ``DeviceState.prepared``
shows), the journal it appends to and the gauges of what is prepared. Must not decide what a
change is (``state`` does) nor write anything once ``retired``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dra_gpu.agent import checkpoint, failpoints
from dra_gpu.serving import metrics


@dataclasses.dataclass
class _Pending:
    """A checkpoint change waiting for the next group commit."""

    change: checkpoint.Change
    done: asyncio.Future[None]
    files: Callable[[], None] | None = None
    """Blocking file work (a claim's spec written or deleted) done in the commit's thread just
    before the checkpoint; if it fails, the change is left out and ``done`` gets the error."""


class GroupCommit:
    """The writer of the checkpoint file ``path``, for one event loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.retired: str | None = None
        """Why this agent no longer writes the checkpoint, if it does not (``DeviceState.retire``):
        commits fail, and a batch already queued is not written."""
        self._checkpoint = checkpoint.Checkpoint()
        self._pending: list[_Pending] = []
        self._committing = False
        self._journal: checkpoint.Journal | None = None  # opened by the first commit
        self._writing: asyncio.Future[Any] | None = None  # the commit's thread, while it runs

    @property
    def committed(self) -> checkpoint.Checkpoint:
        """What is committed: every change whose ``commit`` returned."""
        return self._checkpoint

    def load(self, recorded: checkpoint.Checkpoint) -> None:
        """Start from ``recorded`` (read from disk); the next commit writes a new snapshot."""
        self.drop_journal()
        self._checkpoint = recorded
        self._update_gauges()

    async def commit(
        self, change: checkpoint.Change, files: Callable[[], None] | None = None
    ) -> None:
        """Apply ``change`` to the checkpoint and return once it is on disk, after ``files``
        (the claim's spec work) succeeded. Whoever finds no write in progress writes every
        change queued meanwhile, in one go, in one thread."""
        if self.retired is not None:
            raise RuntimeError(f"this agent no longer writes {self.path}: {self.retired}")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(change, done, files))
        if not self._committing:
            self._committing = True
            try:
                while self._pending:
                    batch, self._pending = self._pending, []
                    # Shielded: a thread cannot be cancelled, and ``aclose`` must know when
                    # the last write is over even if whoever waited for it was cancelled.
                    self._writing = asyncio.ensure_future(
                        asyncio.to_thread(self._write_batch, self._checkpoint, batch)
                    )
                    try:
                        updated, failed = await asyncio.shield(self._writing)
                    except Exception as exc:
                        for pending in batch:
                            pending.done.set_exception(exc)
                        continue
                    self._checkpoint = updated
                    self._update_gauges()
                    for i, pending in enumerate(batch):
                        if i in failed:
                            pending.done.set_exception(failed[i])
                        else:
                            pending.done.set_result(None)
            finally:
                self._committing = False
        await done

    async def written(self) -> None:
        """Until no commit's thread is writing."""
        writing = self._writing
        if writing is not None and not writing.done():
            await asyncio.wait([writing])
        if writing is not None and not writing.cancelled():
            writing.exception()  # reported to its waiters already; here only retrieved

    def drop_journal(self) -> None:
        """Close the journal without writing anything."""
        if self._journal is not None:
            journal, self._journal = self._journal, None
            journal.close()

    def close(self) -> None:
        """Fold the journal into a snapshot (an older agent reads only that) and close it.
        Blocking; call it once nothing is committed any more."""
        if self._journal is not None:
            journal, self._journal = self._journal, None
            try:
                journal.compact(self._checkpoint)
            finally:
                journal.close()

    def _write_batch(
        self, current: checkpoint.Checkpoint, batch: Sequence[_Pending]
    ) -> tuple[checkpoint.Checkpoint, dict[int, Exception]]:
        """(In a thread.) Each pending change's file work, then the checkpoint with the
        changes whose file work succeeded: the one durable write of the whole batch."""
        if self.retired is not None:  # retired while this batch waited for the thread
            raise RuntimeError(f"no longer writing {self.path}: {self.retired}")
        updated = current
        failed: dict[int, Exception] = {}
        changes: list[checkpoint.Change] = []
        for i, pending in enumerate(batch):
            if pending.files is not None:
                try:
                    pending.files()
                except Exception as exc:
                    failed[i] = exc
                    continue
            changes.append(pending.change)
            updated = pending.change.apply(updated)
        if changes:
            journal = self._journal
            if journal is None:
                journal = self._journal = checkpoint.Journal(self.path, current)
            journal.append(changes, updated)
            failpoints.reach("checkpoint-written")
        return updated, failed

    def _update_gauges(self) -> None:
        claims_ = self._checkpoint.claims.values()
        metrics.PREPARED_CLAIMS.set(len(claims_))
        metrics.PREPARED_DEVICES.set(sum(len(c.devices) for c in claims_))

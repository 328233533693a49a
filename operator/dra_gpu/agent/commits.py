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

Two agents on one node (the old and the new pod of a rolling update) share the checkpoint
file. ``SerializeLock`` (a ``flock`` on ``<checkpoint dir>/serialize.lock``, upstream's
``Serialize`` option of its kubelet plugin helper) keeps their prepares and unprepares apart;
whoever takes it reads the checkpoint again if the other agent wrote it since its own last
read or write (``GroupCommit.read_if_changed``: the files' identity, size and times), so the
claims it holds in memory are never stale while it acts on them. A reload drops our journal:
the other agent may have replaced the file it appends to, so the next commit starts over from
a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from dra_gpu.agent import checkpoint, failpoints
from dra_gpu.kube import backoff
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

LOCK_BACKOFF = backoff.Backoff(duration=0.002, factor=2.0, jitter=0.5, cap=0.05)
"""While another agent holds the serialize lock, the pauses between tries: 2 ms, doubling up to
50 ms, each up to half as long again, so that two agents waiting for each other's lock (a
rolling update) do not poll in step."""


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
        self._seen: checkpoint.FileState | None = None
        """The checkpoint's files as we last read or wrote them (None: not known yet)."""
        self._reloaded = False  # read again from another agent's files since our last write

    @property
    def committed(self) -> checkpoint.Checkpoint:
        """What is committed: every change whose ``commit`` returned."""
        return self._checkpoint

    def load(self, recorded: checkpoint.Checkpoint) -> None:
        """Start from ``recorded`` (read from disk just now); the next commit writes a new
        snapshot."""
        self.drop_journal()
        self._checkpoint = recorded
        self._seen = checkpoint.files_state(self.path)  # two stat calls
        self._update_gauges()

    def read_if_changed(self) -> checkpoint.Checkpoint | None:
        """(In a thread, holding the serialize lock, no commit under way.) The checkpoint as
        stored, if someone else wrote it since we last read or wrote it; None if not, or if we
        never loaded it (the runner's first ``load`` does). CorruptCheckpoint if unreadable."""
        seen = checkpoint.files_state(self.path)
        if self._seen is None or seen == self._seen:
            return None
        recorded = checkpoint.read_checkpoint(self.path)
        self._seen = seen
        return recorded

    def reloaded(self, recorded: checkpoint.Checkpoint) -> None:
        """Continue from ``recorded`` (``read_if_changed``'s): our journal may be a file the
        other writer replaced, so the next commit starts from a snapshot."""
        self.drop_journal()
        self._checkpoint = recorded
        self._reloaded = True
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

    def write_snapshot(self) -> None:
        """(In a thread, holding the serialize lock, no commit under way.) Write what is
        committed as a new snapshot now (a merge made it differ from the files)."""
        self.drop_journal()
        checkpoint.write_checkpoint(self.path, self._checkpoint)
        self._seen = checkpoint.files_state(self.path)
        self._reloaded = False

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
                self._seen = checkpoint.files_state(self.path)
            finally:
                journal.close()
        elif self._reloaded:  # another agent's journal, read again: folded in too
            checkpoint.write_checkpoint(self.path, self._checkpoint)
            self._seen = checkpoint.files_state(self.path)
        self._reloaded = False

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
            self._seen = checkpoint.files_state(self.path)
            failpoints.reach("checkpoint-written")
        return updated, failed

    def _update_gauges(self) -> None:
        claims_ = self._checkpoint.claims.values()
        metrics.PREPARED_CLAIMS.set(len(claims_))
        metrics.PREPARED_DEVICES.set(sum(len(c.devices) for c in claims_))


class SerializeLock:
    """The node's lock on prepares and unprepares, shared with the other agents of the
    checkpoint directory: a ``flock`` on ``path`` (created mode 0600), held while any holder
    of this process holds it (``held``), so one agent's concurrent calls still run together
    and share their group commits, and never beside another agent's.

    Taken with non-blocking tries on the event loop, a few milliseconds apart while another
    agent holds it (only while two agents overlap, in a rolling update), never in a thread: a
    thread blocked in ``flock`` cannot be cancelled, and would keep a stopping agent from
    exiting for as long as the other holds the lock. ``on_acquired`` runs once each time it is
    taken, before any holder goes on (the checkpoint's re-read); ``before_release`` once the
    last holder is done, before it is let go (a write still under way finishes first).
    ``timing``: the clock, sleeps and jitter of the tries (a test's, or the real ones)."""

    def __init__(
        self,
        path: Path,
        *,
        on_acquired: Callable[[], Awaitable[None]] | None = None,
        before_release: Callable[[], Awaitable[None]] | None = None,
        timing: backoff.Timing = backoff.REAL,
    ) -> None:
        self.path = path
        self.timing = timing
        self.on_acquired = on_acquired
        self.before_release = before_release
        self.waited_seconds = 0.0
        """How long this process waited for another agent to let go, in all (tests, logs)."""
        self._fd: int | None = None
        self._locked = False
        self._holders = 0
        self._acquiring: asyncio.Future[None] | None = None

    @property
    def locked(self) -> bool:
        return self._locked

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold the lock (with this process's other holders) for the block."""
        self._holders += 1
        try:
            while not self._locked or self._acquiring is not None:
                if self._acquiring is None:
                    self._acquiring = asyncio.ensure_future(self._acquire())
                # Shielded: a cancelled waiter must not leave the lock taken and unowned.
                await asyncio.shield(self._acquiring)
            yield
        finally:
            self._holders -= 1
            if self._holders == 0 and self._locked:
                await asyncio.shield(asyncio.ensure_future(self._release()))

    async def _acquire(self) -> None:
        try:
            if self._fd is None:
                self._fd = await asyncio.to_thread(self._open)
            started = self.timing.clock()
            await self._lock(self._fd)
            self._locked = True
            waited = self.timing.clock() - started
            if waited > 0.1:
                log.info("waited %.1f s for another agent to let go of %s", waited, self.path)
            self.waited_seconds += waited
            if self.on_acquired is not None:
                await self.on_acquired()
        except BaseException:
            if self._locked:
                self._unlock()
            raise
        finally:
            self._acquiring = None
            if self._locked and self._holders == 0:  # every waiter was cancelled meanwhile
                self._unlock()

    async def _lock(self, fd: int) -> None:
        """Take the ``flock`` with non-blocking tries, backing off between them."""
        pauses = LOCK_BACKOFF.delays(self.timing)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                await pauses.wait()

    async def _release(self) -> None:
        if self.before_release is not None:
            await self.before_release()
        if self._holders == 0 and self._locked and self._acquiring is None:
            self._unlock()

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _unlock(self) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._locked = False

    def close(self) -> None:
        """Let go of the file (the lock with it, if held)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._locked = False
            os.close(fd)

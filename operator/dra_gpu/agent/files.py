"""Durable, atomic file writes for what the agent keeps on the node (CDI specs, checkpoint).

A reader (a container runtime scanning /var/run/cdi, or the agent itself after a crash) must see
either the old file or the new one, never half of one. This module owns that mechanism and
nothing else: it knows no file formats and no Kubernetes. Its functions block on fsync, so
async callers run them in a thread (``asyncio.to_thread``).

``durable=False`` keeps the atomicity (readers still see the old or the new file, whole, also
after the writing process crashed) and drops the fsyncs: after a power cut such a change may be
lost or, on some file systems, leave an empty file. That is for files that something durable
can re-create (the agent's CDI specs, from its checkpoint), not for the source of truth.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".tmp"
"""Temporary files end here, never in ``.json``/``.yaml``: CDI runtimes load every such file."""


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new content, whole;
    with ``durable``, also on stable storage when this returns.

    The temporary file lives in the same directory (a rename is only atomic within one file
    system) and is hidden by a leading dot; it gets ``mode`` before any content is visible.
    The parent directory must exist.
    """
    try:
        fd, tmp_name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX
        )
    except OSError as error:
        error.add_note(f"creating a temporary file in {path.parent} to write {path.name}")
        raise
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as stream:
            # mkstemp creates 0600 and the umask must not decide what a runtime may read.
            os.fchmod(stream.fileno(), mode)
            stream.write(data)
            stream.flush()
            if durable:
                os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(error, OSError):
            error.add_note(f"writing {path} atomically (via {tmp.name})")
        raise
    # The rename itself lives in the directory; without this a power cut may undo it.
    if durable:
        fsync_directory(path.parent)


def remove(path: Path, *, durable: bool = True) -> bool:
    """Delete ``path`` (``durable``: on stable storage when this returns); True if it
    existed. Deleting a missing file is not an error."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if durable:
        fsync_directory(path.parent)
    return True


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (creations, renames, deletions) to stable storage."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

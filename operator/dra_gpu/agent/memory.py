"""Giving memory back after a burst: the agent runs on every GPU node, for weeks.

A burst of claims (a node's pods all started at once) leaves the process larger than it needs
to be once the burst is over: glibc's allocator keeps what the burst's objects and gRPC's
per-call buffers used, in each arena, until asked to give it back. Every ``period`` seconds this
reads the resident size (``/proc/self/statm``: no allocation, no system call beyond the read);
when it has grown by ``grow_mib`` since the last look that gave memory back, it collects
Python's garbage and calls ``malloc_trim(0)``, which returns the free pages of every arena to the
kernel. Idle: one small read per period. Where there is no glibc (musl, say), it does nothing.

Owns: nothing of the agent's state; touches the process's allocator only.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

log = logging.getLogger(__name__)
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def resident_mib(statm: Path = Path("/proc/self/statm")) -> float:
    """This process's resident memory in MiB (the second field of ``statm``, in pages)."""
    return int(statm.read_text().split()[1]) * _PAGE_MIB


@functools.cache
def _malloc_trim() -> Callable[[], object] | None:
    # The interpreter's own symbols, the C library's among them: no library search (which
    # would start ldconfig), and None where the C library has no malloc_trim (musl).
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def give_back() -> float:
    """Collect garbage and return free allocator pages to the kernel; MiB given back."""
    before = resident_mib()
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim()
    return before - resident_mib()


async def trim_after_bursts(period: float = 1.0, grow_mib: float = 4.0) -> NoReturn:
    """Forever: ``give_back`` once a burst is over — the resident size grew by ``grow_mib``
    since the last time (or since the start) and held still for a ``period`` (a collection
    during the burst would stall the calls in flight)."""
    baseline = last = resident_mib()
    while True:
        await asyncio.sleep(period)
        now = resident_mib()
        settled = abs(now - last) < 0.5
        last = now
        if not settled or now - baseline < grow_mib:
            continue
        freed = give_back()
        baseline = last = resident_mib()
        log.debug("gave back %.1f MiB after a burst; resident %.1f MiB", freed, baseline)

"""The cyclic garbage collector of a process with a large heap that lives as long as it does.

CPython's full collection (generation 2) walks every object the collector tracks. The
controller holds the cluster's view (pods, claims, slices, classes, and Kopf's own state) for
as long as it runs, so each full collection walked all of it: 50-800 ms at the admission
benchmark's size on 2 cores (300 nodes x 8 GPUs, 11,800 pods, claims created at 10/s), every
few seconds, the event loop stopped meanwhile — admission reviews, ``/metrics`` and the
lease's renewals with it.

``Collector``: after each full collection, what survived it goes to the permanent generation
(``gc.freeze``), so the next one walks only what was promoted since. A frozen object is still
freed by reference counting the moment nothing refers to it; only one that later becomes part
of a garbage cycle waits, until the next reclaim: every ``reclaim_seconds`` (an hour)
everything is unfrozen and collected once — one long pause an hour instead of one every few
seconds. Every collection's pause is in ``dra_gpu_gc_pause_seconds``.

Owns: the collector's callback and the freezing. Must not: disable the collector or change
its thresholds (how often it runs stays CPython's).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, NoReturn

from prometheus_client import Histogram

FREEZE_CHECK_SECONDS = 0.5
"""How soon after a full collection its survivors are frozen (from the event loop)."""
RECLAIM_SECONDS = 3600.0
"""How often everything is unfrozen and collected: the frozen cycles' memory back."""


class Collector:
    """Freezes what survives each full collection; observes every pause into ``pauses``
    (labelled by generation)."""

    def __init__(self, pauses: Histogram, *, reclaim_seconds: float = RECLAIM_SECONDS) -> None:
        self.pauses = pauses
        self.reclaim_seconds = reclaim_seconds
        self._started = 0.0
        self._freeze_due = False
        for generation in range(3):
            pauses.labels(str(generation))

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.pauses.labels(str(info["generation"])).observe(time.perf_counter() - self._started)
        if info["generation"] == 2:
            self._freeze_due = True

    async def run_forever(self) -> NoReturn:
        """Watch the collections until cancelled; the callback goes with the task."""
        loop = asyncio.get_running_loop()
        gc.callbacks.append(self._callback)
        try:
            reclaimed = loop.time()
            while True:
                await asyncio.sleep(FREEZE_CHECK_SECONDS)
                if loop.time() - reclaimed >= self.reclaim_seconds:
                    gc.unfreeze()
                    gc.collect()  # its callback asks for the freeze
                    reclaimed = loop.time()
                if self._freeze_due:
                    self._freeze_due = False
                    gc.freeze()
        finally:
            gc.callbacks.remove(self._callback)
            gc.unfreeze()

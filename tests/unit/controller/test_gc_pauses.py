"""The controller's garbage-collector policy: survivors of a full collection frozen, pauses
observed, everything collected once per reclaim period."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from dra_gpu.serving import collector


def pauses() -> Histogram:
    return Histogram("pauses", "test", ["generation"], registry=CollectorRegistry())


def observed(histogram: Histogram, generation: str) -> float:
    return float(histogram.labels(generation)._sum.get())


async def test_what_survives_a_full_collection_is_frozen_and_each_pause_observed() -> None:
    histogram = pauses()
    task = asyncio.create_task(collector.Collector(histogram).run_forever())
    await asyncio.sleep(0)  # the callback is in
    kept = [[object()] for _ in range(1000)]  # survivors: tracked lists
    gc.collect(1)
    gc.collect()
    await asyncio.sleep(collector.FREEZE_CHECK_SECONDS * 2)
    assert gc.get_freeze_count() >= len(kept)
    assert observed(histogram, "1") > 0
    assert observed(histogram, "2") > 0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert gc.get_freeze_count() == 0  # unfrozen as it stops
    assert not [cb for cb in gc.callbacks if getattr(cb, "__self__", None) is not None]


async def test_a_cycle_frozen_while_alive_is_freed_at_the_next_reclaim() -> None:
    policy = collector.Collector(pauses(), reclaim_seconds=collector.FREEZE_CHECK_SECONDS * 4)
    task = asyncio.create_task(policy.run_forever())
    await asyncio.sleep(0)

    class Node:
        other: Node

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect()
    await asyncio.sleep(collector.FREEZE_CHECK_SECONDS * 1.5)  # survivors frozen
    del a, b  # a garbage cycle now, but frozen: a full collection does not walk it
    gc.collect()
    assert gone() is not None
    await asyncio.sleep(collector.FREEZE_CHECK_SECONDS * 4)  # the reclaim ran
    assert gone() is None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_kopfs_worker_for_an_object_ends_soon_after_its_event() -> None:
    # A worker waiting for an object's next event keeps its task and the last event's body
    # alive: thousands of them, walked by every full collection, at a big cluster's listing.
    import kopf
    from kopf._core.intents.causes import Activity

    from dra_gpu.controller import view, wiring

    handlers = wiring.registry(view.ClusterView(), lambda: None)
    settings = kopf.OperatorSettings()
    assert settings.queueing.idle_timeout == 5.0  # Kopf's own
    for handler in handlers._activities.get_handlers(activity=Activity.STARTUP):
        configure: Callable[..., object] = handler.fn  # Kopf passes more; it takes **_
        configure(settings=settings)
    assert settings.queueing.idle_timeout == wiring.WORKER_IDLE_SECONDS <= 0.5

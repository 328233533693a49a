"""Which devices a list of CEL selectors admits, pool by pool, kept while the pool is unchanged.

Owns: the outcome of a list of compiled selectors (a DeviceClass's, a request's) on each device
of a pool — None when every selector accepts the device, else the first one that does not: its
index in the list and its ``cel.Evaluation`` (an error, or a plain "no"), in the order the
scheduler evaluates them. An entry is reused for as long as the pool is the same ``Pool`` object
(the view builds a new one only when one of the pool's slices changes) and dropped with the list
(``keep_only``) or the pool (``forget_pools``). Devices alike in what a selector reads share one
CEL evaluation below this (``cel.evaluate_device``).

Must not: do I/O, or know about classes, claims or metrics; callers say which lists matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dra_gpu import cel
from dra_gpu.controller.published import Pool, PublishedDevice

Outcome = tuple[int, cel.Evaluation] | None
"""None: every selector accepts the device; else (index of the first that does not, its result)."""
ListKey = tuple[str, ...]
PoolKey = tuple[str, str]

_ALL_PASS: dict[int, tuple[Outcome, ...]] = {}


def list_key(selectors: Sequence[cel.Compiled]) -> ListKey:
    return tuple(c.expression for c in selectors)


def first_failure(selectors: Sequence[cel.Compiled], device: PublishedDevice) -> Outcome:
    """The first selector that does not accept ``device``, and why; None if all do."""
    values = device.values
    for index, compiled in enumerate(selectors):
        evaluation = cel.evaluate_device(compiled, values)
        if evaluation.error is not None or not evaluation.matched:
            return index, evaluation
    return None


def admits(outcome: Outcome) -> bool:
    return outcome is None


def candidate(outcome: Outcome) -> bool:
    """Not ruled out by a plain "no": every selector accepts it, or one fails with an error."""
    return outcome is None or outcome[1].error is not None


class Selections:
    def __init__(self) -> None:
        self._lists: dict[ListKey, dict[PoolKey, tuple[Pool, tuple[Outcome, ...]]]] = {}

    def outcomes(self, selectors: Sequence[cel.Compiled], pool: Pool) -> tuple[Outcome, ...]:
        """Each device's outcome, aligned with ``pool.devices``."""
        per_pool = self._lists.setdefault(list_key(selectors), {})
        cached = per_pool.get(pool.key)
        if cached is not None and cached[0] is pool:
            return cached[1]
        found = compute(selectors, pool)
        per_pool[pool.key] = (pool, found)
        return found

    def keep_only(self, keys: Iterable[ListKey]) -> None:
        """Forget every list but these (classes deleted or edited, requests gone)."""
        wanted = set(keys)
        for key in set(self._lists) - wanted:
            del self._lists[key]

    def forget_pools(self, keys: Iterable[PoolKey]) -> None:
        """Forget pools that are gone (a changed pool is recomputed on its next use anyway)."""
        gone = list(keys)
        for per_pool in self._lists.values():
            for key in gone:
                per_pool.pop(key, None)

    def __len__(self) -> int:
        return len(self._lists)


def compute(selectors: Sequence[cel.Compiled], pool: Pool) -> tuple[Outcome, ...]:
    """``Selections.outcomes`` without the cache (for a pool as it was, before a change)."""
    found = tuple(first_failure(selectors, d) for d in pool.devices)
    if not any(found):  # most lists admit most devices: share one tuple of Nones per size
        found = _ALL_PASS.setdefault(len(found), found)
    return found

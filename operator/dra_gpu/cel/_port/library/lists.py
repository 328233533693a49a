"""cel-go's ext lists library (version 3) and Kubernetes' lists library (version 1).

cel-go: ``slice``, ``flatten``, ``lists.range``, ``reverse``, ``distinct``, ``sort``, ``sortBy``
(the macro's ``@sortByAssociatedKeys``), ``first``, ``last``. Kubernetes: ``sum``, ``min``,
``max``, ``isSorted``, ``indexOf``, ``lastIndexOf``. Elements compare with cel-go's equality and
ordering (``standard``); the errors are upstream's.

Owns: ``IMPLEMENTATIONS`` and ``SINGLETONS`` (``sort``) of these functions.
Must not: compare or add values other than as the standard library's operators do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.library import standard
from dra_gpu.cel._port.library.runtime_types import no_such_overload
from dra_gpu.cel._port.values import (
    MISSING,
    OPTIONAL_NONE,
    CelError,
    Duration,
    Optional,
    Timestamp,
    Uint,
    cel_equal,
)

__all__ = ["IMPLEMENTATIONS", "SINGLETONS", "includes", "list_index_of"]


def slice_list(items: list[Any], start: int, end: int) -> list[Any]:
    if start < 0 or end < 0:
        raise CelError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise CelError(
            f"cannot slice({start}, {end}), start index must be less than or cel_equal to end index"
        )
    if len(items) < end:
        raise CelError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return items[start:end]


def flatten(items: list[Any], depth: int = 1) -> list[Any]:
    if depth < 0:
        raise CelError("level must be non-negative")
    out: list[Any] = []
    for item in items:
        if type(item) is list and depth != 0:
            out += flatten(item, depth - 1)
        else:
            out.append(item)
    return out


def lists_range(n: int) -> list[int]:
    if n < 0:
        raise CelError(f"lists.range: size must be non-negative, got {n}")
    return list(range(n))


def distinct(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        for seen in out:
            try:
                if cel_equal(item, seen):
                    break
            except CelError:
                continue
        else:
            out.append(item)
    return out


_COMPARABLE: Final = (int, Uint, float, bool, str, bytes, Timestamp, Duration)


def _sort(items: Any, keys: Any) -> list[Any]:
    if type(items) is not list or type(keys) is not list:
        raise no_such_overload()
    if len(items) != len(keys):
        raise CelError(
            f"@sortByAssociatedKeys() expected a list of the same size as the associated keys "
            f"list, but got {len(items)} and {len(keys)} elements respectively."
        )
    if not items:
        return items
    first = type(keys[0])
    if first not in _COMPARABLE:
        raise CelError("list elements must be comparable")
    if len(keys) > 1 and any(type(k) is not first for k in keys):
        raise CelError("list elements must have the same type")
    order = sorted(range(len(items)), key=lambda i: _sort_key(keys[i]))
    return [items[i] for i in order]


def _sort_key(value: Any) -> Any:
    if type(value) in (Timestamp, Duration):
        return value.nanos
    return value


def is_sorted(items: list[Any]) -> bool:
    previous = MISSING
    for item in items:
        if type(item) not in _COMPARABLE:
            raise no_such_overload()
        if previous is not MISSING and _compare_or_none(previous, item) == 1:
            return False
        previous = item
    return True


def _compare_or_none(a: Any, b: Any) -> int | None:
    # The Kubernetes list library compares Compare()'s result with -1/1: an error (NaN) is
    # neither, so it decides nothing.
    try:
        return standard.compare(a, b)
    except CelError:
        return None


def _sum(zero: Any) -> Callable[[list[Any]], Any]:
    def total(items: list[Any]) -> Any:
        acc = zero
        for item in items:
            acc = standard.op_add(acc, item)
        return acc

    return total


def _extreme(name: str, prefer: int) -> Callable[[list[Any]], Any]:
    def pick(items: list[Any]) -> Any:
        result = MISSING
        for item in items:
            if type(item) not in _COMPARABLE:
                raise no_such_overload()
            if result is MISSING or _compare_or_none(result, item) == prefer:
                result = item
        if result is MISSING:
            raise CelError(f"{name} called on empty list")
        return result

    return pick


def list_index_of(items: list[Any], item: Any) -> int:
    for i, x in enumerate(items):
        try:
            if cel_equal(x, item):
                return i
        except CelError:
            pass
    return -1


def list_last_index_of(items: list[Any], item: Any) -> int:
    for i in range(len(items) - 1, -1, -1):
        try:
            if cel_equal(items[i], item):
                return i
        except CelError:
            pass
    return -1


def includes(target: Any, item: Any) -> bool:
    if type(target) is list:
        return list_index_of(target, item) >= 0
    try:
        return cel_equal(target, item)
    except CelError:
        return False


SINGLETONS: Final[dict[str, Callable[..., Any]]] = {
    "sort": lambda v: _sort(v, v),
    "@sortByAssociatedKeys": lambda v, k: _sort(v, k),
}


def _implementations() -> dict[str, Callable[..., Any]]:
    impl: dict[str, Callable[..., Any]] = {
        "list_slice": slice_list,
        "list_flatten": flatten,
        "list_flatten_int": flatten,
        "lists_range": lists_range,
        "list_reverse": lambda items: items[::-1],
        "list_distinct": distinct,
        "list_a_index_of_int": list_index_of,
        "list_a_last_index_of_int": list_last_index_of,
        "list_includes_dyn_dyn": includes,
        "list_first": lambda items: Optional(items[0]) if items else OPTIONAL_NONE,
        "list_last": lambda items: Optional(items[-1]) if items else OPTIONAL_NONE,
    }
    for kind, zero in (("int", 0), ("uint", Uint(0)), ("double", 0.0), ("duration", Duration(0))):
        impl[f"list_{kind}_sum_{kind}"] = _sum(zero)
    for kind in ("int", "uint", "double", "bool", "duration", "timestamp", "string", "bytes"):
        impl[f"list_{kind}_max_{kind}"] = _extreme("max", -1)
        impl[f"list_{kind}_min_{kind}"] = _extreme("min", 1)
        impl[f"list_{kind}_is_sorted_bool"] = is_sorted
    return impl


IMPLEMENTATIONS: Final = _implementations()

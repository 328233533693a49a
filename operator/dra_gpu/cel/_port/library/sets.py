"""cel-go's ext sets library: ``sets.contains``, ``sets.equivalent``, ``sets.intersects``.

Lists read as sets, their elements compared with cel-go's equality (an error compares unequal).

Owns: ``IMPLEMENTATIONS`` of the three functions.
Must not: hash elements (CEL's equality is not Python's: ``1 == 1u == 1.0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.values import CelError, cel_equal

__all__ = ["IMPLEMENTATIONS"]


def sets_contains(a: list[Any], b: list[Any]) -> bool:
    return all(_set_has(a, x) for x in b)


def sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: list[Any], b: list[Any]) -> bool:
    return any(_set_has(a, x) for x in b)


def _set_has(items: list[Any], x: Any) -> bool:
    for item in items:
        try:
            if cel_equal(item, x):
                return True
        except CelError:
            pass
    return False


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "list_sets_contains_list": sets_contains,
    "list_sets_equivalent_list": sets_equivalent,
    "list_sets_intersects_list": sets_intersects,
}

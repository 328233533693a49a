"""cel-go's optional types library: ``optional.of``, ``optional.ofNonZeroValue``,
``optional.none``, ``value``, ``hasValue``, ``optional.unwrap``/``unwrapOpt``.

``or`` and ``orValue`` are the planner's (they evaluate their right side only when needed), and
``?.``/``[?]`` are selections (``runtime``).

Owns: ``IMPLEMENTATIONS`` of these overloads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.values import OPTIONAL_NONE, CelError, Duration, Optional, Timestamp, Uint

__all__ = ["IMPLEMENTATIONS"]


def optional_value(o: Optional) -> Any:
    if not o.has_value():
        raise CelError("optional.none() dereference")
    return o.value


def of_non_zero(value: Any) -> Optional:
    if _is_zero(value):
        return OPTIONAL_NONE
    return Optional(value)


def _is_zero(value: Any) -> bool:
    t = type(value)
    if t in (bool, int, Uint, float, str, bytes, list) or isinstance(value, dict):
        return not value
    if value is None:
        return True
    if t in (Timestamp, Duration):
        zero: bool = value.nanos == 0
        return zero
    return False


def unwrap(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        if type(item) is not Optional:
            raise CelError(f"value {item} is not optional")
        if item.has_value():
            out.append(item.value)
    return out


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "optional_of": Optional,
    "optional_ofNonZeroValue": of_non_zero,
    "optional_none": lambda: OPTIONAL_NONE,
    "optional_value": optional_value,
    "optional_hasValue": lambda o: o.has_value(),
    "optional_unwrap": unwrap,
    "optional_unwrapOpt": unwrap,
}

"""Selection, indexing, equality and membership on CEL runtime values, as cel-go's
``interpreter/attributes.go`` qualifies them.

``has()`` of a map key, optional chains (``a.?b.c``, ``a[?k]``), numeric map keys, list indexes
given as ``1u`` or ``1.0``, the device's attribute and capacity maps (an unknown domain reads
as an empty map), ``==``/``!=`` (an erroneous comparison is "not equal"), and cel-go's
set-membership lookup for ``x in [constants]``.

Owns: ``select_field``, ``has_field``, ``index_value``, ``index_optional``, ``equals``,
``not_equals``, ``membership_set``, ``is_member``.
Must not: plan (``planner``) or implement a library function.
"""

from __future__ import annotations

from typing import Any

from dra_gpu.cel._port import library
from dra_gpu.cel._port.formats import NamedFormat
from dra_gpu.cel._port.library import DefaultMap
from dra_gpu.cel._port.values import (
    INT64_MAX,
    INT64_MIN,
    MISSING,
    OPTIONAL_NONE,
    CelError,
    Optional,
    Uint,
    cel_equal,
    map_find,
)
from dra_gpu.resource.semvers import Semver

__all__ = [
    "equals",
    "has_field",
    "index_optional",
    "index_value",
    "is_member",
    "membership_set",
    "not_equals",
    "select_field",
]


def select_field(obj: Any, field: str) -> Any:
    t = type(obj)
    if t is dict:
        value = obj.get(field, MISSING)
        if value is MISSING:
            raise CelError(f"no such key: {field}")
        return value
    if t is DefaultMap:
        return obj.get(field, library.EMPTY_MAP)
    if t is Optional:
        return index_optional(obj, field)
    return index_value(obj, field)


def has_field(obj: Any, field: str) -> bool:
    t = type(obj)
    if t is DefaultMap:
        return True  # upstream's mapper finds every domain (an unknown one as an empty map)
    if isinstance(obj, dict):
        return map_find(obj, field) is not MISSING
    if t is Optional:
        if not obj.has_value():
            return False
        return has_field(obj.value, field)
    if t is list:
        raise CelError("unsupported index type 'string' in list")
    return False


def index_value(obj: Any, key: Any) -> Any:
    t = type(obj)
    if t is DefaultMap:
        value = map_find(obj, key)
        return library.EMPTY_MAP if value is MISSING else value
    if isinstance(obj, dict):
        value = map_find(obj, key)
        if value is MISSING:
            raise CelError(f"no such key: {_key_text(key)}")
        return value
    if t is list:
        i = _list_index(key)
        if 0 <= i < len(obj):
            return obj[i]
        raise CelError(f"index out of bounds: {_key_text(key)}")
    if t is Optional:
        return index_optional(obj, key)
    raise CelError(f"no such key: {_key_text(key)}")


def index_optional(obj: Any, key: Any) -> Optional:
    if type(obj) is Optional:
        if not obj.has_value():
            return OPTIONAL_NONE
        obj = obj.value
    t = type(obj)
    if t is DefaultMap:
        value = map_find(obj, key)
        return Optional(library.EMPTY_MAP if value is MISSING else value)
    if isinstance(obj, dict):
        value = map_find(obj, key)
        return OPTIONAL_NONE if value is MISSING else Optional(value)
    if t is list:
        i = _list_index(key)
        return Optional(obj[i]) if 0 <= i < len(obj) else OPTIONAL_NONE
    return OPTIONAL_NONE


def _list_index(key: Any) -> int:
    t = type(key)
    if t is int:
        return key  # type: ignore[no-any-return]
    if t is Uint:
        if key > INT64_MAX:
            raise CelError(f"unsupported index value {key} in list")
        return int(key)
    if t is float:
        if key == key and key not in (float("inf"), float("-inf")) and key == int(key):
            as_int = int(key)
            if INT64_MIN < as_int < 2**63:
                return as_int
        raise CelError(f"unsupported index value {_key_text(key)} in list")
    raise CelError(f"unsupported index type '{library.type_name(key)}' in list")


def _key_text(key: Any) -> str:
    if type(key) is float:
        from dra_gpu.cel._port.golang import format_float_g

        return format_float_g(key)
    if type(key) is bool:
        return "true" if key else "false"
    return str(key)


def equals(left: Any, right: Any) -> bool:
    return cel_equal(left, right)


def not_equals(left: Any, right: Any) -> bool:
    # evalNe: Bool(Equal(l, r) != True), so a comparison that errs is simply "not equal".
    try:
        return not cel_equal(left, right)
    except CelError:
        return True


def membership_set(items: list[Any]) -> set[Any] | None:
    """cel-go's set-membership optimization of ``x in [constants]`` (primitives, not bytes)."""
    keys: set[Any] = set()
    for item in items:
        t = type(item)
        if t not in (bool, int, Uint, float, str) and item is not None:
            return None
        keys.add((t, item))
        if t is float:
            if item == item and abs(item) != float("inf") and item == int(item):
                as_int = int(item)
                if INT64_MIN < as_int < 2**63 and float(as_int) == item:
                    keys.add((int, as_int))
                if 0 <= as_int < 2**64 and float(as_int) == item:
                    keys.add((Uint, as_int))
        elif t is int:
            keys.add((float, float(item)))
            if item >= 0:
                keys.add((Uint, item))
        elif t is Uint:
            keys.add((float, float(item)))
            if item <= INT64_MAX:
                keys.add((int, int(item)))
    return keys


def is_member(keys: set[Any], value: Any) -> bool:
    t = type(value)
    if t is float and value != value:
        return False
    if t is bytes or t is Semver or t is NamedFormat:
        # cel-go looks the value up in a Go map; these hold slices or funcs, and Go panics
        raise CelError(
            f"internal error: runtime error: hash of unhashable type {library.type_name(value)}"
        )
    try:
        return (t, int(value) if t is Uint else value) in keys
    except TypeError:
        return False

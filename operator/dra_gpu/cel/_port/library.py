"""The functions of the scheduler's CEL environment, by overload, with cel-go's runtime rules.

Operators and ``size``/``matches``/``in``/``type``/``dyn`` dispatch on the runtime type of their
first operand, as cel-go's "singleton" bindings do. Every other function has one implementation
per overload id (see ``declarations``); a call runs the overload the checker resolved, guarded
by its declared argument types, or, when several matched, the first in declaration order whose
guard the arguments pass, else "no such overload" (cel-go's ``FunctionDecl.Bindings``).

A function here raises ``CelError`` for every failure cel-go reports as an error value. An
overload with no implementation is refused when an expression is compiled (see ``runtime``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, TypeVar

from dra_gpu.cel._port import checker, formats, golang, network, regex, urls
from dra_gpu.cel._port.checker import Type
from dra_gpu.cel._port.values import (
    INT64_MAX,
    INT64_MIN,
    MISSING,
    OPTIONAL_NONE,
    UINT64_MAX,
    CelError,
    CelType,
    Duration,
    Optional,
    Timestamp,
    Uint,
    cel_equal,
    from_key,
    map_find,
    to_key,
)
from dra_gpu.resource.quantities import Quantity, QuantityError, parse_quantity
from dra_gpu.resource.semvers import Semver, SemverError, parse_semver

_P = TypeVar("_P")

__all__ = ["IMPLEMENTATIONS", "SINGLETONS", "dispatcher", "type_name"]

_MIN_UNIX: Final = -62135596800
_MAX_UNIX: Final = 253402300799
_NS: Final = 1_000_000_000


def no_such_overload() -> CelError:
    return CelError("no such overload")


# --- runtime types --------------------------------------------------------------------------------


class DefaultMap(dict):  # type: ignore[type-arg]
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map
    (upstream's mapper.Find), while ``in``, ``size()`` and iteration see only real domains."""

    __slots__ = ()


EMPTY_MAP: Final[dict[Any, Any]] = {}


def type_name(value: Any) -> str:
    t = type(value)
    name = _TYPE_NAMES.get(t)
    if name is not None:
        return name
    if isinstance(value, dict):
        return "map"
    if isinstance(value, Quantity):
        return "kubernetes.Quantity"
    if isinstance(value, Semver):
        return "kubernetes.Semver"
    named = getattr(value, "cel_type_name", None)
    if named is not None:
        return str(named)
    return t.__name__


_TYPE_NAMES: Final[dict[type, str]] = {
    bool: "bool",
    int: "int",
    Uint: "uint",
    float: "double",
    str: "string",
    bytes: "bytes",
    type(None): "null_type",
    list: "list",
    dict: "map",
    Timestamp: "google.protobuf.Timestamp",
    Duration: "google.protobuf.Duration",
    CelType: "type",
    Optional: "optional_type",
}


def cel_type_of(value: Any) -> CelType:
    return CelType(type_name(value))


# --- guards from declared types ------------------------------------------------------------------


def _guard(t: Type) -> Callable[[Any], bool]:
    """IsAssignableRuntimeType: the runtime type's name, and a list's/map's first element."""
    if t.is_dyn():
        return lambda v: True
    name = t.name
    if t.kind == "list":
        element = _guard(t.params[0])
        return lambda v: type(v) is list and (not v or element(v[0]))
    if t.kind == "map":
        key, value = _guard(t.params[0]), _guard(t.params[1])

        def map_guard(v: Any) -> bool:
            if not isinstance(v, dict):
                return False
            for k, x in v.items():
                return key(from_key(k)) and value(x)
            return True

        return map_guard
    if t.kind == "type":
        return lambda v: type(v) is CelType
    return lambda v: type_name(v) == name


# --- numbers --------------------------------------------------------------------------------------


def _check_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise CelError("integer overflow")
    return value


def _check_uint(value: int) -> Uint:
    if not 0 <= value <= UINT64_MAX:
        raise CelError("unsigned integer overflow")
    return Uint(value)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _go_mod(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


def compare_numbers(a: Any, b: Any) -> int:
    """Compare across int/uint/double as cel-go's compare.go does (int to double is lossy)."""
    ta, tb = type(a), type(b)
    if ta is float or tb is float:
        if ta is float and tb is float:
            if a != a or b != b:
                raise CelError("NaN values cannot be ordered")
            order: int = (a > b) - (a < b)
            return order
        if ta is float:
            return _cmp_double_int(a, b)
        return -_cmp_double_int(b, a)
    order = (a > b) - (a < b)
    return order


def _cmp_double_int(d: float, i: int) -> int:
    if d != d:
        raise CelError("NaN values cannot be ordered")
    if type(i) is Uint:
        if d < 0:
            return -1
        if d > 18446744073709551615.0:
            return 1
    else:
        if d < -9223372036854775808.0:
            return -1
        if d > 9223372036854775807.0:
            return 1
    f = float(i)
    return (d > f) - (d < f)


equal = cel_equal


# --- singleton operators --------------------------------------------------------------------------


_JOINED = (str, float, list, bytes)
"""Types whose ``+`` is Python's own: concatenation, or float addition (no overflow in CEL)."""


def op_add(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is int:
            return _check_int(a + b)
        if ta in _JOINED:
            return a + b
        if ta is Uint:
            return _check_uint(a + b)
        if ta is Duration:
            return Duration(_check_int(a.nanos + b.nanos))
    elif ta is Duration and tb is Timestamp:
        return _add_time(b, a.nanos)
    elif ta is Timestamp and tb is Duration:
        return _add_time(a, b.nanos)
    raise no_such_overload()


def op_sub(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is int:
            return _check_int(a - b)
        if ta is float:
            return a - b
        if ta is Uint:
            return _check_uint(a - b)
        if ta is Duration or ta is Timestamp:
            return Duration(_check_int(a.nanos - b.nanos))
    elif ta is Timestamp and tb is Duration:
        if b.nanos == INT64_MIN:
            raise CelError("integer overflow")
        return _add_time(a, -b.nanos)
    raise no_such_overload()


def _add_time(t: Timestamp, nanos: int) -> Timestamp:
    total = t.nanos + nanos
    if not _MIN_UNIX <= total // _NS <= _MAX_UNIX:
        raise CelError("timestamp overflow")
    return Timestamp(total, t.offset)


def _operand_type(a: Any, b: Any) -> type:
    """The type of both operands of ``*``, ``/`` and ``%`` (CEL has no mixed arithmetic)."""
    ta = type(a)
    if ta is not type(b):
        raise no_such_overload()
    return ta


def op_mul(a: Any, b: Any) -> Any:
    ta = _operand_type(a, b)
    if ta is int:
        return _check_int(a * b)
    if ta is float:
        return a * b
    if ta is Uint:
        return _check_uint(a * b)
    raise no_such_overload()


def op_div(a: Any, b: Any) -> Any:
    ta = _operand_type(a, b)
    if ta is float:
        if b == 0:
            if a != a or a == 0:
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b
    if ta is not int and ta is not Uint:
        raise no_such_overload()
    if b == 0:
        raise CelError("division by zero")
    return _check_int(_trunc_div(a, b)) if ta is int else Uint(a // b)


def op_mod(a: Any, b: Any) -> Any:
    ta = _operand_type(a, b)
    if ta is not int and ta is not Uint:
        raise no_such_overload()
    if b == 0:
        raise CelError("modulus by zero")
    if ta is Uint:
        return Uint(a % b)
    if a == INT64_MIN and b == -1:
        raise CelError("integer overflow")
    return _go_mod(a, b)


def op_neg(a: Any) -> Any:
    ta = type(a)
    if ta is int:
        return _check_int(-a)
    if ta is float:
        return -a
    if ta is Duration:
        return Duration(_check_int(-a.nanos))
    raise no_such_overload()


def op_not(a: Any) -> Any:
    if type(a) is not bool:
        raise no_such_overload()
    return not a


def compare(a: Any, b: Any) -> int:
    """traits.Comparer.Compare on ``a``."""
    ta = type(a)
    tb = type(b)
    if ta is int or ta is Uint or ta is float:
        if tb is int or tb is Uint or tb is float:
            if ta is not float and tb is not float:
                ia, ib = int(a), int(b)
                return (ia > ib) - (ia < ib)
            return compare_numbers(a, b)
        raise no_such_overload()
    if ta is str or ta is bytes or ta is bool:
        if tb is not ta:
            raise no_such_overload()
        order: int = (a > b) - (a < b)
        return order
    if ta is Timestamp or ta is Duration:
        if tb is not ta:
            raise no_such_overload()
        order = (a.nanos > b.nanos) - (a.nanos < b.nanos)
        return order
    raise no_such_overload()


def op_less(a: Any, b: Any) -> bool:
    return compare(a, b) < 0


def op_less_equal(a: Any, b: Any) -> bool:
    return compare(a, b) <= 0


def op_greater(a: Any, b: Any) -> bool:
    return compare(a, b) > 0


def op_greater_equal(a: Any, b: Any) -> bool:
    return compare(a, b) >= 0


def op_in(element: Any, container: Any) -> bool:
    if type(container) is list:
        for item in container:
            try:
                if equal(element, item):
                    return True
            except CelError:
                pass
        return False
    if isinstance(container, dict):
        return map_find(container, element) is not MISSING
    raise no_such_overload()


def size(value: Any) -> int:
    t = type(value)
    if t is str or t is bytes or t is list or isinstance(value, dict):
        return len(value)
    raise no_such_overload()


def matches(text: Any, pattern: Any) -> bool:
    if type(text) is not str or type(pattern) is not str:
        raise no_such_overload()
    return compiled_regex(pattern).search(text) is not None


def compiled_regex(pattern: str) -> Any:
    """The compiled pattern; CelError as Go fails (or for what is not supported here; the
    planner reports a constant pattern of that kind at compile time instead)."""
    try:
        return regex.compile_go(pattern)
    except regex.RegexError as error:
        raise CelError(str(error)) from None


def op_type(value: Any) -> CelType:
    return cel_type_of(value)


def identity(value: Any) -> Any:
    return value


SINGLETONS: Final[dict[str, Callable[..., Any]]] = {
    "_+_": op_add,
    "_-_": op_sub,
    "_*_": op_mul,
    "_/_": op_div,
    "_%_": op_mod,
    "-_": op_neg,
    "!_": op_not,
    "_<_": op_less,
    "_<=_": op_less_equal,
    "_>_": op_greater,
    "_>=_": op_greater_equal,
    "@in": op_in,
    "size": size,
    "matches": matches,
    "type": op_type,
    "dyn": identity,
    "sort": lambda v: _sort(v, v),
    "@sortByAssociatedKeys": lambda v, k: _sort(v, k),
}


# --- conversions ----------------------------------------------------------------------------------


def _conversion_error(source: str, target: str) -> CelError:
    return CelError(f"type conversion error from '{source}' to '{target}'")


def double_to_int(v: float) -> int:
    if math.isinf(v) or math.isnan(v) or v <= -9223372036854775808.0 or v >= 9223372036854775807.0:
        raise CelError("integer overflow")
    return int(v)


def double_to_uint(v: float) -> Uint:
    if math.isinf(v) or math.isnan(v) or v < 0 or v >= 18446744073709551616.0:
        raise CelError("unsigned integer overflow")
    return Uint(int(v))


def _from_string(parsed: _P | None, target: str) -> _P:
    """What a ``golang.parse_*`` found in a string, or the conversion's error."""
    if parsed is None:
        raise _conversion_error("string", target)
    return parsed


def string_to_int(v: str) -> int:
    return _from_string(golang.parse_int(v), "int")


def string_to_uint(v: str) -> Uint:
    return Uint(_from_string(golang.parse_uint(v), "uint"))


def string_to_double(v: str) -> float:
    return _from_string(golang.parse_float(v), "double")


def string_to_bool(v: str) -> bool:
    return _from_string(golang.parse_bool(v), "bool")


def string_to_duration(v: str) -> Duration:
    return Duration(_from_string(golang.parse_duration(v), "google.protobuf.Duration"))


def string_to_timestamp(v: str) -> Timestamp:
    nanos, offset = _from_string(golang.parse_rfc3339(v), "google.protobuf.Timestamp")
    if not _MIN_UNIX <= nanos // _NS <= _MAX_UNIX:
        raise CelError("timestamp overflow")
    return Timestamp(nanos, offset)


def int_to_timestamp(v: int) -> Timestamp:
    if not _MIN_UNIX <= v <= _MAX_UNIX:
        raise CelError("timestamp overflow")
    return Timestamp(v * _NS, 0)


def bytes_to_string(v: bytes) -> str:
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        raise CelError("invalid UTF-8 in bytes, cannot convert to string") from None


def duration_to_string(v: Duration) -> str:
    seconds = (
        float(_trunc_div(v.nanos, _NS)) + float(v.nanos - _trunc_div(v.nanos, _NS) * _NS) / 1e9
    )
    return golang.format_float_f(seconds) + "s"


def timestamp_to_string(v: Timestamp) -> str:
    return golang.format_rfc3339_nano(v.nanos, v.offset)


def uint_to_int(v: Uint) -> int:
    if v > INT64_MAX:
        raise CelError("integer overflow")
    return int(v)


def int_to_uint(v: int) -> Uint:
    if v < 0:
        raise CelError("unsigned integer overflow")
    return Uint(v)


# --- strings (cel-go ext.Strings version 2) -------------------------------------------------------


def char_at(s: str, i: int) -> str:
    if i < 0 or i > len(s):
        raise CelError(f"index out of range: {i}")
    return s[i] if i < len(s) else ""


def _answer_without_search(s: str, sub: str, offset: int) -> int | None:
    """What ``indexOf`` and ``lastIndexOf`` answer before searching (cel-go's checks)."""
    if offset < 0:
        raise CelError(f"index out of range: {offset}")
    if sub == "":
        return len(s) if offset > len(s) else offset
    if offset >= len(s):
        return -1
    return None


def index_of(s: str, sub: str, offset: int = 0) -> int:
    early = _answer_without_search(s, sub, offset)
    return early if early is not None else s.find(sub, offset)


def last_index_of(s: str, sub: str, offset: int | None = None) -> int:
    if offset is None:
        if sub == "":
            return len(s)
        if len(s.encode()) < len(sub.encode()):
            return -1
        offset = len(s) - 1
    early = _answer_without_search(s, sub, offset)
    if early is not None:
        return early
    if offset > len(s) - len(sub):
        offset = len(s) - len(sub)
    if offset < 0:
        return -1
    return s.rfind(sub, 0, offset + len(sub))


def lower_ascii(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def upper_ascii(s: str) -> str:
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


def replace(s: str, old: str, new: str, n: int = -1) -> str:
    if n < 0:
        return s.replace(old, new)
    return s.replace(old, new, n)


def substring(s: str, start: int, end: int | None = None) -> str:
    if end is None:
        if start < 0 or start > len(s):
            raise CelError(f"index out of range: {start}")
        return s[start:]
    if start > end:
        raise CelError(f"invalid substring range. start: {start}, end: {end}")
    if start < 0 or start > len(s):
        raise CelError(f"index out of range: {start}")
    if end < 0 or end > len(s):
        raise CelError(f"index out of range: {end}")
    return s[start:end]


def join(items: list[Any], separator: str = "") -> str:
    for item in items:
        if type(item) is not str:
            raise CelError(f"join: invalid input: {item}")
    return separator.join(items)


_ESCAPES: Final = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}  # fmt: skip
"""Go's backslash escapes: strings.quote and strconv.Quote use the same."""


def quote(s: str) -> str:
    return '"' + "".join(_ESCAPES.get(c, c) for c in s) + '"'


# --- lists (cel-go ext.Lists version 3, Kubernetes lists version 1) -------------------------------


def slice_list(items: list[Any], start: int, end: int) -> list[Any]:
    if start < 0 or end < 0:
        raise CelError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise CelError(
            f"cannot slice({start}, {end}), start index must be less than or equal to end index"
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
                if equal(item, seen):
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
        return compare(a, b)
    except CelError:
        return None


def _sum(zero: Any) -> Callable[[list[Any]], Any]:
    def total(items: list[Any]) -> Any:
        acc = zero
        for item in items:
            acc = op_add(acc, item)
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
            if equal(x, item):
                return i
        except CelError:
            pass
    return -1


def list_last_index_of(items: list[Any], item: Any) -> int:
    for i in range(len(items) - 1, -1, -1):
        try:
            if equal(items[i], item):
                return i
        except CelError:
            pass
    return -1


def includes(target: Any, item: Any) -> bool:
    if type(target) is list:
        return list_index_of(target, item) >= 0
    try:
        return equal(target, item)
    except CelError:
        return False


def sets_contains(a: list[Any], b: list[Any]) -> bool:
    return all(_set_has(a, x) for x in b)


def sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: list[Any], b: list[Any]) -> bool:
    return any(_set_has(a, x) for x in b)


def _set_has(items: list[Any], x: Any) -> bool:
    for item in items:
        try:
            if equal(item, x):
                return True
        except CelError:
            pass
    return False


# --- maps (two-variable comprehensions) -----------------------------------------------------------


def map_insert(target: Any, key: Any, value: Any = MISSING) -> dict[Any, Any]:
    if value is MISSING:
        result = dict(target)
        for k, v in key.items():
            result = map_insert(result, from_key(k), v)
        return result
    if map_find(target, key) is not MISSING:
        raise CelError(f"insert failed: key {key} already exists")
    result = dict(target)
    result[to_key(key)] = value
    return result


# --- optionals ------------------------------------------------------------------------------------


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


# --- quantities (Kubernetes quantity library) -----------------------------------------------------


def to_quantity(text: str) -> Quantity:
    try:
        return parse_quantity(text)
    except QuantityError as error:
        raise CelError(str(error)) from None


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def quantity_compare(a: Quantity, b: Quantity) -> int:
    return a.cmp(b)


def quantity_add(a: Quantity, b: Any, *, negate: bool = False) -> Quantity:
    other = Quantity.of_int(b) if type(b) is int else b
    result = a.added(other, negate=negate)
    result.boxed = True
    return result


def quantity_as_integer(q: Quantity) -> int:
    value = q.as_int64()
    if value is None:
        raise CelError("cannot convert value to integer")
    return value


# --- semantic versions (Kubernetes semver library) ------------------------------------------------


def to_semver(text: str, normalize: bool = False) -> Semver:
    try:
        return parse_semver(text, normalize)
    except SemverError as error:
        raise CelError(str(error)) from None


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except SemverError:
        return False
    return True


def _uint_as_int(n: int) -> int:
    return (n + 2**63) % 2**64 - 2**63  # types.Int(uint64) wraps


# --- timestamps and durations ---------------------------------------------------------------------


def _local(ts: Timestamp, tz: str | None) -> tuple[int, int]:
    """(seconds in the zone's local time, nanoseconds), as t.In(loc)."""
    seconds, nanos = divmod(ts.nanos, _NS)
    if tz is None:
        return seconds, nanos
    return seconds + _zone_offset(tz, seconds), nanos


def _zone_offset(tz: str, seconds: int) -> int:
    if ":" not in tz:
        import zoneinfo

        try:
            zone = zoneinfo.ZoneInfo(tz if tz else "UTC")
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise CelError(f"unknown time zone {tz}") from None
        import datetime

        try:
            moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        except (OverflowError, OSError, ValueError):
            raise CelError(f"time zone {tz} cannot be applied to this time") from None
        offset = moment.astimezone(zone).utcoffset()
        return int(offset.total_seconds()) if offset is not None else 0
    hours_text, _, minutes_text = tz.partition(":")
    hours = golang.parse_int(hours_text)
    minutes = golang.parse_int(minutes_text)
    if hours is None or minutes is None:
        raise CelError(f'strconv.Atoi: parsing "{tz}": invalid syntax')
    minutes_east = hours * 60 - minutes if tz.startswith("-") else hours * 60 + minutes
    return minutes_east * 60


def _civil(ts: Timestamp, tz: str | None) -> tuple[Any, int, int]:
    import datetime

    local, nanos = _local(ts, tz)
    days, rest = divmod(local, 86400)
    date = datetime.date.fromordinal(days + datetime.date(1970, 1, 1).toordinal())
    return date, rest, nanos


def _timestamp_getter(part: str) -> Callable[..., int]:
    def get(ts: Timestamp, tz: str | None = None) -> int:
        date, rest, nanos = _civil(ts, tz)
        if part == "year":
            return int(date.year)
        if part == "month":
            return int(date.month) - 1
        if part == "dayOfYear":
            return int(date.timetuple().tm_yday) - 1
        if part == "dayOfMonth":
            return int(date.day) - 1
        if part == "date":
            return int(date.day)
        if part == "dayOfWeek":
            return (int(date.weekday()) + 1) % 7
        if part == "hours":
            return rest // 3600
        if part == "minutes":
            return rest % 3600 // 60
        if part == "seconds":
            return rest % 60
        return nanos // 1_000_000

    return get


def _duration_getter(unit: int) -> Callable[[Duration], int]:
    def get(d: Duration) -> int:
        if unit == _NS:
            return _trunc_div(d.nanos, _NS)  # Seconds() truncated by Int()
        if unit == 1_000_000:
            return _trunc_div(d.nanos, unit)  # Milliseconds(): integer division
        # Hours()/Minutes() are float64 values truncated by types.Int
        whole = _trunc_div(d.nanos, unit)
        rest = d.nanos - whole * unit
        return int(float(whole) + float(rest) / unit)

    return get


# --- string.format (cel-go ext.Strings version 2: the en_US formatter) ----------------------------


class _FormatError(CelError):
    pass


UNSUPPORTED_SCIENTIFIC: Final = (
    "the %e clause of string.format() (golang.org/x/text's en_US scientific notation) is not "
    "supported by dra-gpu's CEL evaluator"
)


def _go_quote(text: str) -> str:
    """strconv.Quote (Go's %q)."""
    out = ['"']
    for c in text:
        cp = ord(c)
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isprintable() or c == " ":
            out.append(c)
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def _format_string_clause(arg: Any) -> str:
    t = type(arg)
    if t is list:
        return "[" + ", ".join(_quote_for_cel(x, _format_member(x)) for x in arg) + "]"
    if isinstance(arg, dict):
        pairs = []
        for key, value in arg.items():
            k = from_key(key)
            if type(k) in (str, bool):
                key_text = _format_string_clause(k)
            elif type(k) in (int, Uint):
                key_text = str(int(k))
            else:
                raise _FormatError(f"no formatting function for map key of type {type_name(k)}")
            pairs.append(
                (_quote_for_cel(k, key_text), _quote_for_cel(value, _format_member(value)))
            )
        pairs.sort(key=lambda p: p[0].encode())
        return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"
    if arg is None:
        return "null"
    if t is CelType:
        name: str = arg.name
        return name
    converter = _STRING_CONVERSIONS.get(t)
    if converter is None:
        raise _FormatError(
            f"error during formatting: string clause can only be used on strings, bools, bytes, "
            f"ints, doubles, maps, lists, types, durations, and timestamps, was given "
            f"{type_name(arg)}"
        )
    return converter(arg)


def _format_member(arg: Any) -> str:
    t = type(arg)
    if t is int or t is Uint:
        return str(int(arg))
    if t in (str, bytes, bool, CelType) or arg is None:
        return _format_string_clause(arg)
    if t is Timestamp:
        return f"timestamp({_go_quote(timestamp_to_string(arg))})"
    if t is Duration:
        return f"duration({_go_quote(duration_to_string(arg))})"
    if t is list or isinstance(arg, dict):
        return _format_string_clause(arg)
    if t is float:
        return _go_fixed(arg, 6)
    raise _FormatError(f"no formatting function for {type_name(arg)}")


def _quote_for_cel(value: Any, text: str) -> str:
    t = type(value)
    if t is str:
        return _go_quote(text)
    if t is bytes:
        return "b" + _go_quote(text)
    if t is float and (math.isinf(value) or math.isnan(value)):
        return _go_quote(text)
    return text


def _go_fixed(value: float, precision: int) -> str:
    """fmt.Sprintf("%.<p>f")."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.{precision}f}"


def _locale_fixed(value: float, precision: int) -> str:
    """golang.org/x/text/message en_US Sprintf("%.<p>f"): grouped thousands."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    text = f"{abs(value):.{precision}f}"
    whole, dot, fraction = text.partition(".")
    grouped = f"{int(whole):,}"
    sign = "-" if value < 0 else ""  # x/text: no sign on a negative zero
    return sign + grouped + dot + fraction


def _go_int_format(value: int, verb: str) -> str:
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    digits = {
        "b": f"{magnitude:b}",
        "o": f"{magnitude:o}",
        "x": f"{magnitude:x}",
        "X": f"{magnitude:X}",
    }
    return sign + digits[verb]


def _format_clause(verb: str, precision: int | None, arg: Any) -> str:
    t = type(arg)
    if verb == "s":
        return _format_string_clause(arg)
    if verb == "d":
        if t is int or t is Uint:
            return str(int(arg))
        raise _FormatError(
            f"error during formatting: decimal clause can only be used on integers, was given "
            f"{type_name(arg)}"
        )
    if verb in ("f", "e"):
        special = t is str and arg in ("NaN", "Infinity", "-Infinity")
        if t is not float and not special:
            kind = "fixed-point" if verb == "f" else "scientific"
            raise _FormatError(
                f"error during formatting: {kind} clause can only be used on doubles, was given "
                f"{type_name(arg)}"
            )
        number = string_to_double(arg) if special else arg
        if verb == "e":
            raise _FormatError(UNSUPPORTED_SCIENTIFIC)
        return _locale_fixed(number, 6 if precision is None else precision)
    if verb == "b":
        if t is bool:
            return "1" if arg else "0"
        if t is int or t is Uint:
            return _go_int_format(int(arg), "b")
        raise _FormatError(
            f"error during formatting: only integers and bools can be formatted as binary, was "
            f"given {type_name(arg)}"
        )
    if verb in ("x", "X"):
        if t is str or t is bytes:
            data = arg.encode() if t is str else arg
            text: str = data.hex()
            return text.upper() if verb == "X" else text
        if t is int or t is Uint:
            return _go_int_format(int(arg), verb)
        raise _FormatError(
            f"error during formatting: only integers, byte buffers, and strings can be formatted "
            f"as hex, was given {type_name(arg)}"
        )
    if verb == "o":
        if t is int or t is Uint:
            return _go_int_format(int(arg), "o")
        raise _FormatError(
            f"error during formatting: octal clause can only be used on integers, was given "
            f"{type_name(arg)}"
        )
    raise _FormatError(
        f'could not parse formatting clause: unrecognized formatting clause "{verb}"'
    )


def format_clauses(text: str) -> list[tuple[str, int | None]] | None:
    """The clauses of a format string (for the compile-time check); None if it is malformed."""
    clauses: list[tuple[str, int | None]] = []
    data = text.encode()
    i = 0
    while i < len(data):
        if data[i : i + 1] != b"%":
            i += 1
            continue
        if data[i + 1 : i + 2] == b"%":
            i += 2
            continue
        if i + 1 >= len(data):
            return None
        read, verb, precision = _parse_clause(data, i + 1)
        if verb is None:
            return None
        clauses.append((verb, precision))
        i = read
    return clauses


def _parse_clause(data: bytes, i: int) -> tuple[int, str | None, int | None]:
    precision: int | None = None
    if data[i : i + 1] == b".":
        j = i + 1
        while j < len(data) and data[j : j + 1].isdigit():
            j += 1
        if j >= len(data) or j == i + 1:
            return -1, None, None
        precision = int(data[i + 1 : j])
        i = j
    verb = chr(data[i])
    if verb not in "sdfebxXo":
        return -1, None, None
    return i + 1, verb, precision


def string_format(text: str, args: list[Any]) -> str:
    data = text.encode()
    out = bytearray()
    i = 0
    index = 0
    while i < len(data):
        if data[i : i + 1] != b"%":
            out += data[i : i + 1]
            i += 1
            continue
        if data[i + 1 : i + 2] == b"%":
            out += b"%"
            i += 2
            continue
        if index >= len(args):
            raise _FormatError(f"index {index} out of range")
        if i + 1 >= len(data):
            raise _FormatError("unexpected end of string")
        j = i + 1
        precision: int | None = None
        if data[j : j + 1] == b".":
            k = j + 1
            while True:
                if k >= len(data):
                    raise _FormatError(
                        "could not parse formatting clause: error while parsing precision: "
                        "could not find end of precision specifier"
                    )
                if not data[k : k + 1].isdigit():
                    break
                k += 1
            if k == j + 1:
                raise _FormatError(
                    "could not parse formatting clause: error while parsing precision: error "
                    'while converting precision to integer: strconv.Atoi: parsing "": invalid '
                    "syntax"
                )
            precision = int(data[j + 1 : k])
            j = k
        verb = data[j : j + 1].decode("latin-1")
        out += _format_clause(verb, precision, args[index]).encode()
        i = j + 1
        index += 1
    return out.decode("utf-8", "replace")


_STRING_CONVERSIONS: Final[dict[type, Callable[[Any], str]]] = {
    str: lambda s: s,
    bool: lambda b: "true" if b else "false",
    int: str,
    Uint: lambda u: str(int(u)),
    float: golang.format_float_g,
    bytes: bytes_to_string,
    Timestamp: timestamp_to_string,
    Duration: duration_to_string,
}


# --- the table ------------------------------------------------------------------------------------


def _implementations() -> dict[str, Callable[..., Any]]:
    impl: dict[str, Callable[..., Any]] = {
        # conversions
        "bool_to_bool": identity,
        "string_to_bool": string_to_bool,
        "bytes_to_bytes": identity,
        "string_to_bytes": lambda s: s.encode(),
        "double_to_double": identity,
        "int64_to_double": float,
        "string_to_double": string_to_double,
        "uint64_to_double": float,
        "duration_to_duration": identity,
        "string_to_duration": string_to_duration,
        "int64_to_int64": identity,
        "double_to_int64": double_to_int,
        "duration_to_int64": lambda d: d.nanos,
        "string_to_int64": string_to_int,
        "timestamp_to_int64": lambda t: t.nanos // _NS,
        "uint64_to_int64": uint_to_int,
        "string_to_string": identity,
        "bool_to_string": lambda b: "true" if b else "false",
        "bytes_to_string": bytes_to_string,
        "double_to_string": golang.format_float_g,
        "duration_to_string": duration_to_string,
        "int64_to_string": str,
        "timestamp_to_string": timestamp_to_string,
        "uint64_to_string": lambda u: str(int(u)),
        "timestamp_to_timestamp": identity,
        "int64_to_timestamp": int_to_timestamp,
        "string_to_timestamp": string_to_timestamp,
        "uint64_to_uint64": identity,
        "double_to_uint64": double_to_uint,
        "int64_to_uint64": int_to_uint,
        "string_to_uint64": string_to_uint,
        # strings
        "contains_string": _strings2(lambda s, t: t in s),
        "ends_with_string": _strings2(lambda s, t: s.endswith(t)),
        "starts_with_string": _strings2(lambda s, t: s.startswith(t)),
        "string_char_at_int": char_at,
        "string_index_of_string": index_of,
        "string_index_of_string_int": index_of,
        "string_last_index_of_string": last_index_of,
        "string_last_index_of_string_int": last_index_of,
        "string_lower_ascii": lower_ascii,
        "string_upper_ascii": upper_ascii,
        "string_replace_string_string": replace,
        "string_replace_string_string_int": replace,
        "string_split_string": lambda s, sep: golang.split_n(s, sep, -1),
        "string_split_string_int": golang.split_n,
        "string_substring_int": substring,
        "string_substring_int_int": substring,
        "string_trim": golang.trim_space,
        "list_join": join,
        "list_join_string": join,
        "strings_quote": quote,
        "string_format": string_format,
        "string_find_string": lambda s, p: _find(s, p),
        "string_find_all_string": lambda s, p: _find_all(s, p, -1),
        "string_find_all_string_int": _find_all,
        # lists
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
        "list_sets_contains_list": sets_contains,
        "list_sets_equivalent_list": sets_equivalent,
        "list_sets_intersects_list": sets_intersects,
        "@mapInsert_map_key_value": map_insert,
        "@mapInsert_map_map": map_insert,
        # optionals
        "optional_of": Optional,
        "optional_ofNonZeroValue": of_non_zero,
        "optional_none": lambda: OPTIONAL_NONE,
        "optional_value": optional_value,
        "optional_hasValue": lambda o: o.has_value(),
        "optional_unwrap": unwrap,
        "optional_unwrapOpt": unwrap,
        # quantities
        "string_to_quantity": to_quantity,
        "is_quantity_string": is_quantity,
        "quantity_sign": lambda q: q.sign(),
        "quantity_is_greater_than": lambda a, b: a.cmp(b) == 1,
        "quantity_is_less_than": lambda a, b: a.cmp(b) == -1,
        "quantity_compare_to": quantity_compare,
        "quantity_get_float": lambda q: q.as_approximate_float(),
        "quantity_get_int": quantity_as_integer,
        "quantity_is_integer": lambda q: q.as_int64() is not None,
        "quantity_add": quantity_add,
        "quantity_add_int": quantity_add,
        "quantity_sub": lambda a, b: quantity_add(a, b, negate=True),
        "quantity_sub_int": lambda a, b: quantity_add(a, b, negate=True),
        # semantic versions
        "string_to_semver": to_semver,
        "string_bool_to_semver": to_semver,
        "is_semver_string": is_semver,
        "is_semver_string_bool": is_semver,
        "semver_major": lambda v: _uint_as_int(v.major),
        "semver_minor": lambda v: _uint_as_int(v.minor),
        "semver_patch": lambda v: _uint_as_int(v.patch),
        "semver_is_greater_than": lambda a, b: a.compare(b) == 1,
        "semver_is_less_than": lambda a, b: a.compare(b) == -1,
        "semver_compare_to": lambda a, b: a.compare(b),
        # IP addresses and CIDRs
        "string_to_ip": network.parse_ip,
        "ip_to_string": lambda ip: ip.string(),
        "is_ip": network.is_ip,
        "ip_is_canonical": network.is_canonical,
        "ip_family": lambda ip: ip.family(),
        "ip_is_unspecified": lambda ip: ip.is_unspecified(),
        "ip_is_loopback": lambda ip: ip.is_loopback(),
        "ip_is_link_local_multicast": lambda ip: ip.is_link_local_multicast(),
        "ip_is_link_local_unicast": lambda ip: ip.is_link_local_unicast(),
        "ip_is_global_unicast": lambda ip: ip.is_global_unicast(),
        "string_to_cidr": network.parse_cidr,
        "cidr_to_string": lambda c: c.string(),
        "is_cidr": network.is_cidr,
        "cidr_ip": lambda c: c.ip(),
        "cidr_masked": lambda c: c.masked(),
        "cidr_prefix_length": lambda c: c.bits,
        "cidr_contains_ip_string": network.contains_ip,
        "cidr_contains_ip_ip": network.contains_ip,
        "cidr_contains_cidr_string": network.contains_cidr,
        "cidr_contains_cidr": network.contains_cidr,
        # URLs
        "string_to_url": urls.parse_url,
        "is_url_string": urls.is_url,
        "url_get_scheme": lambda u: urls.text(u.scheme),
        "url_get_host": lambda u: urls.text(u.host),
        "url_get_hostname": lambda u: urls.text(u.hostname()),
        "url_get_port": lambda u: urls.text(u.port()),
        "url_get_escaped_path": lambda u: urls.text(u.escaped_path()),
        "url_get_query": lambda u: {
            urls.text(k): [urls.text(v) for v in vs] for k, vs in u.query().items()
        },
        # named formats
        "format-named": formats.named,
        "format-validate": formats.validate,
        # durations
        "duration_to_hours": _duration_getter(3_600_000_000_000),
        "duration_to_minutes": _duration_getter(60_000_000_000),
        "duration_to_seconds": _duration_getter(_NS),
        "duration_to_milliseconds": _duration_getter(1_000_000),
    }
    for getter, part in (
        ("year", "year"), ("month", "month"), ("day_of_year", "dayOfYear"),
        ("day_of_month", "dayOfMonth"), ("day_of_month_1_based", "date"),
        ("day_of_week", "dayOfWeek"), ("hours", "hours"), ("minutes", "minutes"),
        ("seconds", "seconds"), ("milliseconds", "milliseconds"),
    ):  # fmt: skip
        impl[f"timestamp_to_{getter}"] = _timestamp_getter(part)
        impl[f"timestamp_to_{getter}_with_tz"] = _timestamp_getter(part)
    impl["timestamp_to_day_of_month_zero_based"] = _timestamp_getter("dayOfMonth")
    impl["timestamp_to_seconds_tz"] = _timestamp_getter("seconds")
    for name in formats.FORMATS:
        impl[f"format.{name}"] = formats.constant(name)
    for kind, zero in (("int", 0), ("uint", Uint(0)), ("double", 0.0), ("duration", Duration(0))):
        impl[f"list_{kind}_sum_{kind}"] = _sum(zero)
    for kind in ("int", "uint", "double", "bool", "duration", "timestamp", "string", "bytes"):
        impl[f"list_{kind}_max_{kind}"] = _extreme("max", -1)
        impl[f"list_{kind}_min_{kind}"] = _extreme("min", 1)
        impl[f"list_{kind}_is_sorted_bool"] = is_sorted
    return impl


def _strings2(fn: Callable[[str, str], bool]) -> Callable[[Any, Any], bool]:
    # DisableTypeGuards: the implementation checks its own arguments.
    def call(s: Any, t: Any) -> bool:
        if type(s) is not str or type(t) is not str:
            raise no_such_overload()
        return fn(s, t)

    return call


def _find(s: str, pattern: str) -> str:
    match = _find_regex(pattern).search(s)
    return match.group() if match else ""


def _find_all(s: str, pattern: str, limit: int) -> list[str]:
    return regex.find_all(_find_regex(pattern), s, limit)


def _find_regex(pattern: str) -> Any:
    try:
        return regex.compile_go(pattern)
    except regex.UnsupportedRegex as error:
        raise CelError(str(error)) from None
    except regex.RegexError as error:
        raise CelError(f"Illegal regex: {error}") from None


IMPLEMENTATIONS: Final = _implementations()


def dispatcher(function: str, overloads: tuple[str, ...]) -> Callable[..., Any] | None:
    """The callable for a checked call; None when an overload it may need is not implemented."""
    singleton = SINGLETONS.get(function)
    if singleton is not None:
        return singleton
    declared = checker.FUNCTIONS[function]
    if len(overloads) == 1:
        (only,) = [o for o in declared if o.id == overloads[0]]
        fn = IMPLEMENTATIONS.get(only.id)
        if fn is None:
            return None
        guards = tuple(_guard(t) for t in only.args)
        return _guarded(fn, guards)
    candidates = []
    for overload in declared:
        fn = IMPLEMENTATIONS.get(overload.id)
        if fn is None:
            if overload.id in overloads:
                return None
            continue
        candidates.append((tuple(_guard(t) for t in overload.args), fn))
    return _dispatching(tuple(candidates))


def _guarded(
    fn: Callable[..., Any], guards: tuple[Callable[[Any], bool], ...]
) -> Callable[..., Any]:
    if len(guards) == 1:
        (g0,) = guards

        def unary(a: Any) -> Any:
            if not g0(a):
                raise no_such_overload()
            return fn(a)

        return unary
    if len(guards) == 2:
        g0, g1 = guards

        def binary(a: Any, b: Any) -> Any:
            if not (g0(a) and g1(b)):
                raise no_such_overload()
            return fn(a, b)

        return binary

    def call(*args: Any) -> Any:
        if len(args) != len(guards) or not all(g(a) for g, a in zip(guards, args, strict=True)):
            raise no_such_overload()
        return fn(*args)

    return call


def _dispatching(
    candidates: tuple[tuple[tuple[Callable[[Any], bool], ...], Callable[..., Any]], ...],
) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        for guards, fn in candidates:
            if len(guards) == len(args) and all(g(a) for g, a in zip(guards, args, strict=True)):
                return fn(*args)
        raise no_such_overload()

    return call

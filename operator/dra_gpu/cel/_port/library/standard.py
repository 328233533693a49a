"""cel-go's standard library: the operators, comparisons, ``size``, ``matches``, ``type``, ``dyn``.

These dispatch on the runtime type of their first operand, as cel-go's "singleton" bindings
do, rather than by overload id: int64 and uint64 arithmetic with overflow errors, Go's truncated
division and modulus, IEEE doubles, timestamp and duration arithmetic within cel-go's range, and
ordering across int, uint and double as ``compare.go`` does it. Also the number helpers the
other libraries share (``trunc_div``, the timestamp range). A failure raises ``CelError``.

Owns: ``SINGLETONS`` of the standard library, ``compare``, ``op_add``, ``op_in``, ``identity``.
Must not: implement the overloads of other libraries (conversions, strings, lists ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import regex
from dra_gpu.cel._port.library.runtime_types import cel_type_of, no_such_overload
from dra_gpu.cel._port.values import (
    INT64_MAX,
    INT64_MIN,
    MISSING,
    UINT64_MAX,
    CelError,
    CelType,
    Duration,
    Timestamp,
    Uint,
    cel_equal,
    map_find,
)

__all__ = ["MAX_UNIX", "MIN_UNIX", "NS", "SINGLETONS", "compare", "identity", "trunc_div"]

MIN_UNIX: Final = -62135596800
"""The first second a timestamp may hold (0001-01-01T00:00:00Z)."""
MAX_UNIX: Final = 253402300799
"""The last second a timestamp may hold (9999-12-31T23:59:59Z)."""
NS: Final = 1_000_000_000
"""Nanoseconds in a second."""


# --- numbers --------------------------------------------------------------------------------------


def _check_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise CelError("integer overflow")
    return value


def _check_uint(value: int) -> Uint:
    if not 0 <= value <= UINT64_MAX:
        raise CelError("unsigned integer overflow")
    return Uint(value)


def trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _go_mod(a: int, b: int) -> int:
    return a - b * trunc_div(a, b)


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
    if not MIN_UNIX <= total // NS <= MAX_UNIX:
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
    return _check_int(trunc_div(a, b)) if ta is int else Uint(a // b)


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
                if cel_equal(element, item):
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
}

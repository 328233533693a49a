"""CEL runtime values in Python, with cel-go's equality, and the error every failure becomes.

Representation (chosen so the common cases need no wrapping):

======================  ===================================================================
CEL                     Python
======================  ===================================================================
int / bool / double     ``int`` / ``bool`` / ``float`` (``type(v) is int``, never isinstance)
uint                    ``Uint``, an int subclass with its own hash: ``{1: .., 1u: ..}`` holds two
string / bytes          ``str`` (code points) / ``bytes``
null                    ``None``
list                    ``list`` (never mutated once built)
map                     ``dict``; bool and double keys wrapped (``_Key``) so they stay apart from
                        ints as in Go; look up with ``map_find``
timestamp / duration    ``Timestamp`` (ns since epoch, UTC) / ``Duration`` (ns, int64)
type                    ``CelType`` (by name)
optional                ``Optional`` (``OPTIONAL_NONE`` is the empty one)
quantity / semver ...   classes of their own modules
======================  ===================================================================

Errors are raised as ``CelError``; the evaluator catches them only where CEL absorbs errors
(``&&``, ``||``, ``?:`` conditions, comprehensions' loop conditions).
"""

from __future__ import annotations

import math
from typing import Any, Final

from dra_gpu.resource.quantities import Quantity
from dra_gpu.resource.semvers import Semver

__all__ = [
    "OPTIONAL_NONE",
    "CelError",
    "CelType",
    "Duration",
    "Optional",
    "Timestamp",
    "Uint",
    "cel_equal",
    "from_key",
    "map_find",
    "to_key",
]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1


class CelError(Exception):
    """A CEL runtime error: the evaluation's outcome, not a bug. ``str()`` is the message."""


class Uint(int):
    """A CEL uint. Arithmetic on it gives plain ints: wrap results again."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(("uint", int(self)))

    def __eq__(self, other: object) -> bool:
        return int.__eq__(self, other)

    def __repr__(self) -> str:
        return f"{int(self)}u"


class _Key:
    """A bool or double map key, kept apart from ints of the same value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash((type(self.value).__name__, self.value))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Key)
            and type(other.value) is type(self.value)
            and other.value == self.value
        )

    def __repr__(self) -> str:
        return f"_Key({self.value!r})"


def to_key(value: Any) -> Any:
    """The dict key for a CEL map key."""
    t = type(value)
    if t is bool or t is float:
        return _Key(value)
    return value


def from_key(key: Any) -> Any:
    return key.value if type(key) is _Key else key


_MISSING: Final = object()


def map_find(mapping: dict[Any, Any], key: Any) -> Any:
    """cel-go's map Find: the exact key, then the same number as int or uint; MISSING if absent."""
    t = type(key)
    if t is str:
        return mapping.get(key, _MISSING)
    if t is int:
        found = mapping.get(key, _MISSING)
        if found is _MISSING and key >= 0:
            found = mapping.get(Uint(key), _MISSING)
        return found
    if t is Uint:
        found = mapping.get(key, _MISSING)
        if found is _MISSING and key <= INT64_MAX:
            found = mapping.get(int(key), _MISSING)
        return found
    if t is float:
        found = mapping.get(_Key(key), _MISSING)
        if found is not _MISSING:
            return found
        if math.isfinite(key) and key == int(key):
            as_int = int(key)  # doubleToInt64Lossless / doubleToUint64Lossless
            if INT64_MIN < as_int < 2**63:
                found = mapping.get(as_int, _MISSING)
                if found is not _MISSING:
                    return found
            if 0 <= as_int < 2**64:
                return mapping.get(Uint(as_int), _MISSING)
        return _MISSING
    if t is bool:
        return mapping.get(_Key(key), _MISSING)
    try:
        return mapping.get(key, _MISSING)
    except TypeError:
        return _MISSING


MISSING: Final = _MISSING


class CelType:
    """A CEL type value (``type(x)``, ``int``); equal by name, as cel-go compares them."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("type", self.name))

    def __repr__(self) -> str:
        return self.name


class Timestamp:
    """A point in time: nanoseconds since the Unix epoch, within years 1-9999, and the UTC
    offset (seconds) of the zone it was written in, which ``string()`` shows."""

    __slots__ = ("nanos", "offset")

    def __init__(self, nanos: int, offset: int = 0) -> None:
        self.nanos = nanos
        self.offset = offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(("ts", self.nanos))

    def __repr__(self) -> str:
        return f"Timestamp({self.nanos})"


class Duration:
    """A Go time.Duration: int64 nanoseconds."""

    __slots__ = ("nanos",)

    def __init__(self, nanos: int) -> None:
        self.nanos = nanos

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(("dur", self.nanos))

    def __repr__(self) -> str:
        return f"Duration({self.nanos})"


class Optional:
    """A CEL optional value."""

    __slots__ = ("value",)

    def __init__(self, value: Any = _MISSING) -> None:
        self.value = value

    def has_value(self) -> bool:
        return self.value is not _MISSING

    def __repr__(self) -> str:
        return "optional.none()" if self.value is _MISSING else f"optional.of({self.value!r})"


OPTIONAL_NONE: Final = Optional()


def no_such_overload(*_: Any) -> CelError:
    return CelError("no such overload")


def _equal_double_int(d: float, i: int) -> bool:
    # cel-go's compareDoubleInt/compareDoubleUint: the integer becomes a double (lossy).
    if d != d:
        return False
    if type(i) is Uint:
        if d < 0 or d > 18446744073709551615.0:
            return False
    elif d < -9223372036854775808.0 or d > 9223372036854775807.0:
        return False
    return d == float(i)


def cel_equal(a: Any, b: Any) -> bool:
    """types.Equal(a, b): False across types, except numbers; raises CelError where cel-go errs."""
    if a is None or b is None:
        return a is None and b is None
    ta = type(a)
    tb = type(b)
    if ta is str:
        return tb is str and a == b
    if ta is int or ta is Uint:
        if tb is int or tb is Uint:
            return int(a) == int(b)
        if tb is float:
            return _equal_double_int(b, a)
        return False
    if ta is float:
        if tb is float:
            same: bool = a == b
            return same
        if tb is int or tb is Uint:
            return _equal_double_int(a, b)
        return False
    if ta is bool:
        return tb is bool and a == b
    if ta is list:
        if tb is not list or len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            try:
                if not cel_equal(x, y):
                    return False
            except CelError:
                pass  # cel-go stops only at a definite False
        return True
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        for key, value in a.items():
            other = map_find(b, from_key(key))
            if other is _MISSING:
                return False
            try:
                if not cel_equal(value, other):
                    return False
            except CelError:
                pass
        return True
    if ta is bytes:
        return tb is bytes and a == b
    if ta is Quantity:
        # A pointer upstream (the result of add()/sub()) as the right operand: no overload.
        if tb is not Quantity or b.boxed:
            raise CelError("no such overload")
        return bool(a.equal(b))
    if ta is Semver:
        if tb is not Semver:
            raise CelError("no such overload")
        return bool(a.key == b.key)
    equal = getattr(a, "cel_equal", None)
    if equal is not None:
        return bool(equal(b))
    if ta is Optional:
        if tb is not Optional:
            return False
        if not a.has_value():
            return not b.has_value()
        if not b.has_value():
            return False
        return cel_equal(a.value, b.value)
    return bool(a == b)

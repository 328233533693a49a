"""cel-go's type conversions: ``int()``, ``uint()``, ``double()``, ``string()``, ``bytes()``,
``bool()``, ``timestamp()``, ``duration()``, each by overload id.

Strings are read as Go's ``strconv`` and ``time`` read them (``golang``), numbers convert with
cel-go's range checks, and text is written as Go writes it (``1e+06``, RFC 3339 with
nanoseconds, ``1.5s``).

Owns: ``IMPLEMENTATIONS`` of the conversions, and the converters ``string.format`` reuses.
Must not: parse or format outside ``golang`` (one port of Go's text rules).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, TypeVar

from dra_gpu.cel._port import golang
from dra_gpu.cel._port.library import standard
from dra_gpu.cel._port.values import INT64_MAX, CelError, Duration, Timestamp, Uint

__all__ = [
    "IMPLEMENTATIONS",
    "bytes_to_string",
    "duration_to_string",
    "string_to_double",
    "timestamp_to_string",
]

_P = TypeVar("_P")


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
    if not standard.MIN_UNIX <= nanos // standard.NS <= standard.MAX_UNIX:
        raise CelError("timestamp overflow")
    return Timestamp(nanos, offset)


def int_to_timestamp(v: int) -> Timestamp:
    if not standard.MIN_UNIX <= v <= standard.MAX_UNIX:
        raise CelError("timestamp overflow")
    return Timestamp(v * standard.NS, 0)


def bytes_to_string(v: bytes) -> str:
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        raise CelError("invalid UTF-8 in bytes, cannot convert to string") from None


def duration_to_string(v: Duration) -> str:
    seconds = (
        float(standard.trunc_div(v.nanos, standard.NS))
        + float(v.nanos - standard.trunc_div(v.nanos, standard.NS) * standard.NS) / 1e9
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


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "bool_to_bool": standard.identity,
    "string_to_bool": string_to_bool,
    "bytes_to_bytes": standard.identity,
    "string_to_bytes": lambda s: s.encode(),
    "double_to_double": standard.identity,
    "int64_to_double": float,
    "string_to_double": string_to_double,
    "uint64_to_double": float,
    "duration_to_duration": standard.identity,
    "string_to_duration": string_to_duration,
    "int64_to_int64": standard.identity,
    "double_to_int64": double_to_int,
    "duration_to_int64": lambda d: d.nanos,
    "string_to_int64": string_to_int,
    "timestamp_to_int64": lambda t: t.nanos // standard.NS,
    "uint64_to_int64": uint_to_int,
    "string_to_string": standard.identity,
    "bool_to_string": lambda b: "true" if b else "false",
    "bytes_to_string": bytes_to_string,
    "double_to_string": golang.format_float_g,
    "duration_to_string": duration_to_string,
    "int64_to_string": str,
    "timestamp_to_string": timestamp_to_string,
    "uint64_to_string": lambda u: str(int(u)),
    "timestamp_to_timestamp": standard.identity,
    "int64_to_timestamp": int_to_timestamp,
    "string_to_timestamp": string_to_timestamp,
    "uint64_to_uint64": standard.identity,
    "double_to_uint64": double_to_uint,
    "int64_to_uint64": int_to_uint,
    "string_to_uint64": string_to_uint,
}

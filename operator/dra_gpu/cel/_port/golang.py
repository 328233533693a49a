"""The pieces of Go's standard library whose exact behaviour shows through CEL.

``strconv`` (ParseInt/ParseUint/ParseFloat/ParseBool, FormatFloat 'g' and 'f'), ``time``
(RFC 3339 parsing and RFC3339Nano formatting, ParseDuration), ``strings`` (Split, TrimSpace) and
``unicode.IsSpace``: Python's own versions accept other inputs (underscores, Unicode digits,
"  1") or print other text ("1000000.0" for Go's "1e+06"). Pure functions; no I/O.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Final

from dra_gpu.cel._port.values import INT64_MAX, INT64_MIN, UINT64_MAX

__all__ = [
    "format_float_f",
    "format_float_g",
    "format_rfc3339_nano",
    "parse_bool",
    "parse_duration",
    "parse_float",
    "parse_int",
    "parse_rfc3339",
    "parse_uint",
    "split_n",
    "trim_space",
]


# --- strconv -------------------------------------------------------------------------------------

_DEC: Final = re.compile(r"[+-]?[0-9]+")
_UDEC: Final = re.compile(r"[0-9]+")


def parse_int(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64); None on error."""
    if not _DEC.fullmatch(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


def parse_uint(text: str) -> int | None:
    """strconv.ParseUint(text, 10, 64); None on error (no sign allowed)."""
    if not _UDEC.fullmatch(text):
        return None
    value = int(text)
    return value if value <= UINT64_MAX else None


def parse_bool(text: str) -> bool | None:
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


_SPECIAL: Final = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")


def parse_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64): Go's syntax (underscores, hex), inf/nan; None on error."""
    if not text:
        return None
    body = text
    negative = False
    if body[0] in "+-":
        negative = body[0] == "-"
        body = body[1:]
    special = _SPECIAL.get(body.lower())
    if special is not None:
        if special != special:
            return None if text[0] in "+-" else math.nan
        return -special if negative else special
    hexadecimal = body[:2] in ("0x", "0X")
    i = 2 if hexadecimal else 0
    digits = _HEX_DIGITS if hexadecimal else frozenset("0123456789")
    saw_digits = saw_dot = False
    while i < len(body):
        c = body[i]
        if c == "_":
            pass
        elif c == ".":
            if saw_dot:
                return None
            saw_dot = True
        elif c in digits:
            saw_digits = True
        else:
            break
        i += 1
    if not saw_digits:
        return None
    saw_exponent = False
    if i < len(body) and body[i] in ("pP" if hexadecimal else "eE"):
        i += 1
        if i < len(body) and body[i] in "+-":
            i += 1
        exponent_digits = False
        while i < len(body) and ((body[i].isascii() and body[i].isdigit()) or body[i] == "_"):
            exponent_digits = exponent_digits or body[i] != "_"
            i += 1
        if not exponent_digits:
            return None
        saw_exponent = True
    if i != len(body) or (hexadecimal and not saw_exponent):
        return None
    if "_" in text and not _underscores_ok(text):
        return None
    clean = body.replace("_", "")
    try:
        value = float.fromhex(clean) if hexadecimal else float(clean)
    except (OverflowError, ValueError):
        return None
    if math.isinf(value):
        return None  # out of range: Go's ErrRange
    return -value if negative else value


def _underscores_ok(text: str) -> bool:
    """Go's underscoreOK: underscores only between digits (a base prefix counts as one)."""
    saw = "^"
    s = text[1:] if text[:1] in "+-" else text
    i = 0
    hexadecimal = False
    if len(s) >= 2 and s[0] == "0" and s[1].lower() in "box":
        i = 2
        saw = "0"
        hexadecimal = s[1].lower() == "x"
    while i < len(s):
        c = s[i]
        if c.isascii() and (c.isdigit() or (hexadecimal and c.lower() in "abcdef")):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
        i += 1
    return saw != "_"


def _shortest_digits(value: float) -> tuple[str, int]:
    """(digits, decimal point position) of the shortest repr that round-trips."""
    text = repr(abs(value))
    if "e" in text:
        mantissa, exponent = text.split("e")
        point = int(exponent)
    else:
        mantissa, point = text, 0
    whole, _, fraction = mantissa.partition(".")
    if fraction == "0":
        fraction = ""
    digits = (whole + fraction).lstrip("0")
    point += len(whole)
    stripped = whole + fraction
    leading = len(stripped) - len(stripped.lstrip("0"))
    point -= leading
    digits = digits.rstrip("0") or "0"
    return digits, point


def _special(value: float) -> str | None:
    """Go's text for NaN, the infinities and (signed) zero; None for any other value."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return ("-" if math.copysign(1.0, value) < 0 else "") + "0"
    return None


def format_float_g(value: float) -> str:
    """fmt.Sprintf("%g", value): shortest digits; %e below 1e-4 and from 1e+06, as Go does."""
    if (special := _special(value)) is not None:
        return special
    sign = "-" if value < 0 else ""
    digits, point = _shortest_digits(value)
    exponent = point - 1
    if exponent < -4 or exponent >= 6:  # %g with the shortest digits: Go's eprec 6
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        esign = "-" if exponent < 0 else "+"
        return f"{sign}{mantissa}e{esign}{abs(exponent):02d}"
    return sign + _positional(digits, point)


def _positional(digits: str, point: int) -> str:
    if point <= 0:
        return "0." + "0" * -point + digits
    if point >= len(digits):
        return digits + "0" * (point - len(digits))
    return digits[:point] + "." + digits[point:]


def format_float_f(value: float) -> str:
    """strconv.FormatFloat(value, 'f', -1, 64)."""
    if (special := _special(value)) is not None:
        return special
    digits, point = _shortest_digits(value)
    return ("-" if value < 0 else "") + _positional(digits, point)


# --- time ----------------------------------------------------------------------------------------

# time.Parse(time.RFC3339, s): the fast path, then the general parser, which also takes a
# one-digit hour, a comma before the fraction and zone offsets up to 24:60.
_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})([.,][0-9]+)?"
    r"(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))"
)
_DAYS_IN_MONTH: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_EPOCH_ORDINAL: Final = datetime.date(1970, 1, 1).toordinal()


def parse_rfc3339(text: str) -> tuple[int, int] | None:
    """time.Parse(time.RFC3339, text): (nanoseconds since the epoch, UTC offset in seconds)."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match[i]) for i in range(1, 7))
    if not 1 <= month <= 12:
        return None
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = _DAYS_IN_MONTH[month - 1] + (1 if month == 2 and leap else 0)
    if not 1 <= day <= days or hour > 23 or minute > 59 or second > 59:
        return None
    fraction = match[7] or ""
    nanos = int((fraction[1:] + "000000000")[:9]) if fraction else 0
    offset = 0
    if match[9]:
        oh, om = int(match[10]), int(match[11])
        if oh > 24 or om > 60:
            return None
        offset = (oh * 3600 + om * 60) * (-1 if match[9] == "-" else 1)
    if year == 0:
        return None  # datetime cannot hold year 0; it is outside CEL's range anyway
    ordinal = datetime.date(year, month, day).toordinal() - _EPOCH_ORDINAL
    seconds = ordinal * 86400 + hour * 3600 + minute * 60 + second - offset
    return seconds * 1_000_000_000 + nanos, offset


def format_rfc3339_nano(nanos: int, offset: int) -> str:
    """time.Time.Format(time.RFC3339Nano) in a zone ``offset`` seconds east of UTC."""
    seconds, fraction = divmod(nanos, 1_000_000_000)
    local = seconds + offset
    days, rest = divmod(local, 86400)
    date = datetime.date.fromordinal(days + _EPOCH_ORDINAL)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    text = f"{date.year:04d}-{date.month:02d}-{date.day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    if fraction:
        text += "." + f"{fraction:09d}".rstrip("0")
    if offset == 0:
        return text + "Z"
    sign = "+" if offset > 0 else "-"
    oh, om = divmod(abs(offset) // 60, 60)
    return f"{text}{sign}{oh:02d}:{om:02d}"


_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5
    "μs": 1_000,  # U+03BC
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART: Final = re.compile(r"([0-9]*)(\.[0-9]*)?([^0-9.]*)")


def parse_duration(text: str) -> int | None:
    """time.ParseDuration: nanoseconds, None on error (including overflow)."""
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    total = 0
    while s:
        match = _DURATION_PART.match(s)
        if match is None:
            return None
        whole, fraction, unit = match[1], match[2] or "", match[3]
        if not whole and len(fraction) <= 1:
            return None  # no digits
        if unit not in _UNITS:
            return None
        scale = _UNITS[unit]
        value = int(whole or "0")
        if value > 2**63 or value > (1 << 63) // scale:
            return None
        part = value * scale
        if fraction[1:]:
            digits = fraction[1:]
            # Go adds the fraction in float64: v += int64(float64(f) * (float64(unit) / scale))
            f = 0
            fscale = 1.0
            for d in digits:
                if f > (2**63 - 1) // 10:
                    continue  # Go drops digits that would overflow
                f = f * 10 + int(d)
                fscale *= 10
            part += int(float(f) * (float(scale) / fscale))
        if part > 2**63:
            return None
        total += part
        if total > 2**63:
            return None
        s = s[match.end() :]
    if negative:
        total = -total
    if total > 2**63 - 1 or total < -(2**63):
        return None
    return total


# --- strings -------------------------------------------------------------------------------------

GO_SPACE: Final = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def trim_space(text: str) -> str:
    start = 0
    end = len(text)
    while start < end and text[start] in GO_SPACE:
        start += 1
    while end > start and text[end - 1] in GO_SPACE:
        end -= 1
    return text[start:end]


def split_n(text: str, sep: str, n: int) -> list[str]:
    """strings.SplitN (n < 0: all)."""
    if n == 0:
        return []
    if sep == "":
        runes = list(text)
        if n < 0 or n > len(runes):
            n = len(runes)
        if n == 0:
            return []
        return [*runes[: n - 1], "".join(runes[n - 1 :])]
    if n < 0:
        n = text.count(sep) + 1
    parts: list[str] = []
    while len(parts) < n - 1:
        index = text.find(sep)
        if index < 0:
            break
        parts.append(text[:index])
        text = text[index + len(sep) :]
    parts.append(text)
    return parts

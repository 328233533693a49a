"""``string.format`` of cel-go's ext strings library, version 2 (``ext/formatting_v2.go``).

The en_US formatter: ``%s`` (lists and maps written as CEL literals, map keys in order), ``%d``,
``%f`` with grouped thousands, ``%b``, ``%x``/``%X``, ``%o``; ``%e`` (golang.org/x/text's
scientific notation) is refused as unsupported, at compile time when the format is constant.

Owns: ``string_format``, ``format_clauses`` (the compile-time check of a constant format) and
``UNSUPPORTED_SCIENTIFIC``.
Must not: convert values its own way: ``%s`` writes what ``string()`` would (``conversions``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import golang
from dra_gpu.cel._port.library import conversions, strings
from dra_gpu.cel._port.library.runtime_types import type_name
from dra_gpu.cel._port.values import CelError, CelType, Duration, Timestamp, Uint, from_key

__all__ = ["IMPLEMENTATIONS", "UNSUPPORTED_SCIENTIFIC", "format_clauses", "string_format"]


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
        if c in strings.ESCAPES:
            out.append(strings.ESCAPES[c])
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
        return f"timestamp({_go_quote(conversions.timestamp_to_string(arg))})"
    if t is Duration:
        return f"duration({_go_quote(conversions.duration_to_string(arg))})"
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
        number = conversions.string_to_double(arg) if special else arg
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
    bytes: conversions.bytes_to_string,
    Timestamp: conversions.timestamp_to_string,
    Duration: conversions.duration_to_string,
}


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {"string_format": string_format}

"""cel-go's ext strings library, version 2: ``charAt``, ``indexOf``, ``lastIndexOf``,
``lowerAscii``, ``upperAscii``, ``replace``, ``split``, ``substring``, ``trim``, ``join``,
``strings.quote``, and ``contains``/``startsWith``/``endsWith`` of the standard library.

Indexes count code points, as cel-go does; the errors are cel-go's ("index out of range: 5").
``string.format`` is ``formatting``'s, ``find``/``findAll`` the regex library's.

Owns: ``IMPLEMENTATIONS`` of these overloads, and Go's backslash escapes (``ESCAPES``).
Must not: use Python's string methods where Go's differ (``golang`` has Split and TrimSpace).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import golang
from dra_gpu.cel._port.library.runtime_types import no_such_overload
from dra_gpu.cel._port.values import CelError

__all__ = ["ESCAPES", "IMPLEMENTATIONS"]


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


ESCAPES: Final = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}  # fmt: skip
"""Go's backslash escapes: strings.quote and strconv.Quote use the same."""


def quote(s: str) -> str:
    return '"' + "".join(ESCAPES.get(c, c) for c in s) + '"'


def _strings2(fn: Callable[[str, str], bool]) -> Callable[[Any, Any], bool]:
    # DisableTypeGuards: the implementation checks its own arguments.
    def call(s: Any, t: Any) -> bool:
        if type(s) is not str or type(t) is not str:
            raise no_such_overload()
        return fn(s, t)

    return call


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
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
}

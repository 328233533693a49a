"""The character classes of Go's ``regexp/syntax``, as code point ranges, and their Python text.

Perl classes (``\\d \\s \\w``, ASCII as in Go), POSIX classes (``[:alpha:]``), Unicode
general categories (``\\pL``, ``\\p{Lu}``, from Python's ``unicodedata``), Go's simple case
folding, negation, and a class written out as a Python ``re`` class of the same code points.

Owns: ``Ranges`` and the class tables (``PERL``, ``POSIX``, ``CATEGORIES``), ``category_ranges``,
``fold``, ``negate``, ``clean``, ``class_text``, ``escape_char``.
Must not: parse a pattern (``regex`` does).
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
import unicodedata
from typing import Final

__all__ = [
    "CATEGORIES",
    "MAX_RUNE",
    "PERL",
    "POSIX",
    "Ranges",
    "category_ranges",
    "class_text",
    "clean",
    "escape_char",
    "fold",
    "negate",
]

MAX_RUNE: Final = 0x10FFFF
Ranges = list[tuple[int, int]]

PERL: Final[dict[str, tuple[int, Ranges]]] = {
    "d": (1, [(0x30, 0x39)]),
    "D": (-1, [(0x30, 0x39)]),
    "s": (1, [(0x9, 0xA), (0xC, 0xD), (0x20, 0x20)]),
    "S": (-1, [(0x9, 0xA), (0xC, 0xD), (0x20, 0x20)]),
    "w": (1, [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]),
    "W": (-1, [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]),
}
POSIX: Final[dict[str, Ranges]] = {
    "alnum": [(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)],
    "alpha": [(0x41, 0x5A), (0x61, 0x7A)],
    "ascii": [(0x0, 0x7F)],
    "blank": [(0x9, 0x9), (0x20, 0x20)],
    "cntrl": [(0x0, 0x1F), (0x7F, 0x7F)],
    "digit": [(0x30, 0x39)],
    "graph": [(0x21, 0x7E)],
    "lower": [(0x61, 0x7A)],
    "print": [(0x20, 0x7E)],
    "punct": [(0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)],
    "space": [(0x9, 0xD), (0x20, 0x20)],
    "upper": [(0x41, 0x5A)],
    "word": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "xdigit": [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)],
}
CATEGORIES: Final = frozenset(
    [
        "C",
        "Cc",
        "Cf",
        "Co",
        "Cs",
        "L",
        "Ll",
        "Lm",
        "Lo",
        "Lt",
        "Lu",
        "M",
        "Mc",
        "Me",
        "Mn",
        "N",
        "Nd",
        "Nl",
        "No",
        "P",
        "Pc",
        "Pd",
        "Pe",
        "Pf",
        "Pi",
        "Po",
        "Ps",
        "S",
        "Sc",
        "Sk",
        "Sm",
        "So",
        "Z",
        "Zl",
        "Zp",
        "Zs",
    ]
)


@functools.lru_cache(maxsize=64)
def category_ranges(name: str) -> tuple[tuple[int, int], ...]:
    """Code point ranges of a Unicode general category (one or two letters), or "Any"."""
    if name == "Any":
        return ((0, MAX_RUNE),)
    ranges: Ranges = []
    start = -1
    for cp in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(cp))
        inside = category == name or (len(name) == 1 and category[0] == name)
        if name == "C" and category == "Cn":
            inside = False  # Go's C is Cc|Cf|Co|Cs: unassigned code points are not in it
        if inside and start < 0:
            start = cp
        elif not inside and start >= 0:
            ranges.append((start, cp - 1))
            start = -1
    if start >= 0:
        ranges.append((start, sys.maxunicode))
    return tuple(ranges)


@functools.lru_cache(maxsize=1)
def _orbits() -> tuple[tuple[int, ...], ...]:
    """Simple case-folding orbits (k, K, U+212A KELVIN SIGN...) of two or more code points."""
    groups: dict[str, list[int]] = {}
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        key = c.casefold()
        if len(key) != 1:
            key = c.lower()
            if len(key) != 1:
                continue
        groups.setdefault(key, []).append(cp)
    return tuple(tuple(m) for m in groups.values() if len(m) > 1)


def fold(ranges: Ranges) -> Ranges:
    """Go's folded class: every member of the case orbit of anything in ``ranges``."""
    ranges = clean(ranges)
    starts = [lo for lo, _ in ranges]
    extra: Ranges = []
    for members in _orbits():
        for m in members:
            k = bisect.bisect_right(starts, m) - 1
            if k >= 0 and ranges[k][1] >= m:
                extra += [(x, x) for x in members]
                break
    return clean(ranges + extra)


def negate(ranges: Ranges) -> Ranges:
    out: Ranges = []
    nxt = 0
    for lo, hi in clean(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_RUNE:
        out.append((nxt, MAX_RUNE))
    return out


def clean(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def class_text(ranges: Ranges) -> str:
    ranges = clean(ranges)
    if not ranges:
        return "(?!)"  # matches nothing, as an empty Go class
    parts = []
    for lo, hi in ranges:
        if lo == hi:
            parts.append(_class_char(lo))
        else:
            parts.append(f"{_class_char(lo)}-{_class_char(hi)}")
    return "[" + "".join(parts) + "]"


def _class_char(cp: int) -> str:
    return escape_char(min(cp, sys.maxunicode))


def escape_char(cp: int) -> str:
    if cp < 0x20 or cp == 0x7F or 0xD800 <= cp <= 0xDFFF:
        return f"\\U{cp:08x}"
    return re.escape(chr(cp))

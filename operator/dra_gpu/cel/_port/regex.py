"""Go (RE2) regular expressions, run by Python's ``re`` with Go's meaning.

CEL's ``matches``, ``find`` and ``findAll`` use Go's ``regexp`` package. Python's ``re`` reads the
same text differently: ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are Unicode-aware there, ASCII in Go;
``$`` also matches before a final newline; ``x{,3}`` is a repetition (a literal in Go); ``(?i)``
must open the pattern; and Python accepts what Go rejects (lookarounds, backreferences,
possessive repetitions, ``\\Z``). So patterns are parsed here the way ``regexp/syntax`` parses
them (Perl flags: one-line, ``\\pN`` groups, the ``i m s U`` flags), Go's errors are raised as Go
raises them, and an equivalent Python pattern is written out with every flag resolved per atom.

Unsupported, with a clear error instead of a different answer: Unicode script classes such as
``\\p{Greek}`` (Python has no script data; general categories like ``\\p{Lu}`` work).

The parser is here; the character classes, as code point ranges, are ``regex_classes``'.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from dra_gpu.cel._port import regex_classes

__all__ = ["RegexError", "compile_go", "find_all"]


class RegexError(ValueError):
    """The pattern does not compile in Go; ``str()`` reads like Go's ``error parsing regexp``."""


class UnsupportedRegex(RegexError):
    """Go accepts the pattern but this translation cannot reproduce it."""


_FLAG_NAMES: Final = {"i": "fold", "m": "multi", "s": "dot_nl", "U": "ungreedy"}
"""The flags of ``(?flags)`` and ``(?flags:re)``, by letter."""


class _Flags:
    __slots__ = ("dot_nl", "fold", "multi", "ungreedy")

    def __init__(self, fold: bool = False, multi: bool = False, dot_nl: bool = False,
                 ungreedy: bool = False) -> None:  # fmt: skip
        self.fold = fold
        self.multi = multi
        self.dot_nl = dot_nl
        self.ungreedy = ungreedy

    def copy(self) -> _Flags:
        return _Flags(self.fold, self.multi, self.dot_nl, self.ungreedy)


class _Node:
    """A parsed piece: its Python text, whether it may be repeated, its largest repeat."""

    __slots__ = ("max_repeat", "pseudo", "repeatable", "text")

    def __init__(self, text: str, repeatable: bool = True, max_repeat: int = 0,
                 pseudo: bool = False) -> None:  # fmt: skip
        self.text = text
        self.repeatable = repeatable
        self.max_repeat = max_repeat
        self.pseudo = pseudo


def _error(code: str, expr: str) -> RegexError:
    return RegexError(f"error parsing regexp: {code}: `{expr}`")


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.i = 0

    def parse(self) -> str:
        flags = _Flags()
        text, _ = self.alternation(flags, top=True)
        if self.i < len(self.pattern):
            raise _error("unexpected )", self.pattern)
        return text

    def alternation(self, flags: _Flags, top: bool = False) -> tuple[str, int]:
        branches = [self.concat(flags)]
        while self.i < len(self.pattern) and self.pattern[self.i] == "|":
            self.i += 1
            branches.append(self.concat(flags))
        if self.i < len(self.pattern) and self.pattern[self.i] == ")" and top:
            raise _error("unexpected )", self.pattern)
        return "|".join(text for text, _ in branches), max(m for _, m in branches)

    def concat(self, flags: _Flags) -> tuple[str, int]:
        nodes: list[_Node] = []
        last_repeat = ""
        p = self.pattern
        while self.i < len(p) and p[self.i] not in "|)":
            c = p[self.i]
            start = self.i
            if c in "*+?" or (c == "{" and self._repeat_at(self.i) is not None):
                if c == "{":
                    lo, hi, end = self._repeat_at(self.i)  # type: ignore[misc]
                    if lo < 0 or lo > 1000 or hi > 1000 or (hi >= 0 and lo > hi):
                        raise _error("invalid repeat count", p[start:end])
                    self.i = end
                    quantifier = (
                        f"{{{lo}}}" if hi == lo else (f"{{{lo},}}" if hi < 0 else f"{{{lo},{hi}}}")
                    )
                    counted = hi if hi >= 0 else lo
                else:
                    self.i += 1
                    quantifier = c
                    counted = 0
                non_greedy = flags.ungreedy
                if self.i < len(p) and p[self.i] == "?":
                    self.i += 1
                    non_greedy = not non_greedy
                if last_repeat:
                    raise _error(
                        "invalid nested repetition operator", last_repeat + p[start : self.i]
                    )
                if not nodes or nodes[-1].pseudo:
                    raise _error("missing argument to repetition operator", p[start : self.i])
                sub = nodes[-1]
                if c == "{" and (lo >= 2 or hi >= 2) and not _repeat_valid(sub.max_repeat, counted):
                    raise _error("invalid repeat count", p[start : self.i])
                nodes[-1] = _Node(
                    f"(?:{sub.text}){quantifier}{'?' if non_greedy else ''}",
                    max_repeat=max(sub.max_repeat, 1) * max(counted, 1)
                    if c == "{"
                    else sub.max_repeat,
                )
                last_repeat = p[start : self.i]
                continue
            last_repeat = ""
            node = self.atom(flags)
            if node is not None:
                nodes.append(node)
        return "".join(n.text for n in nodes), max((n.max_repeat for n in nodes), default=0)

    def _repeat_at(self, i: int) -> tuple[int, int, int] | None:
        """Go's parseRepeat: (min, max (-1 open), end) for {n}, {n,}, {n,m}; else None."""
        p = self.pattern
        j = i + 1
        lo, j = _parse_int(p, j)
        if lo is None or j >= len(p):
            return None
        if p[j] != ",":
            hi = lo
        else:
            j += 1
            if j >= len(p):
                return None
            if p[j] == "}":
                hi = -1
            else:
                parsed, j = _parse_int(p, j)
                if parsed is None:
                    return None
                hi = parsed
                if hi < 0:
                    lo = -1
        if j >= len(p) or p[j] != "}":
            return None
        return lo, hi, j + 1

    def atom(self, flags: _Flags) -> _Node | None:
        p = self.pattern
        c = p[self.i]
        if c == "(":
            return self.group(flags)
        if c == "^":
            self.i += 1
            return _Node("(?m:^)" if flags.multi else r"\A")
        if c == "$":
            self.i += 1
            return _Node("(?m:$)" if flags.multi else r"\Z")
        if c == ".":
            self.i += 1
            return _Node("(?s:.)" if flags.dot_nl else r"[^\n]")
        if c == "[":
            return _Node(regex_classes.class_text(self.char_class(flags)))
        if c == "\\":
            return self.escape(flags)
        self.i += 1
        return _Node(self._literal(ord(c), flags))

    def _literal(self, cp: int, flags: _Flags) -> str:
        if flags.fold:
            folded = regex_classes.fold([(cp, cp)])
            if folded != [(cp, cp)]:
                return regex_classes.class_text(folded)
        return regex_classes.escape_char(cp)

    def _group(
        self, sign: int, ranges: regex_classes.Ranges, flags: _Flags
    ) -> regex_classes.Ranges:
        # appendGroup: fold the positive class first, then negate, as Go does
        if flags.fold:
            ranges = regex_classes.fold(ranges)
        return ranges if sign > 0 else regex_classes.negate(ranges)

    def group(self, flags: _Flags) -> _Node | None:
        p = self.pattern
        start = self.i
        if p.startswith("(?", self.i):
            rest = p[self.i :]
            starts_p = len(rest) > 4 and rest[2] == "P" and rest[3] == "<"
            starts_name = len(rest) > 3 and rest[2] == "<"
            if starts_p or starts_name:
                name_start = self.i + (4 if starts_p else 3)
                end = p.find(">", self.i)
                if end < 0:
                    raise _error("invalid named capture", p[start:])
                name = p[name_start:end]
                if not name or not all(ch == "_" or (ch.isascii() and ch.isalnum()) for ch in name):
                    raise _error("invalid named capture", p[start : end + 1])
                self.i = end + 1
                return self._group_body(flags.copy(), start, capture=True)
            j = self.i + 2
            new = flags.copy()
            sign = 1
            saw_flag = False
            while j < len(p):
                ch = p[j]
                j += 1
                if ch in _FLAG_NAMES:
                    setattr(new, _FLAG_NAMES[ch], sign > 0)
                    saw_flag = True
                elif ch == "-":
                    if sign < 0:
                        break
                    sign = -1
                    saw_flag = False
                elif ch in ":)":
                    if sign < 0 and not saw_flag:
                        break
                    self.i = j
                    if ch == ")":
                        flags.fold, flags.multi = new.fold, new.multi
                        flags.dot_nl, flags.ungreedy = new.dot_nl, new.ungreedy
                        return None  # flags change for the rest of the group
                    return self._group_body(new, start, capture=False)
                else:
                    break
            raise _error("invalid or unsupported Perl syntax", p[start:j])
        self.i += 1
        return self._group_body(flags.copy(), start, capture=True)

    def _group_body(self, flags: _Flags, start: int, *, capture: bool) -> _Node:
        inner, inner_max = self.alternation(flags)
        if self.i >= len(self.pattern) or self.pattern[self.i] != ")":
            raise _error("missing closing )", self.pattern)
        self.i += 1
        return _Node(f"({inner})" if capture else f"(?:{inner})", max_repeat=inner_max)

    def escape(self, flags: _Flags) -> _Node | None:
        p = self.pattern
        if self.i + 1 >= len(p):
            raise _error("trailing backslash at end of expression", "")
        c = p[self.i + 1]
        simple = {"A": r"\A", "z": r"\Z", "b": r"(?a:\b)", "B": r"(?a:\B)"}
        if c in simple:
            self.i += 2
            return _Node(simple[c])
        if c == "C":
            raise _error("invalid escape sequence", p[self.i : self.i + 2])
        if c == "Q":
            end = p.find(r"\E", self.i + 2)
            literal = p[self.i + 2 :] if end < 0 else p[self.i + 2 : end]
            self.i = len(p) if end < 0 else end + 2
            if not literal:
                return None
            return _Node("".join(self._literal(ord(ch), flags) for ch in literal))
        if c in "pP":
            return _Node(regex_classes.class_text(self.unicode_class(flags)))
        if c in regex_classes.PERL:
            self.i += 2
            sign, ranges = regex_classes.PERL[c]
            return _Node(regex_classes.class_text(self._group(sign, ranges, flags)))
        return _Node(self._literal(self.escape_char(), flags))

    def escape_char(self) -> int:
        """Go's parseEscape at self.i (a backslash): the code point; advances past it."""
        p = self.pattern
        start = self.i
        if self.i + 1 >= len(p):
            raise _error("trailing backslash at end of expression", "")
        c = p[self.i + 1]
        self.i += 2
        if c.isascii() and not c.isalnum():
            return ord(c)
        if c in "1234567" and not (self.i < len(p) and p[self.i] in "01234567"):
            raise _error("invalid escape sequence", p[start : self.i])
        if c in "01234567":
            value = ord(c) - 48
            for _ in range(2):
                if self.i < len(p) and p[self.i] in "01234567":
                    value = value * 8 + ord(p[self.i]) - 48
                    self.i += 1
                else:
                    break
            return value
        if c == "x":
            if self.i >= len(p):
                raise _error("invalid escape sequence", p[start : self.i])
            if p[self.i] == "{":
                end = p.find("}", self.i)
                digits = p[self.i + 1 : end] if end > 0 else ""
                if end < 0 or not digits or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise _error(
                        "invalid escape sequence", p[start : end + 1 if end > 0 else len(p)]
                    )
                value = int(digits, 16)
                if value > regex_classes.MAX_RUNE:
                    raise _error("invalid escape sequence", p[start : end + 1])
                self.i = end + 1
                return value
            digits = p[self.i : self.i + 2]
            if len(digits) < 2 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise _error("invalid escape sequence", p[start : self.i + 2])
            self.i += 2
            return int(digits, 16)
        named = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
        if c in named:
            return named[c]
        raise _error("invalid escape sequence", p[start : self.i])

    def unicode_class(self, flags: _Flags) -> regex_classes.Ranges:
        p = self.pattern
        start = self.i
        sign = 1 if p[self.i + 1] == "p" else -1
        self.i += 2
        if self.i >= len(p):
            raise _error("invalid character class range", p[start:])
        if p[self.i] == "{":
            end = p.find("}", self.i)
            if end < 0:
                raise _error("invalid character class range", p[start:])
            name = p[self.i + 1 : end]
            self.i = end + 1
        else:
            name = p[self.i]
            self.i += 1
        if name.startswith("^"):
            sign = -sign
            name = name[1:]
        if name != "Any" and name not in regex_classes.CATEGORIES:
            if name.isascii() and name.replace("_", "").isalpha():
                raise UnsupportedRegex(
                    f"Unicode class \\p{{{name}}} in regular expression {self.pattern!r} is not "
                    "supported by dra-gpu's CEL evaluator (only general categories such as "
                    "\\p{Lu})"
                )
            raise _error("invalid character class range", p[start : self.i])
        return self._group(sign, list(regex_classes.category_ranges(name)), flags)

    def char_class(self, flags: _Flags) -> regex_classes.Ranges:
        p = self.pattern
        start = self.i
        self.i += 1
        negated = False
        if self.i < len(p) and p[self.i] == "^":
            negated = True
            self.i += 1
        ranges: regex_classes.Ranges = []
        first = True
        while self.i >= len(p) or p[self.i] != "]" or first:
            if self.i >= len(p):
                raise _error("missing closing ]", p[start:])
            first = False
            if p.startswith("[:", self.i):
                end = p.find(":]", self.i + 2)
                if end >= 0:
                    name = p[self.i + 2 : end]
                    negate = name.startswith("^")
                    group = regex_classes.POSIX.get(name[1:] if negate else name)
                    if group is None:
                        raise _error("invalid character class range", p[self.i : end + 2])
                    ranges += self._group(-1 if negate else 1, group, flags)
                    self.i = end + 2
                    continue
            if p.startswith("\\p", self.i) or p.startswith("\\P", self.i):
                ranges += self.unicode_class(flags)
                continue
            if p[self.i] == "\\" and self.i + 1 < len(p) and p[self.i + 1] in regex_classes.PERL:
                sign, group = regex_classes.PERL[p[self.i + 1]]
                ranges += self._group(sign, group, flags)
                self.i += 2
                continue
            lo = self.class_char(start)
            hi = lo
            if self.i + 1 < len(p) and p[self.i] == "-" and p[self.i + 1] != "]":
                range_start = self.i
                self.i += 1
                hi = self.class_char(start)
                if hi < lo:
                    raise _error("invalid character class range", p[range_start - 1 : self.i])
            ranges += regex_classes.fold([(lo, hi)]) if flags.fold else [(lo, hi)]
        self.i += 1
        return regex_classes.negate(ranges) if negated else regex_classes.clean(ranges)

    def class_char(self, start: int) -> int:
        p = self.pattern
        if self.i >= len(p):
            raise _error("missing closing ]", p[start:])
        if p[self.i] == "\\":
            return self.escape_char()
        self.i += 1
        return ord(p[self.i - 1])


def _parse_int(text: str, i: int) -> tuple[int | None, int]:
    if i >= len(text) or not ("0" <= text[i] <= "9"):
        return None, i
    if i + 1 < len(text) and text[i] == "0" and "0" <= text[i + 1] <= "9":
        return None, i
    j = i
    while j < len(text) and "0" <= text[j] <= "9":
        j += 1
    digits = text[i:j]
    value = int(digits) if len(digits) <= 9 else -1
    if value >= 10**8:
        value = -1
    return value, j


def _repeat_valid(inner_max: int, count: int) -> bool:
    # regexp/syntax repeatIsValid(re, 1000): nested counted repetitions multiply up to 1000.
    limit = 1000
    if count > limit:
        return False
    if count > 0:
        limit //= count
    return inner_max <= limit if inner_max else True


@functools.lru_cache(maxsize=1024)
def compile_go(pattern: str) -> re.Pattern[str]:
    """regexp.Compile(pattern) as a Python pattern; RegexError as Go would fail."""
    translated = _Parser(pattern).parse()
    try:
        return re.compile(translated)
    except (re.error, RecursionError, OverflowError) as error:
        raise UnsupportedRegex(
            f"regular expression {pattern!r} is not supported by dra-gpu's CEL evaluator: {error}"
        ) from None


def find_all(compiled: re.Pattern[str], text: str, limit: int) -> list[str]:
    """Regexp.FindAllString(text, limit): Go skips an empty match right after a match."""
    if limit == 0:
        return []
    out: list[str] = []
    pos = 0
    previous_end = -1
    end = len(text)
    while (limit < 0 or len(out) < limit) and pos <= end:
        match = compiled.search(text, pos)
        if match is None:
            break
        accept = True
        if match.end() == pos:
            if match.start() == previous_end:
                accept = False
            pos = pos + 1 if pos < end else end + 1
        else:
            pos = match.end()
        previous_end = match.end()
        if accept:
            out.append(match.group())
    return out

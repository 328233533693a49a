"""CEL source text to tokens, and a literal token to its value, by cel-go's grammar rules.

The lexer rules of cel-go's ``CEL.g4`` (numbers, the string and bytes literal forms, escaped
identifiers, comments, reserved words) and ``parser/unescape.go`` (the escapes of a quoted
literal); errors are cel-go's, at cel-go's ``<input>:line:column``.

Owns: ``SyntaxError_``, ``tokens``, ``location``, ``unescape``, ``go_float``, ``RESERVED``.
Must not: know the grammar above the tokens (``parser``).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["RESERVED", "SyntaxError_", "Token", "go_float", "location", "tokens", "unescape"]


class SyntaxError_(Exception):
    """The expression does not parse; the message says where, as cel-go says it."""


# --- tokens --------------------------------------------------------------------------------------

_KEYWORDS: Final = {"true": "true", "false": "false", "null": "null", "in": "in"}
RESERVED: Final = frozenset(
    {
        "as", "break", "const", "continue", "else", "false", "for", "function", "if", "import",
        "in", "let", "loop", "package", "namespace", "null", "return", "true", "var", "void",
        "while",
    }
)  # fmt: skip
_PUNCTUATION: Final = (
    "==", "!=", "<=", ">=", "&&", "||",
    "<", ">", "[", "]", "{", "}", "(", ")", ".", ",", "-", "!", "?", ":", "+", "*", "/", "%",
)  # fmt: skip
_ESCAPE: Final = (
    r"""\\(?:[abfnrtv"'\\?`]|[0-3][0-7][0-7]|[xX][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})"""
)
_STRING_BODIES: Final = [
    # (prefix-less opening, regex for the rest) in the grammar's order
    ('"""', re.compile(r"(?:" + _ESCAPE + r'|[^\\])*?"""', re.DOTALL)),
    ("'''", re.compile(r"(?:" + _ESCAPE + r"|[^\\])*?'''", re.DOTALL)),
    ('"', re.compile(r"(?:" + _ESCAPE + r'|[^\\"\n\r])*"')),
    ("'", re.compile(r"(?:" + _ESCAPE + r"|[^\\'\n\r])*'")),
]
_RAW_BODIES: Final = [
    ('"""', re.compile(r'.*?"""', re.DOTALL)),
    ("'''", re.compile(r".*?'''", re.DOTALL)),
    ('"', re.compile(r'[^"\n\r]*"')),
    ("'", re.compile(r"[^'\n\r]*'")),
]
_FLOAT: Final = re.compile(r"\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?")
_UINT: Final = re.compile(r"0x[0-9a-fA-F]+[uU]|\d+[uU]")
_INT: Final = re.compile(r"0x[0-9a-fA-F]+|\d+")
_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESC_IDENT: Final = re.compile(r"`[A-Za-z0-9_./\- ]+`")
_WHITESPACE: Final = frozenset("\t \r\n\x0c")


class Token:
    __slots__ = ("kind", "pos", "text")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind = kind
        self.text = text
        self.pos = pos

    def __repr__(self) -> str:
        return f"{self.kind}:{self.text!r}"


def location(source: str, pos: int) -> str:
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1)
    return f"<input>:{line}:{column + 1}"


def tokens(source: str) -> list[Token]:
    tokens: list[Token] = []
    i = 0
    n = len(source)
    while i < n:
        c = source[i]
        if c in _WHITESPACE:
            i += 1
            continue
        if source.startswith("//", i):
            end = source.find("\n", i)
            i = n if end < 0 else end
            continue
        token = _string_token(source, i)
        if token is not None:
            tokens.append(token)
            i += len(token.text)
            continue
        if c.isascii() and (c.isdigit() or (c == "." and i + 1 < n and source[i + 1].isdigit())):
            best = ("", "")
            for kind, pattern in (("float", _FLOAT), ("int", _INT), ("uint", _UINT)):
                match = pattern.match(source, i)
                if match and len(match[0]) > len(best[1]):
                    best = (kind, match[0])
            if best[1]:
                tokens.append(Token(best[0], best[1], i))
                i += len(best[1])
                continue
        match = _IDENT.match(source, i)
        if match:
            word = match[0]
            tokens.append(Token(_KEYWORDS.get(word, "ident"), word, i))
            i += len(word)
            continue
        match = _ESC_IDENT.match(source, i)
        if match:
            tokens.append(Token("escident", match[0], i))
            i += len(match[0])
            continue
        for punct in _PUNCTUATION:
            if source.startswith(punct, i):
                tokens.append(Token(punct, punct, i))
                i += len(punct)
                break
        else:
            raise SyntaxError_(
                f"ERROR: {location(source, i)}: Syntax error: token recognition error at: '{c}'"
            )
    tokens.append(Token("eof", "", n))
    return tokens


def _string_token(source: str, i: int) -> Token | None:
    start = i
    kind = "string"
    if source[i] in "bB":
        kind = "bytes"
        i += 1
    raw = False
    if i < len(source) and source[i] in "rR":
        raw = True
        i += 1
    if i >= len(source) or source[i] not in "\"'":
        return None
    for opening, body in _RAW_BODIES if raw else _STRING_BODIES:
        if source.startswith(opening, i):
            match = body.match(source, i + len(opening))
            if match is None:
                if len(opening) == 3:
                    continue  # an empty "" followed by more: try the single-quote forms
                return None
            return Token(kind, source[start : match.end()], start)
    return None


# --- literals ------------------------------------------------------------------------------------


def unescape(text: str, is_bytes: bool) -> str | bytes:
    """parser/unescape.go for a STRING token (without its b prefix)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    raw = text[0] in "rR"
    if raw:
        text = text[1:]
    body = text[3:-3] if text.startswith(('"""', "'''")) and len(text) >= 6 else text[1:-1]
    if raw or "\\" not in body:
        return body.encode() if is_bytes else body
    out_bytes = bytearray()
    out: list[str] = []
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if c != "\\":
            if is_bytes:
                out_bytes += c.encode()
            else:
                out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            raise ValueError("unable to unescape string, found '\\' as last character")
        e = body[i + 1]
        i += 2
        simple = {
            "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?",
        }  # fmt: skip
        if e in simple:
            value = ord(simple[e])
            encode = False
        elif e in "xXuU":
            count = {"x": 2, "X": 2, "u": 4, "U": 8}[e]
            if is_bytes and e in "uU":
                raise ValueError("unable to unescape string")
            digits = body[i : i + count]
            if len(digits) < count or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError("unable to unescape string")
            value = int(digits, 16)
            i += count
            if not is_bytes and (value > 0x10FFFF or 0xD800 <= value <= 0xDFFF):
                raise ValueError("invalid unicode code point")
            encode = not is_bytes
        elif e in "0123":
            digits = body[i : i + 2]
            if len(digits) < 2 or any(d not in "01234567" for d in digits):
                raise ValueError("unable to unescape octal sequence in string")
            value = (ord(e) - 48) * 64 + int(digits, 8)
            i += 2
            encode = not is_bytes
        else:
            raise ValueError("unable to unescape string")
        if is_bytes:
            if value < 0x80 or not encode:
                out_bytes.append(value)
            else:
                out_bytes += chr(value).encode()
        else:
            out.append(chr(value))
    return bytes(out_bytes) if is_bytes else "".join(out)


def go_float(text: str) -> float | None:
    """strconv.ParseFloat for a NUM_FLOAT literal: None when out of range (Go's ErrRange)."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return None
    return value

"""CEL source text to an abstract syntax tree, as github.com/google/cel-go's parser builds it.

The grammar, the token rules (numbers, the string and bytes literal forms and their escapes,
reserved words), the limits (250 levels of recursion, 100,000 code points) and the macros of the
Kubernetes environment are cel-go's: ``has``, ``all``/``exists``/``exists_one``/``existsOne``
(one and two variables), ``map``/``filter``, ``transformList``/``transformMap``/
``transformMapEntry``, ``cel.bind``, ``optMap``/``optFlatMap`` and ``sortBy``, each expanded into
the same comprehension cel-go produces, so evaluation can follow cel-go's folding rules exactly.
``&&`` and ``||`` chains become one n-ary call (cel-go balances them into a tree; the result and
the error absorption are the same). Raises SyntaxError_ with cel-go's wording; no I/O.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.values import Uint

__all__ = [
    "ACCUMULATOR",
    "Call",
    "Comprehension",
    "CreateList",
    "CreateMap",
    "CreateStruct",
    "Expr",
    "Ident",
    "Literal",
    "Select",
    "SyntaxError_",
    "parse",
]

ACCUMULATOR: Final = "@result"
_LEGACY_ACCUMULATOR: Final = "__result__"
_UNUSED_ITER_VAR: Final = "#unused"
_MAX_RECURSION: Final = 250
_MAX_CODE_POINTS: Final = 100_000
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_UINT64_MAX: Final = 2**64 - 1


class SyntaxError_(Exception):
    """The expression does not parse; the message says where, as cel-go says it."""


# --- the tree ------------------------------------------------------------------------------------


class Expr:
    __slots__ = ("pos", "type")

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.type: Any = None  # set by the checker


class Literal(Expr):
    __slots__ = ("value",)

    def __init__(self, pos: int, value: Any) -> None:
        super().__init__(pos)
        self.value = value


class Ident(Expr):
    __slots__ = ("name",)

    def __init__(self, pos: int, name: str) -> None:
        super().__init__(pos)
        self.name = name


class Select(Expr):
    __slots__ = ("field", "operand", "resolved", "test_only")

    def __init__(self, pos: int, operand: Expr, field: str, test_only: bool = False) -> None:
        super().__init__(pos)
        self.operand = operand
        self.field = field
        self.test_only = test_only
        self.resolved: str | None = None  # set by the checker for a qualified type name


class Call(Expr):
    __slots__ = ("args", "function", "overloads", "target")

    def __init__(self, pos: int, function: str, target: Expr | None, args: list[Expr]) -> None:
        super().__init__(pos)
        self.function = function
        self.target = target
        self.args = args
        self.overloads: tuple[str, ...] = ()  # set by the checker


class CreateList(Expr):
    __slots__ = ("elements", "optional")

    def __init__(self, pos: int, elements: list[Expr], optional: list[bool]) -> None:
        super().__init__(pos)
        self.elements = elements
        self.optional = optional


class CreateMap(Expr):
    __slots__ = ("entries",)

    def __init__(self, pos: int, entries: list[tuple[Expr, Expr, bool]]) -> None:
        super().__init__(pos)
        self.entries = entries


class CreateStruct(Expr):
    __slots__ = ("fields", "type_name")

    def __init__(self, pos: int, type_name: str, fields: list[tuple[str, Expr, bool]]) -> None:
        super().__init__(pos)
        self.type_name = type_name
        self.fields = fields


class Comprehension(Expr):
    __slots__ = (
        "accu_init",
        "accu_var",
        "iter_range",
        "iter_var",
        "iter_var2",
        "loop_condition",
        "loop_step",
        "result",
    )

    def __init__(
        self,
        pos: int,
        iter_range: Expr,
        iter_var: str,
        iter_var2: str | None,
        accu_var: str,
        accu_init: Expr,
        loop_condition: Expr,
        loop_step: Expr,
        result: Expr,
    ) -> None:
        super().__init__(pos)
        self.iter_range = iter_range
        self.iter_var = iter_var
        self.iter_var2 = iter_var2
        self.accu_var = accu_var
        self.accu_init = accu_init
        self.loop_condition = loop_condition
        self.loop_step = loop_step
        self.result = result


# --- tokens --------------------------------------------------------------------------------------

_KEYWORDS: Final = {"true": "true", "false": "false", "null": "null", "in": "in"}
_RESERVED: Final = frozenset(
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


class _Token:
    __slots__ = ("kind", "pos", "text")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind = kind
        self.text = text
        self.pos = pos

    def __repr__(self) -> str:
        return f"{self.kind}:{self.text!r}"


def _location(source: str, pos: int) -> str:
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1)
    return f"<input>:{line}:{column + 1}"


def _tokens(source: str) -> list[_Token]:
    tokens: list[_Token] = []
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
                tokens.append(_Token(best[0], best[1], i))
                i += len(best[1])
                continue
        match = _IDENT.match(source, i)
        if match:
            word = match[0]
            tokens.append(_Token(_KEYWORDS.get(word, "ident"), word, i))
            i += len(word)
            continue
        match = _ESC_IDENT.match(source, i)
        if match:
            tokens.append(_Token("escident", match[0], i))
            i += len(match[0])
            continue
        for punct in _PUNCTUATION:
            if source.startswith(punct, i):
                tokens.append(_Token(punct, punct, i))
                i += len(punct)
                break
        else:
            raise SyntaxError_(
                f"ERROR: {_location(source, i)}: Syntax error: token recognition error at: '{c}'"
            )
    tokens.append(_Token("eof", "", n))
    return tokens


def _string_token(source: str, i: int) -> _Token | None:
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
            return _Token(kind, source[start : match.end()], start)
    return None


# --- literals ------------------------------------------------------------------------------------


def _unescape(text: str, is_bytes: bool) -> str | bytes:
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


def _go_float(text: str) -> float | None:
    """strconv.ParseFloat for a NUM_FLOAT literal: None when out of range (Go's ErrRange)."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return None
    return value


# --- the parser ----------------------------------------------------------------------------------


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = _tokens(source)
        self.i = 0
        self.rule_depth: dict[str, int] = {}
        # cel-go's visitor recursion depth of each node: binary operators, ?:, selections,
        # member calls and indexes count; && and || chains, unary operators and calls do not.
        self.vd: dict[int, int] = {}

    # helpers

    def peek(self, offset: int = 0) -> _Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def next(self) -> _Token:
        token = self.tokens[self.i]
        if self.i < len(self.tokens) - 1:
            self.i += 1
        return token

    def error(self, token: _Token, message: str) -> SyntaxError_:
        return SyntaxError_(f"ERROR: {_location(self.source, token.pos)}: {message}")

    def unexpected(self, token: _Token) -> SyntaxError_:
        shown = "<EOF>" if token.kind == "eof" else token.text
        return self.error(token, f"Syntax error: mismatched input '{shown}'")

    def expect(self, kind: str) -> _Token:
        token = self.next()
        if token.kind != kind:
            raise self.unexpected(token)
        return token

    def enter(self, rule: str) -> None:
        # cel-go's parse listener limits how deeply a grammar rule nests: measured, 249
        # parenthesized (or bracketed, or argument) levels parse and 250 do not.
        depth = self.rule_depth.get(rule, 0) + 1
        self.rule_depth[rule] = depth
        if depth > _MAX_RECURSION:
            raise SyntaxError_(f"expression recursion limit exceeded: {_MAX_RECURSION}")

    def leave(self, rule: str) -> None:
        self.rule_depth[rule] -= 1

    # grammar

    def depth_of(self, *nodes: Expr) -> int:
        return max((self.vd.get(id(n), 0) for n in nodes), default=0)

    def counted(self, node: Expr, *children: Expr) -> Expr:
        """A node cel-go's visitor counts towards its recursion limit of 250."""
        depth = 1 + self.depth_of(*children)
        if depth > _MAX_RECURSION:
            raise SyntaxError_("max recursion depth exceeded")
        self.vd[id(node)] = depth
        return node

    def uncounted(self, node: Expr, *children: Expr) -> Expr:
        self.vd[id(node)] = self.depth_of(*children)
        return node

    def start(self) -> Expr:
        expr = self.expr()
        if self.peek().kind != "eof":
            raise self.unexpected(self.peek())
        return expr

    def expr(self) -> Expr:
        self.enter("expr")
        condition = self.conditional_or()
        if self.peek().kind == "?":
            token = self.next()
            if_true = self.conditional_or()
            self.expect(":")
            if_false = self.expr()
            result: Expr = self.counted(
                Call(token.pos, "_?_:_", None, [condition, if_true, if_false]),
                condition,
                if_true,
                if_false,
            )
        else:
            result = condition
        self.leave("expr")
        return result

    def conditional_or(self) -> Expr:
        terms = [self.conditional_and()]
        pos = terms[0].pos
        while self.peek().kind == "||":
            pos = self.next().pos
            terms.append(self.conditional_and())
        if len(terms) == 1:
            return terms[0]
        return self.uncounted(Call(pos, "_||_", None, terms), *terms)

    def conditional_and(self) -> Expr:
        terms = [self.relation()]
        pos = terms[0].pos
        while self.peek().kind == "&&":
            pos = self.next().pos
            terms.append(self.relation())
        if len(terms) == 1:
            return terms[0]
        return self.uncounted(Call(pos, "_&&_", None, terms), *terms)

    _RELATIONS: Final = {
        "<": "_<_", "<=": "_<=_", ">=": "_>=_", ">": "_>_", "==": "_==_", "!=": "_!=_",
        "in": "@in",
    }  # fmt: skip
    _MULTIPLICATIVE: Final = {"*": "_*_", "/": "_/_", "%": "_%_"}
    _ADDITIVE: Final = {"+": "_+_", "-": "_-_"}

    def relation(self) -> Expr:
        # Left-associative; chains are limited by the visitor depth (see counted()).
        left = self.calc(0)
        while self.peek().kind in self._RELATIONS:
            token = self.next()
            right = self.calc(0)
            left = self.counted(
                Call(token.pos, self._RELATIONS[token.kind], None, [left, right]), left, right
            )
        return left

    def calc(self, precedence: int) -> Expr:
        left = self.unary()
        while True:
            kind = self.peek().kind
            if kind in self._MULTIPLICATIVE and precedence <= 2:
                function, next_precedence = self._MULTIPLICATIVE[kind], 3
            elif kind in self._ADDITIVE and precedence <= 1:
                function, next_precedence = self._ADDITIVE[kind], 2
            else:
                break
            token = self.next()
            right = self.calc(next_precedence)
            left = self.counted(Call(token.pos, function, None, [left, right]), left, right)
        return left

    def unary(self) -> Expr:
        token = self.peek()
        if token.kind == "-" and self.peek(1).kind in ("int", "float"):
            # a negative literal: the grammar's first alternative wins over Negate
            result = self.member()
        elif token.kind in ("!", "-"):
            count = 0
            while self.peek().kind == token.kind:
                self.next()
                count += 1
            operand = self.member()
            function = "!_" if token.kind == "!" else "-_"
            if count % 2 == 0:
                result = operand
            else:
                result = self.uncounted(Call(token.pos, function, None, [operand]), operand)
        else:
            result = self.member()
        return result

    def member(self) -> Expr:
        expr = self.primary()
        while True:
            token = self.peek()
            if token.kind == ".":
                self.next()
                optional = False
                if self.peek().kind == "?":
                    self.next()
                    optional = True
                name_token = self.next()
                if name_token.kind == "ident":
                    name = name_token.text
                elif name_token.kind == "escident":
                    name = name_token.text[1:-1]
                else:
                    raise self.unexpected(name_token)
                if not optional and name_token.kind == "ident" and self.peek().kind == "(":
                    self.next()
                    args = self.expr_list(")")
                    self.expect(")")
                    call = self.receiver_call_or_macro(token.pos, name, expr, args)
                    expr = self.counted(call, expr, *args)
                elif optional:
                    field = Literal(name_token.pos, name)
                    expr = self.counted(Call(token.pos, "_?._", None, [expr, field]), expr)
                else:
                    expr = self.counted(Select(token.pos, expr, name), expr)
            elif token.kind == "[":
                self.next()
                optional = False
                if self.peek().kind == "?":
                    self.next()
                    optional = True
                index = self.expr()
                self.expect("]")
                function = "_[?_]" if optional else "_[_]"
                expr = self.counted(Call(token.pos, function, None, [expr, index]), expr, index)
            else:
                break
        return expr

    def primary(self) -> Expr:
        token = self.next()
        kind = token.kind
        result: Expr
        if kind == "." or kind == "ident":
            leading = ""
            if kind == ".":
                leading = "."
                token = self.next()
                if token.kind != "ident":
                    raise self.unexpected(token)
            # a message construction: ident(.ident)* '{'
            lookahead = self.i
            names = [token.text]
            while self.tokens[lookahead].kind == "." and self.tokens[lookahead + 1].kind == "ident":
                names.append(self.tokens[lookahead + 1].text)
                lookahead += 2
            if self.tokens[lookahead].kind == "{":
                self.i = lookahead + 1
                result = self.create_message(token.pos, leading + ".".join(names))
            elif self.peek().kind == "(":
                if token.text in _RESERVED:
                    raise self.error(token, f"reserved identifier: {token.text}")
                self.next()
                args = self.expr_list(")")
                self.expect(")")
                result = self.global_call_or_macro(token.pos, leading + token.text, args)
                result = self.uncounted(result, *args)
            else:
                if token.text in _RESERVED:
                    raise self.error(token, f"reserved identifier: {token.text}")
                result = Ident(token.pos, leading + token.text)
        elif kind == "(":
            result = self.expr()
            self.expect(")")
        elif kind == "[":
            elements: list[Expr] = []
            optional: list[bool] = []
            while self.peek().kind != "]":
                opt = False
                if self.peek().kind == "?":
                    self.next()
                    opt = True
                elements.append(self.expr())
                optional.append(opt)
                if self.peek().kind == ",":
                    self.next()
                    continue
                break
            self.expect("]")
            result = self.uncounted(CreateList(token.pos, elements, optional), *elements)
        elif kind == "{":
            entries: list[tuple[Expr, Expr, bool]] = []
            while self.peek().kind != "}":
                opt = False
                if self.peek().kind == "?":
                    self.next()
                    opt = True
                key = self.expr()
                self.expect(":")
                value = self.expr()
                entries.append((key, value, opt))
                if self.peek().kind == ",":
                    self.next()
                    continue
                break
            self.expect("}")
            result = self.uncounted(
                CreateMap(token.pos, entries), *(e for k, v, _ in entries for e in (k, v))
            )
        else:
            result = self.literal(token)
        return result

    def create_message(self, pos: int, name: str) -> Expr:
        fields: list[tuple[str, Expr, bool]] = []
        while self.peek().kind != "}":
            opt = False
            if self.peek().kind == "?":
                self.next()
                opt = True
            field = self.next()
            if field.kind == "ident":
                field_name = field.text
            elif field.kind == "escident":
                field_name = field.text[1:-1]
            else:
                raise self.unexpected(field)
            self.expect(":")
            fields.append((field_name, self.expr(), opt))
            if self.peek().kind == ",":
                self.next()
                continue
            break
        self.expect("}")
        return CreateStruct(pos, name, fields)

    def expr_list(self, closing: str) -> list[Expr]:
        args: list[Expr] = []
        if self.peek().kind == closing:
            return args
        args.append(self.expr())
        while self.peek().kind == ",":
            self.next()
            args.append(self.expr())
        return args

    def literal(self, token: _Token) -> Expr:
        kind = token.kind
        negative = False
        if kind == "-":
            negative = True
            token = self.next()
            kind = token.kind
        text = token.text
        if kind == "int":
            value = int(text[2:], 16) if text.startswith("0x") else int(text)
            value = -value if negative else value
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise self.error(token, "invalid int literal")
            return Literal(token.pos, value)
        if kind == "float":
            parsed = _go_float(("-" if negative else "") + text)
            if parsed is None:
                raise self.error(token, "invalid double literal")
            return Literal(token.pos, parsed)
        if negative:
            raise self.unexpected(token)
        if kind == "uint":
            body = text[:-1]
            value = int(body[2:], 16) if body.startswith("0x") else int(body)
            if value > _UINT64_MAX:
                raise self.error(token, "invalid uint literal")
            return Literal(token.pos, Uint(value))
        if kind in ("string", "bytes"):
            try:
                unescaped = _unescape(text[1:] if kind == "bytes" else text, kind == "bytes")
            except ValueError as error:
                raise self.error(token, str(error)) from None
            return Literal(token.pos, unescaped)
        if kind == "true":
            return Literal(token.pos, True)
        if kind == "false":
            return Literal(token.pos, False)
        if kind == "null":
            return Literal(token.pos, None)
        raise self.unexpected(token)

    # macros

    def global_call_or_macro(self, pos: int, name: str, args: list[Expr]) -> Expr:
        if name == "has" and len(args) == 1:
            arg = args[0]
            if isinstance(arg, Select) and not arg.test_only:
                return Select(pos, arg.operand, arg.field, test_only=True)
            raise self.macro_error(arg, "invalid argument to has() macro")
        return Call(pos, name, None, args)

    def macro_error(self, expr: Expr, message: str) -> SyntaxError_:
        return SyntaxError_(f"ERROR: {_location(self.source, expr.pos)}: {message}")

    def receiver_call_or_macro(self, pos: int, name: str, target: Expr, args: list[Expr]) -> Expr:
        expand = _MACROS.get((name, len(args)))
        if expand is not None:
            expanded = expand(self, pos, target, args)
            if expanded is not None:
                return expanded
        return Call(pos, name, target, args)


def _iter_var(parser: _Parser, arg: Expr, message: str = "argument must be a simple name") -> str:
    if not isinstance(arg, Ident):
        raise parser.macro_error(arg, message)
    if arg.name in (ACCUMULATOR, _LEGACY_ACCUMULATOR):
        raise parser.macro_error(arg, "iteration variable overwrites accumulator variable")
    return arg.name


def _two_vars(parser: _Parser, args: list[Expr]) -> tuple[str, str]:
    first = _iter_var(parser, args[0])
    second = _iter_var(parser, args[1])
    if first == second:
        raise parser.macro_error(args[1], f"duplicate variable name: {first}")
    return first, second


def _accu(pos: int) -> Ident:
    return Ident(pos, ACCUMULATOR)


def _quantifier(kind: str, two: bool) -> Callable[..., Expr]:
    def expand(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr:
        if two:
            var, var2 = _two_vars(parser, args)
            predicate = args[2]
        else:
            var, var2 = _iter_var(parser, args[0]), None
            predicate = args[1]
        if kind == "all":
            init: Expr = Literal(pos, True)
            condition: Expr = Call(pos, "@not_strictly_false", None, [_accu(pos)])
            step: Expr = Call(pos, "_&&_", None, [_accu(pos), predicate])
            result: Expr = _accu(pos)
        elif kind == "exists":
            init = Literal(pos, False)
            condition = Call(
                pos, "@not_strictly_false", None, [Call(pos, "!_", None, [_accu(pos)])]
            )
            step = Call(pos, "_||_", None, [_accu(pos), predicate])
            result = _accu(pos)
        else:
            init = Literal(pos, 0)
            condition = Literal(pos, True)
            step = Call(
                pos,
                "_?_:_",
                None,
                [predicate, Call(pos, "_+_", None, [_accu(pos), Literal(pos, 1)]), _accu(pos)],
            )
            result = Call(pos, "_==_", None, [_accu(pos), Literal(pos, 1)])
        return Comprehension(pos, target, var, var2, ACCUMULATOR, init, condition, step, result)

    return expand


def _map(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr:
    var = _iter_var(parser, args[0], "argument is not an identifier")
    function = args[-1]
    step: Expr = Call(pos, "_+_", None, [_accu(pos), CreateList(pos, [function], [False])])
    if len(args) == 3:
        step = Call(pos, "_?_:_", None, [args[1], step, _accu(pos)])
    return Comprehension(
        pos, target, var, None, ACCUMULATOR, CreateList(pos, [], []), Literal(pos, True), step,
        _accu(pos),
    )  # fmt: skip


def _filter(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr:
    var = _iter_var(parser, args[0], "argument is not an identifier")
    step: Expr = Call(pos, "_+_", None, [_accu(pos), CreateList(pos, [args[0]], [False])])
    step = Call(pos, "_?_:_", None, [args[1], step, _accu(pos)])
    return Comprehension(
        pos, target, var, None, ACCUMULATOR, CreateList(pos, [], []), Literal(pos, True), step,
        _accu(pos),
    )  # fmt: skip


def _transform(kind: str) -> Callable[..., Expr]:
    def expand(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr:
        var, var2 = _two_vars(parser, args)
        transform = args[-1]
        init: Expr
        if kind == "list":
            step: Expr = Call(pos, "_+_", None, [_accu(pos), CreateList(pos, [transform], [False])])
            init = CreateList(pos, [], [])
        elif kind == "map":
            step = Call(pos, "cel.@mapInsert", None, [_accu(pos), Ident(pos, var), transform])
            init = CreateMap(pos, [])
        else:
            step = Call(pos, "cel.@mapInsert", None, [_accu(pos), transform])
            init = CreateMap(pos, [])
        if len(args) == 4:
            step = Call(pos, "_?_:_", None, [args[2], step, _accu(pos)])
        return Comprehension(
            pos, target, var, var2, ACCUMULATOR, init, Literal(pos, True), step, _accu(pos)
        )

    return expand


def _bind(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr | None:
    if not (isinstance(target, Ident) and target.name == "cel"):
        return None
    if not isinstance(args[0], Ident):
        raise parser.macro_error(args[0], "cel.bind() variable names must be simple identifiers")
    name = args[0].name
    return Comprehension(
        pos, CreateList(pos, [], []), _UNUSED_ITER_VAR, None, name, args[1], Literal(pos, False),
        Ident(pos, name), args[2],
    )  # fmt: skip


def _opt_map(flat: bool) -> Callable[..., Expr]:
    def expand(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr:
        if not isinstance(args[0], Ident):
            what = "optFlatMap" if flat else "optMap"
            raise parser.macro_error(args[0], f"{what}() variable name must be a simple identifier")
        name = args[0].name
        body: Expr = Comprehension(
            pos, CreateList(pos, [], []), _UNUSED_ITER_VAR, None, name,
            Call(pos, "value", copy.deepcopy(target), []), Literal(pos, False), Ident(pos, name),
            args[1],
        )  # fmt: skip
        if not flat:
            body = Call(pos, "optional.of", None, [body])
        return Call(
            pos,
            "_?_:_",
            None,
            [Call(pos, "hasValue", target, []), body, Call(pos, "optional.none", None, [])],
        )

    return expand


def _sort_by(parser: _Parser, pos: int, target: Expr, args: list[Expr]) -> Expr:
    if not isinstance(target, (CreateList, Select, Ident, Comprehension, Call)):
        raise parser.macro_error(
            target,
            "sortBy can only be applied to a list, identifier, comprehension, call or select "
            "expression",
        )
    input_name = "@__sortBy_input__"
    keys = _map(parser, pos, Ident(pos, input_name), args)
    call = Call(pos, "@sortByAssociatedKeys", Ident(pos, input_name), [keys])
    return Comprehension(
        pos, CreateList(pos, [], []), _UNUSED_ITER_VAR, None, input_name, target,
        Literal(pos, False), Ident(pos, input_name), call,
    )  # fmt: skip


_MACROS: Final[dict[tuple[str, int], Callable[..., Expr | None]]] = {
    ("all", 2): _quantifier("all", False),
    ("exists", 2): _quantifier("exists", False),
    ("exists_one", 2): _quantifier("exists_one", False),
    ("existsOne", 2): _quantifier("exists_one", False),
    ("all", 3): _quantifier("all", True),
    ("exists", 3): _quantifier("exists", True),
    ("exists_one", 3): _quantifier("exists_one", True),
    ("existsOne", 3): _quantifier("exists_one", True),
    ("map", 2): _map,
    ("map", 3): _map,
    ("filter", 2): _filter,
    ("transformList", 3): _transform("list"),
    ("transformList", 4): _transform("list"),
    ("transformMap", 3): _transform("map"),
    ("transformMap", 4): _transform("map"),
    ("transformMapEntry", 3): _transform("entry"),
    ("transformMapEntry", 4): _transform("entry"),
    ("bind", 3): _bind,
    ("optMap", 2): _opt_map(False),
    ("optFlatMap", 2): _opt_map(True),
    ("sortBy", 2): _sort_by,
}


def parse(source: str) -> Expr:
    """The tree of ``source``; SyntaxError_ with cel-go's message when it does not parse."""
    if len(source) > _MAX_CODE_POINTS:
        raise SyntaxError_(
            f"expression code point size exceeds limit: size: {len(source)}, "
            f"limit {_MAX_CODE_POINTS}"
        )
    return _Parser(source).start()

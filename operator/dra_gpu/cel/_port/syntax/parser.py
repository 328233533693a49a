"""CEL tokens to a tree, by cel-go's grammar: precedence, the recursion limits, literals.

A recursive-descent port of cel-go's ``CEL.g4`` and the parser's visitor: ``?:``, ``||`` and
``&&`` chains (one n-ary call each), relations, arithmetic, unary operators, selections, calls,
indexes, list/map/message literals; ``has`` and, through ``macros``, the other macros. cel-go's
two limits are kept: 250 nested grammar rules, and a visitor depth of 250.

Owns: ``parse``.
Must not: type-check (``checker``) or evaluate (``runtime``).
"""

from __future__ import annotations

from typing import Final

from dra_gpu.cel._port.syntax import lexer, macros
from dra_gpu.cel._port.syntax.lexer import SyntaxError_
from dra_gpu.cel._port.syntax.tree import (
    Call,
    CreateList,
    CreateMap,
    CreateStruct,
    Expr,
    Ident,
    Literal,
    Select,
)
from dra_gpu.cel._port.values import Uint

__all__ = ["parse"]

_MAX_RECURSION: Final = 250
_MAX_CODE_POINTS: Final = 100_000
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_UINT64_MAX: Final = 2**64 - 1


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = lexer.tokens(source)
        self.i = 0
        self.rule_depth: dict[str, int] = {}
        # cel-go's visitor recursion depth of each node: binary operators, ?:, selections,
        # member calls and indexes count; && and || chains, unary operators and calls do not.
        self.vd: dict[int, int] = {}

    # helpers

    def peek(self, offset: int = 0) -> lexer.Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def next(self) -> lexer.Token:
        token = self.tokens[self.i]
        if self.i < len(self.tokens) - 1:
            self.i += 1
        return token

    def error(self, token: lexer.Token, message: str) -> SyntaxError_:
        return SyntaxError_(f"ERROR: {lexer.location(self.source, token.pos)}: {message}")

    def unexpected(self, token: lexer.Token) -> SyntaxError_:
        shown = "<EOF>" if token.kind == "eof" else token.text
        return self.error(token, f"Syntax error: mismatched input '{shown}'")

    def expect(self, kind: str) -> lexer.Token:
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
                if token.text in lexer.RESERVED:
                    raise self.error(token, f"reserved identifier: {token.text}")
                self.next()
                args = self.expr_list(")")
                self.expect(")")
                result = self.global_call_or_macro(token.pos, leading + token.text, args)
                result = self.uncounted(result, *args)
            else:
                if token.text in lexer.RESERVED:
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

    def literal(self, token: lexer.Token) -> Expr:
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
            parsed = lexer.go_float(("-" if negative else "") + text)
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
                unescaped = lexer.unescape(text[1:] if kind == "bytes" else text, kind == "bytes")
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
        return SyntaxError_(f"ERROR: {lexer.location(self.source, expr.pos)}: {message}")

    def receiver_call_or_macro(self, pos: int, name: str, target: Expr, args: list[Expr]) -> Expr:
        expand = macros.MACROS.get((name, len(args)))
        if expand is not None:
            expanded = expand(self, pos, target, args)
            if expanded is not None:
                return expanded
        return Call(pos, name, target, args)


def parse(source: str) -> Expr:
    """The tree of ``source``; SyntaxError_ with cel-go's message when it does not parse."""
    if len(source) > _MAX_CODE_POINTS:
        raise SyntaxError_(
            f"expression code point size exceeds limit: size: {len(source)}, "
            f"limit {_MAX_CODE_POINTS}"
        )
    return _Parser(source).start()

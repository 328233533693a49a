"""The macros of the Kubernetes CEL environment, expanded as cel-go expands them.

``all``/``exists``/``exists_one``/``existsOne`` (one and two variables), ``map``/``filter``,
``transformList``/``transformMap``/``transformMapEntry``, ``cel.bind``, ``optMap``/``optFlatMap``
and ``sortBy``: each becomes the comprehension cel-go produces (``has`` is the parser's own).

Owns: ``MACROS`` (by name and argument count), ``ACCUMULATOR``.
Must not: read tokens; a macro gets the parsed target and arguments, and reports an error through
the parser (``Reporter``), which knows the source.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Final, Protocol

from dra_gpu.cel._port.syntax.lexer import SyntaxError_
from dra_gpu.cel._port.syntax.tree import (
    Call,
    Comprehension,
    CreateList,
    CreateMap,
    Expr,
    Ident,
    Literal,
    Select,
)

__all__ = ["ACCUMULATOR", "MACROS", "Reporter"]

ACCUMULATOR: Final = "@result"
_LEGACY_ACCUMULATOR: Final = "__result__"
_UNUSED_ITER_VAR: Final = "#unused"


class Reporter(Protocol):
    """What a macro needs of the parser: an error at an expression, with cel-go's location."""

    def macro_error(self, expr: Expr, message: str) -> SyntaxError_: ...


def _iter_var(parser: Reporter, arg: Expr, message: str = "argument must be a simple name") -> str:
    if not isinstance(arg, Ident):
        raise parser.macro_error(arg, message)
    if arg.name in (ACCUMULATOR, _LEGACY_ACCUMULATOR):
        raise parser.macro_error(arg, "iteration variable overwrites accumulator variable")
    return arg.name


def _two_vars(parser: Reporter, args: list[Expr]) -> tuple[str, str]:
    first = _iter_var(parser, args[0])
    second = _iter_var(parser, args[1])
    if first == second:
        raise parser.macro_error(args[1], f"duplicate variable name: {first}")
    return first, second


def _accu(pos: int) -> Ident:
    return Ident(pos, ACCUMULATOR)


def _quantifier(kind: str, two: bool) -> Callable[..., Expr]:
    def expand(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr:
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


def _map(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr:
    var = _iter_var(parser, args[0], "argument is not an identifier")
    function = args[-1]
    step: Expr = Call(pos, "_+_", None, [_accu(pos), CreateList(pos, [function], [False])])
    if len(args) == 3:
        step = Call(pos, "_?_:_", None, [args[1], step, _accu(pos)])
    return Comprehension(
        pos, target, var, None, ACCUMULATOR, CreateList(pos, [], []), Literal(pos, True), step,
        _accu(pos),
    )  # fmt: skip


def _filter(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr:
    var = _iter_var(parser, args[0], "argument is not an identifier")
    step: Expr = Call(pos, "_+_", None, [_accu(pos), CreateList(pos, [args[0]], [False])])
    step = Call(pos, "_?_:_", None, [args[1], step, _accu(pos)])
    return Comprehension(
        pos, target, var, None, ACCUMULATOR, CreateList(pos, [], []), Literal(pos, True), step,
        _accu(pos),
    )  # fmt: skip


def _transform(kind: str) -> Callable[..., Expr]:
    def expand(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr:
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


def _bind(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr | None:
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
    def expand(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr:
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


def _sort_by(parser: Reporter, pos: int, target: Expr, args: list[Expr]) -> Expr:
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


MACROS: Final[dict[tuple[str, int], Callable[..., Expr | None]]] = {
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

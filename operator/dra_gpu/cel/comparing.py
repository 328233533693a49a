"""What a CEL selector compares, read from its syntax tree.

Owns: the ``Comparison`` of one value of ``device`` with a constant (the driver, an attribute,
a capacity against a quantity), found in an expression as cel-go parses it, so that the
explainer can say which value of a device a selector rejected and the class checks which
drivers a class names; ``is_device``, the test for the ``device`` variable that the verdict
cache of ``environment`` shares. Pure: a string in, frozen values out; an expression that does
not parse compares nothing.

Must not: evaluate anything (``environment`` does), or reach any part of the package but the
port's parser.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Final

from dra_gpu.cel._port import syntax

_CACHE_SIZE: Final = 1024
"""Expressions whose comparisons are kept (as many as compiled selectors are)."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One value of ``device`` compared with a constant, as the syntax tree shows it.

    ``device.driver == "d"``; ``device.attributes["d"].model == "a100"`` (or ``["model"]``; a
    string, int or bool); ``device.capacity["d"].memory.compareTo(quantity("24Gi")) >= 0``
    (against -1, 0 or 1, where that is one relation), ``device.capacity["d"].memory.
    isGreaterThan(quantity("24Gi"))`` or ``isLessThan``, negated or not. ``relation`` is what
    the device's value must be to the constant; the constant of a capacity is the quantity's
    text.
    """

    field: str  # "driver" (domain and name empty), "attributes" or "capacity"
    domain: str
    name: str
    relation: str
    constant: str | int | bool


@functools.lru_cache(maxsize=_CACHE_SIZE)
def comparison(expression: str) -> Comparison | None:
    """The ``Comparison`` the whole expression is; None for any other (or unparsable) one."""
    tree = _tree(expression)
    return _compared(tree) if tree is not None else None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def comparisons(expression: str) -> tuple[Comparison, ...]:
    """Every ``Comparison`` anywhere in the expression (under ``!``, ``||``, in macros), outer
    ones first; none when it does not parse."""
    tree = _tree(expression)
    found: list[Comparison] = []
    stack = [tree] if tree is not None else []
    negated: set[int] = set()  # methods whose negation was the comparison
    while stack:
        expr = stack.pop()
        if id(expr) not in negated and (one := _compared(expr)) is not None:
            found.append(one)
            if (negation := _call(expr, "!_", 1)) is not None:
                negated.add(id(negation.args[0]))
        if isinstance(expr, syntax.Select):
            stack.append(expr.operand)
        elif isinstance(expr, syntax.Call):
            stack += [*expr.args[::-1], *filter(None, [expr.target])]
        elif isinstance(expr, syntax.CreateList):
            stack += expr.elements[::-1]
        elif isinstance(expr, syntax.CreateMap):
            stack += [e for key, value, _ in expr.entries[::-1] for e in (value, key)]
        elif isinstance(expr, syntax.Comprehension):
            stack += [expr.result, expr.loop_step, expr.loop_condition, expr.accu_init]
            stack.append(expr.iter_range)
    return tuple(found)


def _tree(expression: str) -> syntax.Expr | None:
    try:
        return syntax.parse(expression)
    except (syntax.SyntaxError_, RecursionError):
        return None


_OPERATORS: Final = {"_>=_": ">=", "_>_": ">", "_<=_": "<=", "_<_": "<", "_==_": "==", "_!=_": "!="}
_COMPARE_TO: Final = {  # `x.compareTo(q) OP n` as a relation of x to q, where it is one
    (">=", 0): ">=", (">", 0): ">", ("<=", 0): "<=", ("<", 0): "<", ("==", 0): "==",
    ("!=", 0): "!=", ("==", 1): ">", (">=", 1): ">", ("!=", 1): "<=", ("<", 1): "<=",
    ("==", -1): "<", ("<=", -1): "<", ("!=", -1): ">=", (">", -1): ">=",
}  # fmt: skip
_METHODS: Final = {
    ("isGreaterThan", False): ">", ("isGreaterThan", True): "<=",
    ("isLessThan", False): "<", ("isLessThan", True): ">=",
}  # fmt: skip


def _compared(expr: syntax.Expr) -> Comparison | None:
    negation = _call(expr, "!_", 1)
    method = negation.args[0] if negation is not None else expr
    if isinstance(method, syntax.Call) and (method.function, bool(negation)) in _METHODS:
        return _capacity(method, _METHODS[method.function, bool(negation)])
    call = _call(expr, expr.function, 2) if isinstance(expr, syntax.Call) else None
    if call is None or call.function not in _OPERATORS:
        return None
    left, right = call.args
    number = _constant(right)
    if isinstance(left, syntax.Call) and left.function == "compareTo" and type(number) is int:
        return _capacity(left, _COMPARE_TO.get((_OPERATORS[call.function], number)))
    if call.function != "_==_":
        return None
    for value, constant in ((left, _constant(right)), (right, _constant(left))):
        if type(constant) is str and _device_field(value, "driver"):
            return Comparison("driver", "", "", "==", constant)
        path = _value_path(value, "attributes")
        if path is not None and type(constant) in (str, int, bool):
            return Comparison("attributes", *path, "==", constant)
    return None


def _capacity(method: syntax.Call, relation: str | None) -> Comparison | None:
    """``device.capacity[d].name.<method>(quantity("q"))`` with ``relation``, as a Comparison."""
    path = _value_path(method.target, "capacity") if method.target is not None else None
    quantity = _call(method.args[0], "quantity", 1) if len(method.args) == 1 else None
    text = _constant(quantity.args[0]) if quantity is not None else None
    if relation is None or path is None or type(text) is not str or not text:
        return None
    return Comparison("capacity", *path, relation, text)


def _value_path(expr: syntax.Expr, field: str) -> tuple[str, str] | None:
    """(domain, name) of ``device.<field>["domain"].name`` or ``...["domain"]["name"]``."""
    if isinstance(expr, syntax.Select) and not expr.test_only:
        keyed, name = _call(expr.operand, "_[_]", 2), expr.field
    elif (index := _call(expr, "_[_]", 2)) is not None:
        keyed, name = _call(index.args[0], "_[_]", 2), _constant(index.args[1])
    else:
        return None
    domain = _constant(keyed.args[1]) if keyed is not None else None
    if keyed is None or not _device_field(keyed.args[0], field):
        return None
    if type(domain) is not str or type(name) is not str or not domain or not name:
        return None
    return domain, name


def _call(expr: syntax.Expr, function: str, arity: int) -> syntax.Call | None:
    """``expr`` if it is a global call of ``function`` with ``arity`` arguments."""
    if isinstance(expr, syntax.Call) and expr.function == function and expr.target is None:
        return expr if len(expr.args) == arity else None
    return None


def _device_field(expr: syntax.Expr, field: str) -> bool:
    return (
        isinstance(expr, syntax.Select)
        and not expr.test_only
        and expr.field == field
        and is_device(expr.operand)
    )


def _constant(expr: syntax.Expr) -> Any:
    return expr.value if isinstance(expr, syntax.Literal) else None


def is_device(expr: syntax.Expr) -> bool:
    return isinstance(expr, syntax.Ident) and expr.name.removeprefix(".") == "device"

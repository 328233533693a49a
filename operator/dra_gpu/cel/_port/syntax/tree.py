"""The nodes of a CEL abstract syntax tree, as cel-go's ``ast`` package has them.

The parser builds them; the checker annotates them in place (``type``, a call's ``overloads``, a
selection's ``resolved`` type name); the planner turns them into closures.

Owns: ``Expr`` and its kinds (``Literal``, ``Ident``, ``Select``, ``Call``, ``CreateList``,
``CreateMap``, ``CreateStruct``, ``Comprehension``).
Must not: parse, check or evaluate.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Call",
    "Comprehension",
    "CreateList",
    "CreateMap",
    "CreateStruct",
    "Expr",
    "Ident",
    "Literal",
    "Select",
]


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

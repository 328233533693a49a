"""The checker itself: a port of cel-go's ``checker/checker.go`` over a parsed tree.

Identifiers, selections (qualified names resolved as cel-go's container rules do), calls
resolved to every overload they may dispatch to, list and map literals joined, comprehensions
in their scopes; then the environment's AST validator for homogeneous aggregate literals
(``format`` arguments exempt) and the selector's result rule (bool, or dyn).

Owns: ``check``, ``CheckError``, ``Unsupported``.
Must not: evaluate (``runtime``), or decide assignability other than through ``assignability``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from dra_gpu.cel._port.checker import assignability, declared
from dra_gpu.cel._port.checker.assignability import format_type
from dra_gpu.cel._port.checker.types import (
    BOOL,
    BYTES,
    DOUBLE,
    DYN,
    INT,
    NULL,
    STRING,
    UINT,
    Type,
    list_of,
    map_of,
    optional_of,
    param,
    type_of,
)
from dra_gpu.cel._port.syntax import (
    Call,
    Comprehension,
    CreateList,
    CreateMap,
    CreateStruct,
    Expr,
    Ident,
    Literal,
    Select,
)
from dra_gpu.cel._port.values import Uint

__all__ = ["CheckError", "Unsupported", "check"]


class CheckError(Exception):
    """The expression does not type-check; cel-go's wording."""


class Unsupported(Exception):
    """The expression type-checks upstream but uses what this evaluator does not implement."""


_LITERAL_TYPES: Final = {bool: BOOL, bytes: BYTES, float: DOUBLE, int: INT, str: STRING}


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.mapping = assignability.Mapping()
        self.counter = 0
        self.scopes: list[dict[str, Type]] = []
        self.checked: list[Expr] = []

    def error(self, expr: Expr, message: str) -> CheckError:
        line = self.source.count("\n", 0, expr.pos) + 1
        column = expr.pos - (self.source.rfind("\n", 0, expr.pos) + 1) + 1
        return CheckError(f"ERROR: <input>:{line}:{column}: {message}")

    def new_var(self) -> Type:
        name = f"_var{self.counter}"
        self.counter += 1
        return param(name)

    def assignable(self, t1: Type, t2: Type) -> bool:
        m = self.mapping.copy()
        if assignability.assignable(m, t1, t2):
            self.mapping = m
            return True
        return False

    def set_type(self, expr: Expr, t: Type) -> Type:
        expr.type = t
        self.checked.append(expr)
        return t

    def local(self, name: str) -> Type | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def check(self, expr: Expr) -> Type:
        if isinstance(expr, Literal):
            value = expr.value
            if value is None:
                return self.set_type(expr, NULL)
            if type(value) is Uint:
                return self.set_type(expr, UINT)
            return self.set_type(expr, _LITERAL_TYPES[type(value)])
        if isinstance(expr, Ident):
            return self.check_ident(expr)
        if isinstance(expr, Select):
            return self.check_select(expr)
        if isinstance(expr, Call):
            return self.check_call(expr)
        if isinstance(expr, CreateList):
            return self.check_list(expr)
        if isinstance(expr, CreateMap):
            return self.check_map(expr)
        if isinstance(expr, Comprehension):
            return self.check_comprehension(expr)
        if isinstance(expr, CreateStruct):
            raise Unsupported(
                f"message construction {expr.type_name}{{...}} is not supported by dra-gpu's "
                "CEL evaluator"
            )
        raise self.error(expr, "unexpected expression")

    def resolve_ident(self, name: str) -> Type | None:
        if not name.startswith("."):
            local = self.local(name)
            if local is not None:
                return local
        name = name.removeprefix(".")
        if name in declared.VARIABLES:
            return declared.VARIABLES[name]
        if name in declared.TYPE_IDENTS:
            return type_of(declared.TYPE_IDENTS[name])
        return None

    def check_ident(self, expr: Ident) -> Type:
        t = self.resolve_ident(expr.name)
        if t is None:
            raise self.error(expr, f"undeclared reference to '{expr.name}' (in container '')")
        return self.set_type(expr, t)

    def qualified_name(self, expr: Expr) -> list[str] | None:
        names: list[str] = []
        while isinstance(expr, Select):
            if expr.test_only:
                return None
            names.append(expr.field)
            expr = expr.operand
        if isinstance(expr, Ident):
            names.append(expr.name)
            return names[::-1]
        return None

    def check_select(self, expr: Select) -> Type:
        names = self.qualified_name(expr)
        if names is not None and len(names) > 1:
            first = names[0]
            if first.startswith(".") or self.local(first) is None:
                joined = ".".join(names).removeprefix(".")
                t = declared.VARIABLES.get(joined)
                if t is None and joined in declared.TYPE_IDENTS:
                    t = type_of(declared.TYPE_IDENTS[joined])
                if t is not None:
                    expr.resolved = joined
                    return self.set_type(expr, t)
        result = self.select_field(expr, expr.operand, expr.field, optional=False)
        if expr.test_only:
            result = BOOL
        return self.set_type(expr, assignability.substitute(self.mapping, result, False))

    def select_field(self, expr: Expr, operand: Expr, field: str, *, optional: bool) -> Type:
        self.check(operand)
        operand_type = assignability.substitute(self.mapping, operand.type, False)
        target, is_opt = assignability.unwrap_optional(operand_type)
        if target.kind == "map":
            result = target.params[1]
        elif target.kind == "struct":
            fields = declared.STRUCT_FIELDS.get(target.name)
            if fields is None:
                raise self.error(expr, f"unexpected failed resolution of '{target.name}'")
            if field not in fields:
                raise self.error(expr, f"undefined field '{field}'")
            result = fields[field]
        elif target.kind == "param":
            self.assignable(DYN, target)
            result = DYN
        else:
            if not assignability.is_dyn_or_error(target):
                raise self.error(
                    expr, f"type '{_declared(target)}' does not support field selection"
                )
            result = DYN
        if is_opt or optional:
            return optional_of(result)
        return result

    def check_call(self, expr: Call) -> Type:
        name = expr.function
        if name == "_?._":
            if len(expr.args) != 2 or expr.target is not None:
                raise self.error(expr, "incorrect signature for optional field selection")
            field = expr.args[1]
            if not (isinstance(field, Literal) and type(field.value) is str):
                raise self.error(field, "unsupported optional field selection")
            result = self.select_field(expr, expr.args[0], field.value, optional=True)
            field.type = STRING
            expr.overloads = ("select_optional_field",)
            return self.set_type(expr, assignability.substitute(self.mapping, result, False))
        for arg in expr.args:
            self.check(arg)
        if expr.target is None:
            overloads = declared.FUNCTIONS.get(name.removeprefix("."))
            if overloads is None:
                raise self.error(expr, f"undeclared reference to '{name}' (in container '')")
            expr.function = name.removeprefix(".")
            return self.resolve(expr, expr.function, overloads, None)
        qualified = self.qualified_name(expr.target)
        if qualified is not None:
            full = ".".join(qualified) + "." + name
            overloads = declared.FUNCTIONS.get(full.removeprefix("."))
            if overloads is not None and not (
                not qualified[0].startswith(".") and self.local(qualified[0]) is not None
            ):
                expr.function = full.removeprefix(".")
                expr.target = None
                return self.resolve(expr, expr.function, overloads, None)
        self.check(expr.target)
        overloads = declared.FUNCTIONS.get(name)
        if overloads is None:
            raise self.error(expr, f"undeclared reference to '{name}' (in container '')")
        return self.resolve(expr, name, overloads, expr.target)

    def resolve(
        self, expr: Call, name: str, overloads: list[declared.Overload], target: Expr | None
    ) -> Type:
        arg_types = ([target.type] if target is not None else []) + [a.type for a in expr.args]
        if name in ("_&&_", "_||_"):
            for arg, t in zip(expr.args, arg_types, strict=True):
                if not self.assignable(t, BOOL):
                    raise self.error(arg, f"expected type 'bool' but found '{_declared(t)}'")
            expr.overloads = ("logical_and" if name == "_&&_" else "logical_or",)
            return self.set_type(expr, BOOL)
        result: Type | None = None
        matched: list[str] = []
        for overload in overloads:
            if (target is None) == overload.member:
                continue
            if len(overload.args) != len(arg_types):
                continue
            args = overload.args
            result_type = overload.result
            if overload.params:
                subs = assignability.Mapping()
                for p in overload.params:
                    subs.add(param(p), self.new_var())
                args = tuple(assignability.substitute(subs, a, False) for a in args)
                result_type = assignability.substitute(subs, result_type, False)
            m = self.mapping.copy()
            if not assignability.assignable_list(m, tuple(arg_types), args):
                continue
            self.mapping = m
            matched.append(overload.id)
            fn_result = assignability.substitute(self.mapping, result_type, False)
            if result is None:
                result = fn_result
            elif not assignability.is_dyn(result) and fn_result != result:
                result = DYN
        if result is None:
            shown = ", ".join(
                _declared(assignability.substitute(self.mapping, t, True)) for t in arg_types
            )
            if target is not None:
                described = f"'{name}' applied to '{_declared(assignability.substitute(self.mapping, target.type, True))}.({', '.join(_declared(assignability.substitute(self.mapping, a.type, True)) for a in expr.args)})'"  # noqa: E501
            else:
                described = f"'{name}' applied to '({shown})'"
            raise self.error(expr, f"found no matching overload for {described}")
        expr.overloads = tuple(matched)
        return self.set_type(expr, result)

    def join(self, expr: Expr, previous: Type | None, current: Type) -> Type:
        # cel-go's checker joins unlike element types to dyn; the homogeneous-literal
        # validator (below) then rejects them, except in string.format() arguments.
        if previous is None:
            return current
        if self.assignable(previous, current):
            return assignability.most_general(previous, current)
        return DYN

    def check_list(self, expr: CreateList) -> Type:
        element_type: Type | None = None
        for element, optional in zip(expr.elements, expr.optional, strict=True):
            t = self.check(element)
            if optional:
                t, is_opt = assignability.unwrap_optional(t)
                if not is_opt and not assignability.is_dyn(t):
                    raise self.error(
                        element,
                        f"expected type '{_declared(optional_of(t))}' but found '{_declared(t)}'",
                    )
            element_type = self.join(element, element_type, t)
        if element_type is None:
            element_type = self.new_var()
        return self.set_type(expr, list_of(element_type))

    def check_map(self, expr: CreateMap) -> Type:
        key_type: Type | None = None
        value_type: Type | None = None
        for key, value, optional in expr.entries:
            key_type = self.join(key, key_type, self.check(key))
            t = self.check(value)
            if optional:
                t, is_opt = assignability.unwrap_optional(t)
                if not is_opt and not assignability.is_dyn(t):
                    raise self.error(
                        value,
                        f"expected type '{_declared(optional_of(t))}' but found '{_declared(t)}'",
                    )
            value_type = self.join(value, value_type, t)
        if key_type is None or value_type is None:
            key_type, value_type = self.new_var(), self.new_var()
        return self.set_type(expr, map_of(key_type, value_type))

    def check_comprehension(self, expr: Comprehension) -> Type:
        self.check(expr.iter_range)
        self.check(expr.accu_init)
        range_type = assignability.substitute(self.mapping, expr.iter_range.type, False)
        accu_type = expr.accu_init.type
        self.scopes.append({expr.accu_var: accu_type})
        var2_type: Type | None = None
        if range_type.kind == "list":
            var_type = range_type.params[0]
            if expr.iter_var2 is not None:
                var2_type, var_type = var_type, INT
        elif range_type.kind == "map":
            var_type = range_type.params[0]
            if expr.iter_var2 is not None:
                var2_type = range_type.params[1]
        elif range_type.kind in ("dyn", "error", "param"):
            self.assignable(DYN, range_type)
            var_type = DYN
            var2_type = DYN if expr.iter_var2 is not None else None
        else:
            raise self.error(
                expr.iter_range,
                f"expression of type '{_declared(range_type)}' cannot be range of a "
                "comprehension (must be list, map, or dynamic)",
            )
        scope = {expr.iter_var: var_type}
        if expr.iter_var2 is not None:
            assert var2_type is not None
            scope[expr.iter_var2] = var2_type
        self.scopes.append(scope)
        self.check(expr.loop_condition)
        self.assert_type(expr.loop_condition, BOOL)
        self.check(expr.loop_step)
        self.assert_type(expr.loop_step, accu_type)
        self.scopes.pop()
        self.check(expr.result)
        self.scopes.pop()
        return self.set_type(expr, assignability.substitute(self.mapping, expr.result.type, False))

    def assert_type(self, expr: Expr, t: Type) -> None:
        if not self.assignable(t, expr.type):
            raise self.error(
                expr, f"expected type '{_declared(t)}' but found '{_declared(expr.type)}'"
            )


def _declared(t: Type) -> str:
    return format_type(t) if t.kind in ("param", "error") else str(t)


def check(tree: Expr, source: str) -> Type:
    """Type-check ``tree`` in place (``expr.type``, ``call.overloads``); its result type.

    Raises CheckError for what cel-go's checker and the environment's AST validators reject.
    """
    checker = _Checker(source)
    checker.check(tree)
    for expr in checker.checked:
        expr.type = assignability.substitute(checker.mapping, expr.type, True)
    _validate_homogeneous(checker, tree)
    result: Type = tree.type
    # DeviceMatches accepts bool or, for an attribute read as is, its declared type (dyn here).
    if result not in (BOOL, DYN):
        raise CheckError(f"must evaluate to bool or the unknown type, not {_declared(result)}")
    return result


def _walk(expr: Expr, exempt: bool = False) -> Iterator[tuple[Expr, bool]]:
    """Every node, and whether it sits inside a call of ``format`` (exempt from the
    homogeneous-literal rule, as cel-go's string-format validator configures it)."""
    yield expr, exempt
    if isinstance(expr, Select):
        yield from _walk(expr.operand, exempt)
    elif isinstance(expr, Call):
        inner = exempt or expr.function == "format"
        if expr.target is not None:
            yield from _walk(expr.target, inner)
        for arg in expr.args:
            yield from _walk(arg, inner)
    elif isinstance(expr, CreateList):
        for element in expr.elements:
            yield from _walk(element, exempt)
    elif isinstance(expr, CreateMap):
        for key, value, _ in expr.entries:
            yield from _walk(key, exempt)
            yield from _walk(value, exempt)
    elif isinstance(expr, Comprehension):
        for part in (
            expr.iter_range,
            expr.accu_init,
            expr.loop_condition,
            expr.loop_step,
            expr.result,
        ):
            yield from _walk(part, exempt)


def _validate_homogeneous(checker: _Checker, tree: Expr) -> None:
    """cel.ValidateHomogeneousAggregateLiterals: every element of a literal of one type."""
    for expr, exempt in _walk(tree):
        if exempt:
            continue
        if isinstance(expr, CreateList):
            first: Type | None = None
            for element, optional in zip(expr.elements, expr.optional, strict=True):
                t = element.type
                if optional and t.params:
                    t = t.params[0]
                if first is None:
                    first = t
                elif not first.equivalent(t):
                    raise checker.error(
                        element,
                        f"expected type '{format_type(first)}' but found '{format_type(t)}'",
                    )
        elif isinstance(expr, CreateMap):
            key_type: Type | None = None
            value_type: Type | None = None
            for key, value, optional in expr.entries:
                vt = value.type
                if optional and vt.params:
                    vt = vt.params[0]
                if key_type is None or value_type is None:
                    key_type, value_type = key.type, vt
                    continue
                if not key_type.equivalent(key.type):
                    raise checker.error(
                        key,
                        f"expected type '{format_type(key_type)}' "
                        f"but found '{format_type(key.type)}'",
                    )
                if not value_type.equivalent(vt):
                    raise checker.error(
                        value,
                        f"expected type '{format_type(value_type)}' but found '{format_type(vt)}'",
                    )

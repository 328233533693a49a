"""Type-checking a CEL tree exactly as cel-go's checker does, in the scheduler's environment.

What an expression means depends on the checker: which overloads a call may dispatch to, whether
a list or map literal is homogeneous, what may be selected from what, and whether the result
may be a selector's (bool, or dyn for an attribute). Compile errors upstream are compile errors
here. A port of cel-go ``checker/checker.go`` and ``checker/types.go`` (type parameters,
substitutions, assignability, "most general" joins), with the declarations of ``declarations``
and the ``device`` variable of DRA's stored-expressions environment. Pure; no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Final

from dra_gpu.cel._port import declarations
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

__all__ = ["CheckError", "Type", "check"]


class CheckError(Exception):
    """The expression does not type-check; cel-go's wording."""


class Unsupported(Exception):
    """The expression type-checks upstream but uses what this evaluator does not implement."""


class Type:
    """A cel-go ``types.Type``: kind, runtime name and parameters. ``==`` is IsExactType."""

    __slots__ = ("kind", "name", "params")

    def __init__(self, kind: str, name: str, params: tuple[Type, ...] = ()) -> None:
        self.kind = kind
        self.name = name
        self.params = params

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Type)
            and self.kind == other.kind
            and self.name == other.name
            and self.params == other.params
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.name, self.params))

    def equivalent(self, other: Type) -> bool:
        """IsEquivalentType: type parameter names do not matter."""
        if self.kind != other.kind or len(self.params) != len(other.params):
            return False
        if self.kind != "param" and self.name != other.name:
            return False
        return all(a.equivalent(b) for a, b in zip(self.params, other.params, strict=True))

    def is_dyn(self) -> bool:
        return self.kind in ("dyn", "any", "param")

    def assignable_from(self, other: Type) -> bool:
        """IsAssignableType (no nullable wrappers exist in this environment)."""
        if self is other or self.is_dyn():
            return True
        if (
            self.kind != other.kind
            or self.name != other.name
            or len(self.params) != len(other.params)
        ):
            return False
        return all(a.assignable_from(b) for a, b in zip(self.params, other.params, strict=True))

    def __str__(self) -> str:
        if self.kind == "param":
            return f"<{self.name}>"
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(str(p) for p in self.params)})"

    __repr__ = __str__


DYN: Final = Type("dyn", "dyn")
ANY: Final = Type("any", "google.protobuf.Any")
BOOL: Final = Type("bool", "bool")
BYTES: Final = Type("bytes", "bytes")
DOUBLE: Final = Type("double", "double")
DURATION: Final = Type("duration", "google.protobuf.Duration")
ERROR: Final = Type("error", "error")
INT: Final = Type("int", "int")
NULL: Final = Type("null", "null_type")
STRING: Final = Type("string", "string")
TIMESTAMP: Final = Type("timestamp", "google.protobuf.Timestamp")
UINT: Final = Type("uint", "uint")
TYPE: Final = Type("type", "type")


def list_of(element: Type) -> Type:
    return Type("list", "list", (element,))


def map_of(key: Type, value: Type) -> Type:
    return Type("map", "map", (key, value))


def type_of(param: Type) -> Type:
    return Type("type", "type", (param,))


def optional_of(param: Type) -> Type:
    return Type("opaque", "optional_type", (param,))


def param(name: str) -> Type:
    return Type("param", name)


QUANTITY: Final = Type("struct", "kubernetes.Quantity")
SEMVER: Final = Type("struct", "kubernetes.Semver")

_NAMED: Final = {
    t.name: t for t in (DYN, BOOL, BYTES, DOUBLE, DURATION, INT, NULL, STRING, TIMESTAMP, UINT)
}


@functools.cache
def parse_type(text: str) -> Type:
    """A type as the declarations table writes it: ``list(<T>)``, ``map(<K>, <V>)``, ``net.IP``."""
    text = text.strip()
    if text.startswith("<") and text.endswith(">"):
        return param(text[1:-1])
    if text in _NAMED:
        return _NAMED[text]
    if text == "type":
        return TYPE
    match = re.fullmatch(r"([\w.]+)\((.*)\)", text)
    if match:
        name, inner = match[1], match[2]
        params = tuple(parse_type(p) for p in _split_params(inner))
        if name == "list":
            return list_of(params[0])
        if name == "map":
            return map_of(params[0], params[1])
        if name == "type":
            return type_of(params[0])
        return Type("opaque", name, params)
    if text.startswith("kubernetes."):
        return Type("struct", text)
    return Type("opaque", text)


def _split_params(text: str) -> Iterator[str]:
    depth = 0
    start = 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


class Overload:
    __slots__ = ("args", "id", "member", "params", "result")

    def __init__(self, id: str, member: bool, args: tuple[Type, ...], result: Type) -> None:
        self.id = id
        self.member = member
        self.args = args
        self.result = result
        names: list[str] = []
        for t in (*args, result):
            _collect_params(t, names)
        self.params = tuple(names)


def _collect_params(t: Type, into: list[str]) -> None:
    if t.kind == "param" and t.name not in into:
        into.append(t.name)
    for p in t.params:
        _collect_params(p, into)


FUNCTIONS: Final[dict[str, list[Overload]]] = {}
for _name, _id, _member, _args, _result in declarations.OVERLOADS:
    FUNCTIONS.setdefault(_name, []).append(
        Overload(_id, _member, tuple(parse_type(a) for a in _args), parse_type(_result))
    )

# The device variable of DRA's stored-expressions environment (the last of its declarations,
# which kube-scheduler compiles with): attributes of any type, allowMultipleAllocations present.
DEVICE: Final = Type("struct", "kubernetes.DRADevice")
DEVICE_FIELDS: Final = {
    "driver": STRING,
    "allowMultipleAllocations": BOOL,
    "attributes": map_of(STRING, map_of(STRING, DYN)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
}
_STRUCT_FIELDS: Final = {DEVICE.name: DEVICE_FIELDS}
VARIABLES: Final = {"device": DEVICE}
# Type names cel-go's environment resolves as identifiers (of type type(T)).
TYPE_IDENTS: Final = {
    "bool": BOOL,
    "bytes": BYTES,
    "double": DOUBLE,
    "int": INT,
    "list": list_of(DYN),
    "map": map_of(DYN, DYN),
    "null_type": NULL,
    "string": STRING,
    "type": TYPE,
    "uint": UINT,
    "optional_type": optional_of(DYN),
    "net.IP": Type("opaque", "net.IP"),
    "net.CIDR": Type("opaque", "net.CIDR"),
    "google.protobuf.Timestamp": TIMESTAMP,
    "google.protobuf.Duration": DURATION,
}


# --- assignability (checker/types.go) ------------------------------------------------------------


class _Mapping:
    __slots__ = ("map",)

    def __init__(self, mapping: dict[str, Type] | None = None) -> None:
        self.map: dict[str, Type] = mapping or {}

    def find(self, t: Type) -> Type | None:
        return self.map.get(_format(t))

    def add(self, t: Type, to: Type) -> None:
        self.map[_format(t)] = to

    def copy(self) -> _Mapping:
        return _Mapping(dict(self.map))


def _format(t: Type) -> str:
    if t.kind == "param":
        return t.name
    if t.kind == "error":
        return "!error!"
    return str(t)


def _is_dyn(t: Type) -> bool:
    return t.kind in ("dyn", "any")


def _is_dyn_or_error(t: Type) -> bool:
    return t.kind in ("dyn", "any", "error")


def _is_optional(t: Type) -> bool:
    return t.kind == "opaque" and t.name == "optional_type"


def _unwrap_optional(t: Type) -> tuple[Type, bool]:
    if _is_optional(t):
        return t.params[0], True
    return t, False


def _equal_or_less_specific(t1: Type, t2: Type) -> bool:
    if _is_dyn(t1) or t1.kind == "param":
        return True
    if _is_dyn(t2) or t2.kind == "param":
        return False
    if t1.kind != t2.kind:
        return False
    if t1.kind == "opaque":
        if t1.name != t2.name or len(t1.params) != len(t2.params):
            return False
        return all(_equal_or_less_specific(a, b) for a, b in zip(t1.params, t2.params, strict=True))
    if t1.kind == "list":
        return _equal_or_less_specific(t1.params[0], t2.params[0])
    if t1.kind == "map":
        return _equal_or_less_specific(t1.params[0], t2.params[0]) and _equal_or_less_specific(
            t1.params[1], t2.params[1]
        )
    if t1.kind == "type":
        return True
    return t1 == t2


def _assignable(m: _Mapping, t1: Type, t2: Type) -> bool:
    if t2.kind == "param":
        valid, has_sub = _valid_substitution(m, t1, t2)
        if valid:
            return True
        if has_sub:
            return False
    if t1.kind == "param":
        valid, _ = _valid_substitution(m, t2, t1)
        return valid
    if _is_dyn_or_error(t1) or _is_dyn_or_error(t2):
        return True
    if t1.kind == "null":
        return _assignable_null(t2)
    if t2.kind == "null":
        return _assignable_null(t1)
    if t1.kind in (
        "bool", "bytes", "double", "int", "string", "uint", "any", "duration", "timestamp",
        "struct",
    ):  # fmt: skip
        return t2.assignable_from(t1)
    if t1.kind == "type":
        return t2.kind == "type"
    if t1.kind in ("opaque", "list", "map"):
        return (
            t1.kind == t2.kind and t1.name == t2.name and _assignable_list(m, t1.params, t2.params)
        )
    return False


def _valid_substitution(m: _Mapping, t1: Type, t2: Type) -> tuple[bool, bool]:
    if t1.kind == t2.kind and t1 == t2:
        return True, True
    sub = m.find(t2)
    if sub is not None:
        if t1.kind == sub.kind and t1 == sub:
            return True, True
        if _assignable(m, t1, sub):
            new = _most_general(t1, sub)
            if _not_referenced_in(m, t2, new):
                m.add(t2, new)
            return True, True
        return False, True
    if _not_referenced_in(m, t2, t1):
        m.add(t2, t1)
        return True, False
    return False, False


def _assignable_list(m: _Mapping, l1: tuple[Type, ...], l2: tuple[Type, ...]) -> bool:
    if len(l1) != len(l2):
        return False
    return all(_assignable(m, a, b) for a, b in zip(l1, l2, strict=True))


def _assignable_null(t: Type) -> bool:
    return t.kind in ("opaque", "struct", "any", "duration", "timestamp") or t.assignable_from(NULL)


def _most_general(t1: Type, t2: Type) -> Type:
    return t1 if _equal_or_less_specific(t1, t2) else t2


def _not_referenced_in(m: _Mapping, t: Type, within: Type) -> bool:
    if t == within:
        return False
    if within.kind == "param":
        sub = m.find(within)
        if sub is None:
            return True
        return _not_referenced_in(m, t, sub)
    if within.kind in ("opaque", "list", "map", "type"):
        return all(_not_referenced_in(m, t, p) for p in within.params)
    return True


def substitute(m: _Mapping, t: Type, params_to_dyn: bool) -> Type:
    sub = m.find(t)
    if sub is not None:
        return substitute(m, sub, params_to_dyn)
    if params_to_dyn and t.kind == "param":
        return DYN
    if t.kind in ("opaque", "list", "map") or (t.kind == "type" and t.params):
        return Type(t.kind, t.name, tuple(substitute(m, p, params_to_dyn) for p in t.params))
    return t


# --- the checker ---------------------------------------------------------------------------------

_LITERAL_TYPES: Final = {bool: BOOL, bytes: BYTES, float: DOUBLE, int: INT, str: STRING}


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.mapping = _Mapping()
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
        if _assignable(m, t1, t2):
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
        if name in VARIABLES:
            return VARIABLES[name]
        if name in TYPE_IDENTS:
            return type_of(TYPE_IDENTS[name])
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
                t = VARIABLES.get(joined)
                if t is None and joined in TYPE_IDENTS:
                    t = type_of(TYPE_IDENTS[joined])
                if t is not None:
                    expr.resolved = joined
                    return self.set_type(expr, t)
        result = self.select_field(expr, expr.operand, expr.field, optional=False)
        if expr.test_only:
            result = BOOL
        return self.set_type(expr, substitute(self.mapping, result, False))

    def select_field(self, expr: Expr, operand: Expr, field: str, *, optional: bool) -> Type:
        self.check(operand)
        operand_type = substitute(self.mapping, operand.type, False)
        target, is_opt = _unwrap_optional(operand_type)
        if target.kind == "map":
            result = target.params[1]
        elif target.kind == "struct":
            fields = _STRUCT_FIELDS.get(target.name)
            if fields is None:
                raise self.error(expr, f"unexpected failed resolution of '{target.name}'")
            if field not in fields:
                raise self.error(expr, f"undefined field '{field}'")
            result = fields[field]
        elif target.kind == "param":
            self.assignable(DYN, target)
            result = DYN
        else:
            if not _is_dyn_or_error(target):
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
            return self.set_type(expr, substitute(self.mapping, result, False))
        for arg in expr.args:
            self.check(arg)
        if expr.target is None:
            overloads = FUNCTIONS.get(name.removeprefix("."))
            if overloads is None:
                raise self.error(expr, f"undeclared reference to '{name}' (in container '')")
            expr.function = name.removeprefix(".")
            return self.resolve(expr, expr.function, overloads, None)
        qualified = self.qualified_name(expr.target)
        if qualified is not None:
            full = ".".join(qualified) + "." + name
            overloads = FUNCTIONS.get(full.removeprefix("."))
            if overloads is not None and not (
                not qualified[0].startswith(".") and self.local(qualified[0]) is not None
            ):
                expr.function = full.removeprefix(".")
                expr.target = None
                return self.resolve(expr, expr.function, overloads, None)
        self.check(expr.target)
        overloads = FUNCTIONS.get(name)
        if overloads is None:
            raise self.error(expr, f"undeclared reference to '{name}' (in container '')")
        return self.resolve(expr, name, overloads, expr.target)

    def resolve(
        self, expr: Call, name: str, overloads: list[Overload], target: Expr | None
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
                subs = _Mapping()
                for p in overload.params:
                    subs.add(param(p), self.new_var())
                args = tuple(substitute(subs, a, False) for a in args)
                result_type = substitute(subs, result_type, False)
            m = self.mapping.copy()
            if not _assignable_list(m, tuple(arg_types), args):
                continue
            self.mapping = m
            matched.append(overload.id)
            fn_result = substitute(self.mapping, result_type, False)
            if result is None:
                result = fn_result
            elif not _is_dyn(result) and fn_result != result:
                result = DYN
        if result is None:
            shown = ", ".join(_declared(substitute(self.mapping, t, True)) for t in arg_types)
            if target is not None:
                described = f"'{name}' applied to '{_declared(substitute(self.mapping, target.type, True))}.({', '.join(_declared(substitute(self.mapping, a.type, True)) for a in expr.args)})'"  # noqa: E501
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
            return _most_general(previous, current)
        return DYN

    def check_list(self, expr: CreateList) -> Type:
        element_type: Type | None = None
        for element, optional in zip(expr.elements, expr.optional, strict=True):
            t = self.check(element)
            if optional:
                t, is_opt = _unwrap_optional(t)
                if not is_opt and not _is_dyn(t):
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
                t, is_opt = _unwrap_optional(t)
                if not is_opt and not _is_dyn(t):
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
        range_type = substitute(self.mapping, expr.iter_range.type, False)
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
        return self.set_type(expr, substitute(self.mapping, expr.result.type, False))

    def assert_type(self, expr: Expr, t: Type) -> None:
        if not self.assignable(t, expr.type):
            raise self.error(
                expr, f"expected type '{_declared(t)}' but found '{_declared(expr.type)}'"
            )


def _declared(t: Type) -> str:
    return _format(t) if t.kind in ("param", "error") else str(t)


def check(tree: Expr, source: str) -> Type:
    """Type-check ``tree`` in place (``expr.type``, ``call.overloads``); its result type.

    Raises CheckError for what cel-go's checker and the environment's AST validators reject.
    """
    checker = _Checker(source)
    checker.check(tree)
    for expr in checker.checked:
        expr.type = substitute(checker.mapping, expr.type, True)
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
                        f"expected type '{_format(first)}' but found '{_format(t)}'",
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
                        key, f"expected type '{_format(key_type)}' but found '{_format(key.type)}'"
                    )
                if not value_type.equivalent(vt):
                    raise checker.error(
                        value, f"expected type '{_format(value_type)}' but found '{_format(vt)}'"
                    )

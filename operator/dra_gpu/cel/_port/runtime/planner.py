"""A checked CEL tree turned into Python closures that evaluate it as cel-go's interpreter does.

Follows cel-go's ``interpreter`` package: ``&&``/``||`` absorb errors in either operand (an error
only when no operand decides); ``?:`` fails on an erroneous condition; a comprehension's
accumulator is computed when first read, an error in a loop step is kept as the accumulator's
value (so a later ``||`` can still absorb it), and the loop stops only on a definite ``false``
condition; constant lists in ``in`` use its set-membership lookup; conversions and regular
expressions with constant arguments are computed, or fail, when the program is built.
Selection and indexing are ``attributes``', the cost count ``costs``'.

Owns: ``plan``, ``Program``, ``PlanError``.
Must not: implement a function (``library``) or know the environment's caching (``cel``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import library, regex
from dra_gpu.cel._port.library import no_such_overload
from dra_gpu.cel._port.runtime import costs
from dra_gpu.cel._port.runtime.attributes import (
    equals,
    has_field,
    index_optional,
    index_value,
    is_member,
    membership_set,
    not_equals,
    select_field,
)
from dra_gpu.cel._port.runtime.costs import COST_LIMIT, Fn
from dra_gpu.cel._port.syntax import (
    Call,
    Comprehension,
    CreateList,
    CreateMap,
    Expr,
    Ident,
    Literal,
    Select,
)
from dra_gpu.cel._port.values import (
    MISSING,
    CelError,
    CelType,
    Optional,
    from_key,
    to_key,
)

__all__ = ["PlanError", "Program", "plan"]

_UNSET: Final = object()


class PlanError(Exception):
    """The program cannot be built: what cel-go reports as "program instantiation failed", or a
    feature this evaluator does not implement (``unsupported`` is then True)."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class _Err:
    """An error held as a value (in a comprehension's accumulator)."""

    __slots__ = ("error",)

    def __init__(self, error: CelError) -> None:
        self.error = error


class _Const:
    """A planned constant: the closure and its value."""

    __slots__ = ("fn", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.fn: Fn = lambda f: value


class Program:
    """A planned expression. ``run(device)`` returns the value or raises CelError."""

    __slots__ = ("_fn", "_slots")

    def __init__(self, fn: Fn, slots: int) -> None:
        self._fn = fn
        self._slots = slots

    def run(self, device: Any) -> Any:
        frame = [device, 0]
        if self._slots:
            frame += [None] * self._slots
        return self._fn(frame)


class _Planner:
    def __init__(self) -> None:
        self.slots = 0
        self.scopes: list[dict[str, tuple[int, Fn | None]]] = []

    def new_slot(self) -> int:
        self.slots += 1
        return self.slots + 1  # frame[0] is the device, frame[1] the cost so far

    def plan(self, expr: Expr) -> Fn | _Const:
        planner = _PLANNERS.get(type(expr))
        if planner is None:
            raise PlanError(f"unsupported expression {type(expr).__name__}", unsupported=True)
        return planner(self, expr)

    def literal(self, expr: Literal) -> _Const:
        return _Const(expr.value)

    def fn(self, expr: Expr) -> Fn:
        planned = self.plan(expr)
        return planned.fn if isinstance(planned, _Const) else planned

    # names

    def ident(self, expr: Ident) -> Fn | _Const:
        name = expr.name
        if not name.startswith("."):
            for scope in reversed(self.scopes):
                if name in scope:
                    slot, init = scope[name]
                    if init is None:
                        return lambda f: f[slot]
                    return _accumulator(slot, init)
        name = name.removeprefix(".")
        if name == "device":
            return lambda f: f[0]
        if expr.type is not None and expr.type.kind == "type":
            return _Const(_type_value(expr.type.params[0] if expr.type.params else expr.type))
        raise PlanError(f"undeclared reference to '{name}'")

    # selection

    def select(self, expr: Select) -> Fn | _Const:
        if expr.resolved is not None:
            t = expr.type
            return _Const(_type_value(t.params[0] if t.params else t))
        operand = self.fn(expr.operand)
        field = expr.field
        if expr.test_only:
            return lambda f: has_field(operand(f), field)
        return lambda f: select_field(operand(f), field)

    # calls

    def call(self, expr: Call) -> Fn | _Const:
        name = expr.function
        special = _SPECIAL.get(name)
        if special is not None:
            return special(self, expr)
        args = [self.plan(a) for a in ([expr.target] if expr.target is not None else [])]
        args += [self.plan(a) for a in expr.args]
        if name in ("matches", "find", "findAll") and len(args) >= 2:
            pattern = args[1]
            if isinstance(pattern, _Const) and type(pattern.value) is str:
                try:
                    regex.compile_go(pattern.value)
                except regex.UnsupportedRegex as error:
                    raise PlanError(str(error), unsupported=True) from None
                except regex.RegexError as error:
                    raise PlanError(str(error)) from None
        if name == "format" and expr.target is not None:
            _check_format(expr)
        if name in ("or", "orValue") and _optional_overload(expr):
            return self.optional_or(name, args)
        fn = library.dispatcher(name, expr.overloads)
        if fn is None:
            raise PlanError(
                f"function {_describe(expr)} is not supported by dra-gpu's CEL evaluator",
                unsupported=True,
            )
        if name in _CONVERSIONS and all(isinstance(a, _Const) for a in args):
            try:
                return _Const(fn(*(a.value for a in args)))  # type: ignore[union-attr]
            except CelError as error:
                raise PlanError(str(error)) from None
        fns = [a.fn if isinstance(a, _Const) else a for a in args]
        cost = costs.SIZE_COST.get(name)
        if cost is not None:
            return cost(fn, fns)
        if len(fns) == 1:
            (a0,) = fns
            return lambda f: fn(a0(f))
        if len(fns) == 2:
            a0, a1 = fns
            return lambda f: fn(a0(f), a1(f))
        if not fns:
            return lambda f: fn()
        return lambda f: fn(*[a(f) for a in fns])

    def optional_or(self, name: str, args: list[Fn | _Const]) -> Fn:
        lhs = args[0].fn if isinstance(args[0], _Const) else args[0]
        rhs = args[1].fn if isinstance(args[1], _Const) else args[1]
        if name == "or":

            def or_(f: list[Any]) -> Any:
                value = lhs(f)
                if type(value) is not Optional:
                    raise no_such_overload()
                return value if value.has_value() else rhs(f)

            return or_

        def or_value(f: list[Any]) -> Any:
            value = lhs(f)
            if type(value) is not Optional:
                raise no_such_overload()
            return value.value if value.has_value() else rhs(f)

        return or_value

    def logical(self, expr: Call) -> Fn:
        terms = [self.fn(a) for a in expr.args]
        decisive = expr.function == "_||_"  # the value that decides: true for ||, false for &&

        def logical(f: list[Any]) -> Any:
            error: CelError | None = None
            for term in terms:
                try:
                    value = term(f)
                except CelError as e:
                    if error is None:
                        error = e
                    continue
                if value is decisive:
                    return decisive
                if type(value) is not bool and error is None:
                    error = no_such_overload()
            if error is not None:
                raise error
            return not decisive

        if len(terms) == 2:
            t0, t1 = terms

            def logical2(f: list[Any]) -> Any:
                try:
                    left = t0(f)
                except CelError as e:
                    left = _Err(e)
                if left is decisive:
                    return decisive
                try:
                    right = t1(f)
                except CelError as e:
                    right = _Err(e)
                if right is decisive:
                    return decisive
                if type(left) is _Err:
                    raise left.error
                if type(left) is not bool:
                    raise no_such_overload()
                if type(right) is _Err:
                    raise right.error
                if type(right) is not bool:
                    raise no_such_overload()
                return not decisive

            return logical2
        return logical

    def conditional(self, expr: Call) -> Fn:
        cond, if_true, if_false = (self.fn(a) for a in expr.args)

        def conditional(f: list[Any]) -> Any:
            c = cond(f)
            if c is True:
                return if_true(f)
            if c is False:
                return if_false(f)
            raise no_such_overload()

        return conditional

    def equality(self, expr: Call) -> Fn:
        left, right = (self.fn(a) for a in expr.args)
        if expr.function == "_==_":
            return lambda f: equals(left(f), right(f))
        return lambda f: not_equals(left(f), right(f))

    def index(self, expr: Call) -> Fn:
        target = self.fn(expr.args[0])
        index = self.plan(expr.args[1])
        if expr.function == "_[?_]":
            i = index.fn if isinstance(index, _Const) else index
            return lambda f: index_optional(target(f), i(f))
        if isinstance(index, _Const):
            key = index.value
            return lambda f: index_value(target(f), key)
        return lambda f: index_value(target(f), index(f))

    def optional_select(self, expr: Call) -> Fn:
        target = self.fn(expr.args[0])
        field = expr.args[1].value  # type: ignore[attr-defined]
        return lambda f: index_optional(target(f), field)

    def not_strictly_false(self, expr: Call) -> Fn:
        arg = self.fn(expr.args[0])

        def not_strictly_false(f: list[Any]) -> Any:
            try:
                value = arg(f)
            except CelError:
                return True
            return value if type(value) is bool else True

        return not_strictly_false

    def membership(self, expr: Call) -> Fn | _Const:
        element = self.fn(expr.args[0])
        container = self.plan(expr.args[1])
        if isinstance(container, _Const) and type(container.value) is list:
            keys = membership_set(container.value)
            if not container.value:
                return _Const(False)  # cel-go folds it without evaluating the element
            if keys is not None:
                return lambda f: is_member(keys, element(f))
        c = container.fn if isinstance(container, _Const) else container
        return lambda f: library.op_in(element(f), c(f))

    # aggregates

    def create_list(self, expr: CreateList) -> Fn | _Const:
        elements = [self.plan(e) for e in expr.elements]
        optional = expr.optional
        if not any(optional) and all(isinstance(e, _Const) for e in elements):
            return _Const([e.value for e in elements])  # type: ignore[union-attr]
        fns = [e.fn if isinstance(e, _Const) else e for e in elements]
        if not any(optional):
            return lambda f: [e(f) for e in fns]
        pairs = list(zip(fns, optional, strict=True))

        def create(f: list[Any]) -> list[Any]:
            out = []
            for fn, opt in pairs:
                value = fn(f)
                if opt:
                    value = _optional_value(value, "list element")
                    if value is MISSING:
                        continue
                out.append(value)
            return out

        return create

    def create_map(self, expr: CreateMap) -> Fn | _Const:
        entries = [(self.plan(k), self.plan(v), opt) for k, v, opt in expr.entries]
        if all(
            isinstance(k, _Const) and isinstance(v, _Const) and not opt for k, v, opt in entries
        ):
            return _Const({to_key(k.value): v.value for k, v, _ in entries})  # type: ignore[union-attr]
        fns = [
            (k.fn if isinstance(k, _Const) else k, v.fn if isinstance(v, _Const) else v, opt)
            for k, v, opt in entries
        ]

        def create(f: list[Any]) -> dict[Any, Any]:
            out: dict[Any, Any] = {}
            for key_fn, value_fn, opt in fns:
                key = key_fn(f)
                value = value_fn(f)
                if opt:
                    value = _optional_value(value, f"entry '{key}'")
                    if value is MISSING:
                        out.pop(to_key(key), None)
                        continue
                try:
                    out[to_key(key)] = value
                except TypeError:
                    raise CelError(f"unsupported map key type: {library.type_name(key)}") from None
            return out

        return create

    def comprehension(self, expr: Comprehension) -> Fn:
        iter_range = self.fn(expr.iter_range)
        accu_slot = self.new_slot()
        accu_init = self.fn(expr.accu_init)
        var_slot = self.new_slot()
        var2_slot = self.new_slot() if expr.iter_var2 is not None else -1
        self.scopes.append({expr.accu_var: (accu_slot, accu_init)})
        loop_scope: dict[str, tuple[int, Fn | None]] = {expr.iter_var: (var_slot, None)}
        if expr.iter_var2 is not None:
            loop_scope[expr.iter_var2] = (var2_slot, None)
        self.scopes.append(loop_scope)
        condition = self.fn(expr.loop_condition)
        step = self.fn(expr.loop_step)
        self.scopes.pop()
        result = self.fn(expr.result)
        self.scopes.pop()
        per_step = costs.static_cost(expr.loop_condition) + costs.static_cost(expr.loop_step)
        two = expr.iter_var2 is not None

        def comprehension(f: list[Any]) -> Any:
            items = iter_range(f)
            if type(items) is list:
                pairs: Any = enumerate(items) if two else items
            elif isinstance(items, dict):
                pairs = (
                    ((from_key(k), v) for k, v in items.items()) if two else map(from_key, items)
                )
            else:
                raise CelError(f"got '{library.type_name(items)}', expected iterable type")
            f[accu_slot] = _UNSET
            for item in pairs:
                f[1] += per_step
                if f[1] > COST_LIMIT:
                    raise costs.cost_exceeded()
                if two:
                    f[var_slot], f[var2_slot] = item
                else:
                    f[var_slot] = item
                try:
                    keep_going = condition(f)
                except CelError:
                    keep_going = True
                if keep_going is False:
                    break
                try:
                    f[accu_slot] = step(f)
                except CelError as error:
                    f[accu_slot] = _Err(error)
            return result(f)

        return comprehension


def _check_format(expr: Call) -> None:
    """cel-go's string-format validator: a literal format with a literal list of arguments."""
    target = expr.target
    if not (isinstance(target, Literal) and type(target.value) is str):
        return
    if len(expr.args) != 1 or not isinstance(expr.args[0], CreateList):
        return
    clauses = library.format_clauses(target.value)
    if clauses is None:
        raise PlanError(f"invalid format string {target.value!r}")
    given = len(expr.args[0].elements)
    if given < len(clauses):
        raise PlanError(f"index {given} out of range")
    if given > len(clauses):
        raise PlanError(
            f"too many arguments supplied to string.format (expected {len(clauses)}, got {given})"
        )
    if any(verb == "e" for verb, _ in clauses):
        raise PlanError(library.UNSUPPORTED_SCIENTIFIC, unsupported=True)


def _accumulator(slot: int, init: Fn) -> Fn:
    def accumulator(f: list[Any]) -> Any:
        value = f[slot]
        if value is _UNSET:
            try:
                value = init(f)
            except CelError as error:
                value = _Err(error)
            f[slot] = value
        if type(value) is _Err:
            raise value.error
        return value

    return accumulator


def _type_value(t: Any) -> CelType:
    return CelType(t.name)


def _optional_overload(expr: Call) -> bool:
    return not expr.overloads or all(
        o in ("optional_or_optional", "optional_orValue_value") for o in expr.overloads
    )


def _describe(expr: Call) -> str:
    return f"{expr.function}() ({', '.join(expr.overloads)})"


_CONVERSIONS: Final = frozenset(
    {"int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration", "dyn", "type"}
)

_SPECIAL: Final[dict[str, Callable[[_Planner, Call], Fn | _Const]]] = {
    "_&&_": _Planner.logical,
    "_||_": _Planner.logical,
    "_?_:_": _Planner.conditional,
    "_==_": _Planner.equality,
    "_!=_": _Planner.equality,
    "_[_]": _Planner.index,
    "_[?_]": _Planner.index,
    "_?._": _Planner.optional_select,
    "@not_strictly_false": _Planner.not_strictly_false,
    "@in": _Planner.membership,
}


_PLANNERS: Final[dict[type[Expr], Callable[[_Planner, Any], Fn | _Const]]] = {
    Literal: _Planner.literal,
    Ident: _Planner.ident,
    Select: _Planner.select,
    Call: _Planner.call,
    CreateList: _Planner.create_list,
    CreateMap: _Planner.create_map,
    Comprehension: _Planner.comprehension,
}
"""How each kind of expression is planned (CreateStruct: none, the checker refuses it)."""


def plan(tree: Expr) -> Program:
    """The program for a checked tree; PlanError when it cannot be built."""
    planner = _Planner()
    fn = planner.fn(tree)
    return Program(fn, planner.slots)


def _optional_value(value: Any, what: str) -> Any:
    """The value of an optional element or entry (``?x``); MISSING when it has none."""
    if type(value) is not Optional:
        raise CelError(f"cannot initialize optional {what} from non-optional value {value}")
    return value.value if value.has_value() else MISSING

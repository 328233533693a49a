"""How a checked call reaches its implementation: cel-go's ``FunctionDecl.Bindings``.

A call runs the overload the checker resolved, guarded by its declared argument types; when
several overloads matched, the first in declaration order whose guard the arguments pass, else
"no such overload". A guard is cel-go's ``IsAssignableRuntimeType``: the runtime type's name,
and of a list or map its first element.

Owns: ``guard``, ``guarded`` and ``dispatching`` (the callables the function table is wrapped in).
Must not: know which functions exist (the package's ``__init__`` holds the table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_gpu.cel._port.checker import Type
from dra_gpu.cel._port.library.runtime_types import no_such_overload, type_name
from dra_gpu.cel._port.values import CelType, from_key

__all__ = ["dispatching", "guard", "guarded"]


def guard(t: Type) -> Callable[[Any], bool]:
    """IsAssignableRuntimeType: the runtime type's name, and a list's/map's first element."""
    if t.is_dyn():
        return lambda v: True
    name = t.name
    if t.kind == "list":
        element = guard(t.params[0])
        return lambda v: type(v) is list and (not v or element(v[0]))
    if t.kind == "map":
        key, value = guard(t.params[0]), guard(t.params[1])

        def map_guard(v: Any) -> bool:
            if not isinstance(v, dict):
                return False
            for k, x in v.items():
                return key(from_key(k)) and value(x)
            return True

        return map_guard
    if t.kind == "type":
        return lambda v: type(v) is CelType
    return lambda v: type_name(v) == name


def guarded(
    fn: Callable[..., Any], guards: tuple[Callable[[Any], bool], ...]
) -> Callable[..., Any]:
    if len(guards) == 1:
        (g0,) = guards

        def unary(a: Any) -> Any:
            if not g0(a):
                raise no_such_overload()
            return fn(a)

        return unary
    if len(guards) == 2:
        g0, g1 = guards

        def binary(a: Any, b: Any) -> Any:
            if not (g0(a) and g1(b)):
                raise no_such_overload()
            return fn(a, b)

        return binary

    def call(*args: Any) -> Any:
        if len(args) != len(guards) or not all(g(a) for g, a in zip(guards, args, strict=True)):
            raise no_such_overload()
        return fn(*args)

    return call


def dispatching(
    candidates: tuple[tuple[tuple[Callable[[Any], bool], ...], Callable[..., Any]], ...],
) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        for guards, fn in candidates:
            if len(guards) == len(args) and all(g(a) for g, a in zip(guards, args, strict=True)):
                return fn(*args)
        raise no_such_overload()

    return call

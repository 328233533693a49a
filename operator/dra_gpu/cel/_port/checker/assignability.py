"""Whether one CEL type may stand for another, as cel-go's ``checker/types.go`` decides it.

Type parameters are bound in a ``Mapping`` (substitutions) as overloads are tried; a parameter
bound twice joins to the "most general" of the two; ``dyn``, ``error`` and ``null`` assign as
cel-go's rules say. ``substitute`` resolves a type through the bindings (unbound parameters to
``dyn`` once checking is done).

Owns: ``Mapping``, ``assignable``, ``assignable_list``, ``most_general``, ``substitute`` and the
type predicates the checker shares (``is_dyn``, ``unwrap_optional``, ``format_type``).
Must not: know expressions or declarations.
"""

from __future__ import annotations

from dra_gpu.cel._port.checker.types import DYN, NULL, Type

__all__ = [
    "Mapping",
    "assignable",
    "assignable_list",
    "format_type",
    "is_dyn",
    "is_dyn_or_error",
    "is_optional",
    "most_general",
    "substitute",
    "unwrap_optional",
]


class Mapping:
    __slots__ = ("map",)

    def __init__(self, mapping: dict[str, Type] | None = None) -> None:
        self.map: dict[str, Type] = mapping or {}

    def find(self, t: Type) -> Type | None:
        return self.map.get(format_type(t))

    def add(self, t: Type, to: Type) -> None:
        self.map[format_type(t)] = to

    def copy(self) -> Mapping:
        return Mapping(dict(self.map))


def format_type(t: Type) -> str:
    if t.kind == "param":
        return t.name
    if t.kind == "error":
        return "!error!"
    return str(t)


def is_dyn(t: Type) -> bool:
    return t.kind in ("dyn", "any")


def is_dyn_or_error(t: Type) -> bool:
    return t.kind in ("dyn", "any", "error")


def is_optional(t: Type) -> bool:
    return t.kind == "opaque" and t.name == "optional_type"


def unwrap_optional(t: Type) -> tuple[Type, bool]:
    if is_optional(t):
        return t.params[0], True
    return t, False


def _equal_or_less_specific(t1: Type, t2: Type) -> bool:
    if is_dyn(t1) or t1.kind == "param":
        return True
    if is_dyn(t2) or t2.kind == "param":
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


def assignable(m: Mapping, t1: Type, t2: Type) -> bool:
    if t2.kind == "param":
        valid, has_sub = _valid_substitution(m, t1, t2)
        if valid:
            return True
        if has_sub:
            return False
    if t1.kind == "param":
        valid, _ = _valid_substitution(m, t2, t1)
        return valid
    if is_dyn_or_error(t1) or is_dyn_or_error(t2):
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
            t1.kind == t2.kind and t1.name == t2.name and assignable_list(m, t1.params, t2.params)
        )
    return False


def _valid_substitution(m: Mapping, t1: Type, t2: Type) -> tuple[bool, bool]:
    if t1.kind == t2.kind and t1 == t2:
        return True, True
    sub = m.find(t2)
    if sub is not None:
        if t1.kind == sub.kind and t1 == sub:
            return True, True
        if assignable(m, t1, sub):
            new = most_general(t1, sub)
            if _not_referenced_in(m, t2, new):
                m.add(t2, new)
            return True, True
        return False, True
    if _not_referenced_in(m, t2, t1):
        m.add(t2, t1)
        return True, False
    return False, False


def assignable_list(m: Mapping, l1: tuple[Type, ...], l2: tuple[Type, ...]) -> bool:
    if len(l1) != len(l2):
        return False
    return all(assignable(m, a, b) for a, b in zip(l1, l2, strict=True))


def _assignable_null(t: Type) -> bool:
    return t.kind in ("opaque", "struct", "any", "duration", "timestamp") or t.assignable_from(NULL)


def most_general(t1: Type, t2: Type) -> Type:
    return t1 if _equal_or_less_specific(t1, t2) else t2


def _not_referenced_in(m: Mapping, t: Type, within: Type) -> bool:
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


def substitute(m: Mapping, t: Type, params_to_dyn: bool) -> Type:
    sub = m.find(t)
    if sub is not None:
        return substitute(m, sub, params_to_dyn)
    if params_to_dyn and t.kind == "param":
        return DYN
    if t.kind in ("opaque", "list", "map") or (t.kind == "type" and t.params):
        return Type(t.kind, t.name, tuple(substitute(m, p, params_to_dyn) for p in t.params))
    return t

"""CEL types as cel-go's ``common/types`` has them: kind, runtime name, type parameters.

Owns: ``Type`` (``==`` is IsExactType), the named types (``BOOL``, ``DYN``, ``QUANTITY`` ...),
the constructors (``list_of``, ``map_of``, ``optional_of``, ``type_of``, ``param``) and
``parse_type``, which reads a type as the declarations table writes it.
Must not: decide assignability (``assignability``) or know any expression.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Final

__all__ = [
    "ANY",
    "BOOL",
    "BYTES",
    "DOUBLE",
    "DURATION",
    "DYN",
    "ERROR",
    "INT",
    "NULL",
    "QUANTITY",
    "SEMVER",
    "STRING",
    "TIMESTAMP",
    "TYPE",
    "UINT",
    "Type",
    "list_of",
    "map_of",
    "optional_of",
    "param",
    "parse_type",
    "type_of",
]


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

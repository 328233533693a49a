"""What the scheduler's CEL environment declares to the checker.

Every function with its overloads (read from ``declarations``, in declaration order), the
``device`` variable of DRA's stored-expressions environment with its fields, and the type names
cel-go resolves as identifiers.

Owns: ``Overload``, ``FUNCTIONS``, ``DEVICE``/``DEVICE_FIELDS``, ``STRUCT_FIELDS``,
``VARIABLES``, ``TYPE_IDENTS``.
Must not: check anything (``checking``).
"""

from __future__ import annotations

from typing import Final

from dra_gpu.cel._port import declarations
from dra_gpu.cel._port.checker.types import (
    BOOL,
    BYTES,
    DOUBLE,
    DURATION,
    DYN,
    INT,
    NULL,
    QUANTITY,
    STRING,
    TIMESTAMP,
    TYPE,
    UINT,
    Type,
    list_of,
    map_of,
    optional_of,
    parse_type,
)

__all__ = [
    "DEVICE",
    "DEVICE_FIELDS",
    "FUNCTIONS",
    "STRUCT_FIELDS",
    "TYPE_IDENTS",
    "VARIABLES",
    "Overload",
]


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
STRUCT_FIELDS: Final = {DEVICE.name: DEVICE_FIELDS}
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

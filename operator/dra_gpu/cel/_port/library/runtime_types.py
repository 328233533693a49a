"""What type a CEL value has at runtime (cel-go's ``common/types``), for guards and messages.

Owns: ``type_name`` (the runtime type name cel-go reports: ``int``, ``kubernetes.Quantity``,
``google.protobuf.Timestamp`` ...), ``DefaultMap`` (the device's attribute and capacity maps),
``EMPTY_MAP``, and ``no_such_overload``, the error of a call that no overload takes.
Must not: implement any function; every library module builds on this one.
"""

from __future__ import annotations

from typing import Any, Final

from dra_gpu.cel._port.values import CelError, CelType, Duration, Optional, Timestamp, Uint
from dra_gpu.resource.quantities import Quantity
from dra_gpu.resource.semvers import Semver

__all__ = ["EMPTY_MAP", "DefaultMap", "cel_type_of", "no_such_overload", "type_name"]


def no_such_overload() -> CelError:
    return CelError("no such overload")


class DefaultMap(dict):  # type: ignore[type-arg]
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map
    (upstream's mapper.Find), while ``in``, ``size()`` and iteration see only real domains."""

    __slots__ = ()


EMPTY_MAP: Final[dict[Any, Any]] = {}


def type_name(value: Any) -> str:
    t = type(value)
    name = _TYPE_NAMES.get(t)
    if name is not None:
        return name
    if isinstance(value, dict):
        return "map"
    if isinstance(value, Quantity):
        return "kubernetes.Quantity"
    if isinstance(value, Semver):
        return "kubernetes.Semver"
    named = getattr(value, "cel_type_name", None)
    if named is not None:
        return str(named)
    return t.__name__


_TYPE_NAMES: Final[dict[type, str]] = {
    bool: "bool",
    int: "int",
    Uint: "uint",
    float: "double",
    str: "string",
    bytes: "bytes",
    type(None): "null_type",
    list: "list",
    dict: "map",
    Timestamp: "google.protobuf.Timestamp",
    Duration: "google.protobuf.Duration",
    CelType: "type",
    Optional: "optional_type",
}


def cel_type_of(value: Any) -> CelType:
    return CelType(type_name(value))

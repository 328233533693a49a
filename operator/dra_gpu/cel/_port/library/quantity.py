"""Kubernetes' CEL quantity library (``library/quantity.go``): ``quantity()``, ``isQuantity()``,
``sign``, ``isGreaterThan``, ``isLessThan``, ``compareTo``, ``asApproximateFloat``,
``asInteger``, ``isInteger``, ``add``, ``sub``.

The values are the package's one quantity type (``dra_gpu.resource.quantities``), so a device's
capacity and a selector's ``quantity("1Gi")`` are the same thing.

Owns: ``IMPLEMENTATIONS`` of the quantity overloads.
Must not: parse or compare quantities itself (``resource.quantities`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.values import CelError
from dra_gpu.resource.quantities import Quantity, QuantityError, parse_quantity

__all__ = ["IMPLEMENTATIONS"]


def to_quantity(text: str) -> Quantity:
    try:
        return parse_quantity(text)
    except QuantityError as error:
        raise CelError(str(error)) from None


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def quantity_compare(a: Quantity, b: Quantity) -> int:
    return a.cmp(b)


def quantity_add(a: Quantity, b: Any, *, negate: bool = False) -> Quantity:
    other = Quantity.of_int(b) if type(b) is int else b
    result = a.added(other, negate=negate)
    result.boxed = True
    return result


def quantity_as_integer(q: Quantity) -> int:
    value = q.as_int64()
    if value is None:
        raise CelError("cannot convert value to integer")
    return value


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "string_to_quantity": to_quantity,
    "is_quantity_string": is_quantity,
    "quantity_sign": lambda q: q.sign(),
    "quantity_is_greater_than": lambda a, b: a.cmp(b) == 1,
    "quantity_is_less_than": lambda a, b: a.cmp(b) == -1,
    "quantity_compare_to": quantity_compare,
    "quantity_get_float": lambda q: q.as_approximate_float(),
    "quantity_get_int": quantity_as_integer,
    "quantity_is_integer": lambda q: q.as_int64() is not None,
    "quantity_add": quantity_add,
    "quantity_add_int": quantity_add,
    "quantity_sub": lambda a, b: quantity_add(a, b, negate=True),
    "quantity_sub_int": lambda a, b: quantity_add(a, b, negate=True),
}

"""The API's value rules for devices: quantities, semver versions and attribute values.

Owns how a capacity quantity is read (exactly, as the API server reads it), how a byte count is
written, how a driver's dotted version becomes semver, and the four attribute value types with
their checks (64-bit integers, 64-character strings, semantic versions), each raising
``InventoryError`` when built wrong. Must not: know devices or inventories; do I/O.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

from dra_gpu.devices.model import errors
from dra_gpu.resource import quantities, semvers

MAX_VALUE_LENGTH = 64
_INT64 = (-(2**63), 2**63 - 1)


# --- quantities and versions ---------------------------------------------------------------------


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity ("24Gi", "1.5G", "100m"), parsed as the API
    server parses it (``dra_gpu.resource.quantities``); InventoryError if it is none."""
    try:
        return quantities.exact_value(text)
    except quantities.QuantityError:
        raise errors.InventoryError(f"{text!r} is not a Kubernetes quantity (e.g. 24Gi)") from None


def is_semver(text: str) -> bool:
    """A semantic version as the API server's ``version`` attribute check reads it."""
    try:
        semvers.parse_semver(text)
    except semvers.SemverError:
        return False
    return True


def format_bytes(count: int) -> str:
    """An exact quantity for a byte count, in the largest binary unit that divides it.

    Exact so that ``compareTo(quantity("24Gi"))`` never rounds a device into or out of a
    selector; in the unit Kubernetes itself would print, so a round trip changes nothing.
    """
    if count < 0:
        raise errors.InventoryError(f"a byte count cannot be negative: {count}")
    for power, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        unit = 1024**power
        if count and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def normalize_version(raw: str) -> str:
    """A semver 2.0.0 string for a dotted version as drivers report it.

    "535.104" -> "535.104.0", "550.54.05" -> "550.54.5" (semver forbids leading zeros),
    "9.0" -> "9.0.0"; components beyond the third become build metadata, which semver
    ignores when comparing ("31.0.15.3623" -> "31.0.15+3623").
    """
    text = raw.strip().removeprefix("v")
    if is_semver(text):
        return text
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        raise errors.InventoryError(
            f"{raw!r} cannot be read as a version (expected numbers separated by dots, e.g. 12.4)"
        )
    parts = text.split(".")
    core = [str(int(p)) for p in parts[:3]] + ["0"] * (3 - len(parts[:3]))
    extra = parts[3:]
    return ".".join(core) + ("+" + ".".join(extra) if extra else "")


# --- attribute values ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IntValue:
    value: int

    def __post_init__(self) -> None:
        # bool is an int subclass in Python but a different attribute type in the API.
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise errors.InventoryError(f"{self.value!r} is not an integer")
        if not _INT64[0] <= self.value <= _INT64[1]:
            raise errors.InventoryError(f"{self.value} does not fit in a 64-bit integer")

    def to_api(self) -> dict[str, int]:
        return {"int": self.value}


@dataclasses.dataclass(frozen=True)
class BoolValue:
    value: bool

    def __post_init__(self) -> None:
        if not isinstance(self.value, bool):
            raise errors.InventoryError(f"{self.value!r} is not true or false")

    def to_api(self) -> dict[str, bool]:
        return {"bool": self.value}


@dataclasses.dataclass(frozen=True)
class StringValue:
    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise errors.InventoryError(f"{self.value!r} is not a string")
        if len(self.value) > MAX_VALUE_LENGTH:
            raise errors.InventoryError(
                f"{self.value!r} is longer than {MAX_VALUE_LENGTH} characters"
            )

    def to_api(self) -> dict[str, str]:
        return {"string": self.value}


@dataclasses.dataclass(frozen=True)
class VersionValue:
    """A semver 2.0.0 version; build it from a driver's dotted string with ``normalize_version``."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not is_semver(self.value):
            raise errors.InventoryError(f"{self.value!r} is not a semantic version (e.g. 12.4.0)")
        if len(self.value) > MAX_VALUE_LENGTH:
            raise errors.InventoryError(
                f"{self.value!r} is longer than {MAX_VALUE_LENGTH} characters"
            )

    def to_api(self) -> dict[str, str]:
        return {"version": self.value}


AttributeValue = IntValue | BoolValue | StringValue | VersionValue
"""Exactly one of the API's DeviceAttribute value fields, chosen by the type."""

"""Sharing policy: how a GPU offered to several claims at once is shared, as the model holds it.

Owns ``Sharing`` (the mode, MPS's thread percentage, TimeSlicing's time slice) and
``MemoryPolicy`` (the ``requestPolicy`` on a shared device's memory: its rounding of one share,
and the API server's rules for it against the device's memory). Must not: read the ``sharing``
block of a profile or setting (``devices.sharing`` does) or touch a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dra_gpu.devices.model import errors, values

SHARING_MODES = ("TimeSlicing", "MPS")
"""How the containers sharing a GPU run on it: taking turns, or side by side under MPS (with a
pinned-memory limit each)."""


@dataclasses.dataclass(frozen=True)
class MemoryPolicy:
    """How much of a shared device's ``memory`` one allocation takes (the capacity's
    ``requestPolicy``): ``default`` when the request names none; a request is rounded up to
    ``min`` + n * ``step`` and refused above ``max``. Quantity strings; checked against the
    device's memory as the API server checks them (``Device``)."""

    default: str
    min: str
    max: str | None = None
    step: str | None = None

    def to_api(self) -> dict[str, Any]:
        valid: dict[str, str] = {"min": self.min}
        if self.max is not None:
            valid["max"] = self.max
        if self.step is not None:
            valid["step"] = self.step
        return {"default": self.default, "validRange": valid}

    def share(self, requested: int | None) -> int | None:
        """The bytes one allocation requesting ``requested`` (None: nothing named) takes, as
        the scheduler rounds it; None if the policy refuses it."""
        low = int(values.parse_quantity(self.min))
        amount = (
            int(values.parse_quantity(self.default)) if requested is None else max(requested, low)
        )
        if self.step is not None:
            step = int(values.parse_quantity(self.step))
            amount = low + -(-(amount - low) // step) * step
        if self.max is not None and amount > int(values.parse_quantity(self.max)):
            return None
        return amount

    def check(self, capacity: int) -> None:
        """The API server's rules for a ``validRange`` policy on a capacity of ``capacity``
        bytes; InventoryError naming the field."""
        given = {}
        for name in ("default", "min", "max", "step"):
            text = getattr(self, name)
            if text is None:
                continue
            try:
                given[name] = values.parse_quantity(text)
            except errors.InventoryError as err:
                raise errors.InventoryError(f"{name}: {err}") from None
            if given[name] < 0 or given[name].denominator != 1:
                raise errors.InventoryError(f"{name}: {text} is not a whole number of bytes")
        default, low = given["default"], given["min"]
        total = values.format_bytes(capacity)
        high, step = given.get("max"), given.get("step")
        if low > capacity:
            raise errors.InventoryError(f"min: {self.min} is more than the memory ({total})")
        if default < low:
            raise errors.InventoryError(f"default: {self.default} is less than min {self.min}")
        if high is not None:
            if high > capacity:
                raise errors.InventoryError(f"max: {self.max} is more than the memory ({total})")
            if high < low:
                raise errors.InventoryError(f"max: {self.max} is less than min {self.min}")
            if default > high:
                raise errors.InventoryError(f"default: {self.default} is more than max {self.max}")
        if step is not None:
            if step <= 0:
                raise errors.InventoryError(f"step: {self.step} must be more than zero")
            if low + step > capacity:
                raise errors.InventoryError(
                    f"step: min + step ({self.min} + {self.step}) is more than the memory ({total})"
                )
            for name, value in (("default", default), ("max", high)):
                if value is not None and (value - low) % step:
                    raise errors.InventoryError(
                        f"{name}: {getattr(self, name)} is not min {self.min} plus a whole "
                        f"number of steps of {self.step}"
                    )


@dataclasses.dataclass(frozen=True)
class Sharing:
    """A GPU that several claims may hold at once (``allowMultipleAllocations``), each with a
    share of its memory (consumable capacity, ``DRAConsumableCapacity``)."""

    mode: str
    """One of ``SHARING_MODES``."""
    memory: MemoryPolicy
    active_thread_percentage: int | None = None
    """MPS: the share of the GPU's threads each client may use (1-100; None: all)."""
    time_slice: str | None = None
    """TimeSlicing: one of ``TIME_SLICES``, set on the GPU while it is shared (None: left as
    the GPU has it)."""

    def __post_init__(self) -> None:
        if self.mode not in SHARING_MODES:
            raise errors.InventoryError(
                f"mode: {self.mode!r} is not one of {', '.join(SHARING_MODES)}"
            )
        pct = self.active_thread_percentage
        if pct is not None and (self.mode != "MPS" or not 1 <= pct <= 100):
            raise errors.InventoryError(
                f"activeThreadPercentage: {pct!r} needs mode MPS and a value from 1 to 100"
            )
        if self.time_slice is not None and (
            self.mode != "TimeSlicing" or self.time_slice not in TIME_SLICES
        ):
            raise errors.InventoryError(
                f"timeSlice: {self.time_slice!r} needs mode TimeSlicing and one of "
                f"{', '.join(TIME_SLICES)}"
            )


TIME_SLICES = ("Default", "Short", "Medium", "Long")
"""``nvidia-smi compute-policy --set-timeslice`` values 0-3, as NVIDIA's DRA driver names them."""

"""Why a selector rules a device out, or does not compile, in plain words.

Owns: a ``Selector`` as messages name it (``class gpu-inferencia selector #0``, or the
request's own ``selector #1``), the text for a selector that does not compile, for one that
fails with an error on a device, and for a device it rules out. For the simple forms
(``cel.comparison``: capacity comparisons, driver and attribute equality, read from the
syntax tree) the text says what the device has and what the selector needs ("node-01/gpu-1
has memory 8Gi, needs >= 24Gi"); for any other, it quotes the selector.
Must not: evaluate selectors (``selections`` and ``cel`` do); it only words their outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu import cel
from dra_gpu.controller import published
from dra_gpu.controller.explain import wording


@dataclasses.dataclass(frozen=True)
class Selector:
    index: int
    compiled: cel.Compiled
    owner: str
    """``"class gpu-inferencia "`` for a class selector, ``""`` for the request's own."""

    @property
    def where(self) -> str:
        return f"{self.owner}selector #{self.index}"


def selectors(
    raw: Sequence[Mapping[str, Any]] | None, class_name: str | None
) -> tuple[Selector, ...]:
    """A class's (``class_name``) or a request's (None) ``selectors``, compiled."""
    owner = f"class {class_name} " if class_name is not None else ""
    return tuple(
        Selector(i, cel.compile_selector(str((s.get("cel") or {}).get("expression", ""))), owner)
        for i, s in enumerate(raw or [])
    )


def compile_problem(selectors: Sequence[Selector]) -> str | None:
    """The first selector that does not compile, in words; None if all compile."""
    for selector in selectors:
        compiled = selector.compiled
        if compiled.error is not None:
            where = f"device {selector.owner.strip()}: " if selector.owner else ""
            return (
                f"{where}selector #{selector.index} does not compile: "
                f"{wording.one_line(compiled.error)} ({wording.short(compiled.expression)})"
            )
    return None


def rejection_text(
    selector: Selector, evaluation: cel.Evaluation, device: published.PublishedDevice
) -> str:
    """Why ``selector`` did not accept ``device``: its error, or the mismatch."""
    if evaluation.error is not None:
        return f"{device.label}: {selector.where}: {wording.one_line(evaluation.error)}"
    expression = selector.compiled.expression
    found = cel.comparison(expression)
    text = _compared(found, device) if found is not None else None
    if text is not None:
        return f"{device.label} {text}"
    return f"{device.label} does not match {selector.where} ({wording.short(expression)})"


def _compared(comparison: cel.Comparison, device: published.PublishedDevice) -> str | None:
    """What the device has and what ``comparison`` needs: "has memory 8Gi, needs >= 24Gi"."""
    if comparison.field == "driver":
        return f"has driver {device.driver}, needs {comparison.constant}"
    shown, value = _lookup(device, comparison.field, comparison.domain, comparison.name)
    if comparison.field == "capacity":
        needs = f"needs {comparison.relation} {comparison.constant}"
        if not isinstance(value, Mapping) or "value" not in value:
            return f"has no {shown} capacity, {needs}"
        return f"has {shown} {value['value']}, {needs}"
    needs = f"needs {_literal(comparison.constant)}"
    if not isinstance(value, Mapping) or not value:
        return f"has no {shown} attribute, {needs}"
    kind, raw = next(iter(value.items()))
    text = f'"{raw}"' if kind in ("string", "version") else str(raw).lower()
    return f"has {shown} {text}, {needs}"


def _literal(constant: str | int | bool) -> str:
    """A constant as CEL writes it: ``"a100"``, ``8``, ``true``."""
    if isinstance(constant, str):
        return f'"{constant}"'
    return str(constant).lower()


def _lookup(
    device: published.PublishedDevice, field: str, domain: str, name: str
) -> tuple[str, object]:
    """A capacity or attribute by CEL's (domain, name); bare names are the driver's domain."""
    values = device.body.get(field) or {}
    qualified = f"{domain}/{name}"
    if domain == device.driver:
        return name, values.get(name, values.get(qualified))
    return qualified, values.get(qualified)

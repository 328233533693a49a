"""A DeviceClass's CEL selectors, compiled, and the drivers they name.

Pure: the class body in, compiled selectors (``cel.compile_selector`` caches each expression)
or driver names out (``cel.comparisons`` reads them from the syntax tree). The tallies, the
explainer and the class checks all read classes this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_gpu import cel


def class_selectors(device_class: Mapping[str, Any]) -> tuple[cel.Compiled, ...]:
    """A DeviceClass's CEL selectors, compiled (once per expression)."""
    return tuple(
        cel.compile_selector(str(s["cel"].get("expression", "")))
        for s in (device_class.get("spec") or {}).get("selectors") or []
        if "cel" in s
    )


def class_drivers(device_class: Mapping[str, Any]) -> set[str]:
    """Drivers a class's selectors compare with ``device.driver == "..."``, anywhere in them
    (empty: any)."""
    return {
        str(c.constant)
        for compiled in class_selectors(device_class)
        for c in cel.comparisons(compiled.expression)
        if c.field == "driver" and c.constant
    }

"""Kubernetes' CEL format library (``library/format.go``): ``format.named()``, the named formats
(``format.dns1123Label()`` ...) and ``validate``.

Owns: ``IMPLEMENTATIONS`` of the format overloads, one constant per named format.
Must not: validate anything itself (``dra_gpu.cel._port.formats`` holds the validators).
(``string.format`` is another library's: ``formatting``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import formats

__all__ = ["IMPLEMENTATIONS"]


def _implementations() -> dict[str, Callable[..., Any]]:
    impl: dict[str, Callable[..., Any]] = {
        "format-named": formats.named,
        "format-validate": formats.validate,
    }
    for name in formats.FORMATS:
        impl[f"format.{name}"] = formats.constant(name)
    return impl


IMPLEMENTATIONS: Final = _implementations()

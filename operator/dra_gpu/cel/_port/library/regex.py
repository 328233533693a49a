"""Kubernetes' CEL regex library: ``find`` and ``findAll`` (``library/regex.go``).

The patterns are Go's RE2, compiled by ``dra_gpu.cel._port.regex``; an invalid one is
"Illegal regex: ..." as upstream words it. (``matches`` is the standard library's.)

Owns: ``IMPLEMENTATIONS`` of ``find`` and ``findAll``.
Must not: compile a pattern other than through ``_port.regex`` (Go's meaning, Go's errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import regex
from dra_gpu.cel._port.values import CelError

__all__ = ["IMPLEMENTATIONS"]


def _find(s: str, pattern: str) -> str:
    match = _find_regex(pattern).search(s)
    return match.group() if match else ""


def _find_all(s: str, pattern: str, limit: int) -> list[str]:
    return regex.find_all(_find_regex(pattern), s, limit)


def _find_regex(pattern: str) -> Any:
    try:
        return regex.compile_go(pattern)
    except regex.UnsupportedRegex as error:
        raise CelError(str(error)) from None
    except regex.RegexError as error:
        raise CelError(f"Illegal regex: {error}") from None


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "string_find_string": lambda s, p: _find(s, p),
    "string_find_all_string": lambda s, p: _find_all(s, p, -1),
    "string_find_all_string_int": _find_all,
}

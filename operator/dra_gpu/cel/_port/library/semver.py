"""Kubernetes' CEL semver library (``library/semverlib.go``): ``semver()``, ``isSemver()``
(each optionally normalizing), ``major``, ``minor``, ``patch``, ``isGreaterThan``,
``isLessThan``, ``compareTo``.

Owns: ``IMPLEMENTATIONS`` of the semver overloads.
Must not: parse versions itself (``resource.semvers`` does, for attributes too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.values import CelError
from dra_gpu.resource.semvers import Semver, SemverError, parse_semver

__all__ = ["IMPLEMENTATIONS"]


def to_semver(text: str, normalize: bool = False) -> Semver:
    try:
        return parse_semver(text, normalize)
    except SemverError as error:
        raise CelError(str(error)) from None


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except SemverError:
        return False
    return True


def _uint_as_int(n: int) -> int:
    return (n + 2**63) % 2**64 - 2**63  # types.Int(uint64) wraps


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "string_to_semver": to_semver,
    "string_bool_to_semver": to_semver,
    "is_semver_string": is_semver,
    "is_semver_string_bool": is_semver,
    "semver_major": lambda v: _uint_as_int(v.major),
    "semver_minor": lambda v: _uint_as_int(v.minor),
    "semver_patch": lambda v: _uint_as_int(v.patch),
    "semver_is_greater_than": lambda a, b: a.compare(b) == 1,
    "semver_is_less_than": lambda a, b: a.compare(b) == -1,
    "semver_compare_to": lambda a, b: a.compare(b),
}

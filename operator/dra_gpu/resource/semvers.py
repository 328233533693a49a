"""Semantic versions exactly as github.com/blang/semver/v4 parses and orders them.

Kubernetes' CEL ``semver()`` and DRA's ``version`` attributes both go through blang's ``Parse``
(optionally after apiserver's ``normalizeAndParse``); comparisons use its ``Compare``, which
ignores build metadata. The one semver parser of the package: CEL's ``semver()`` and the
device model's ``version`` attributes both use it. CEL's equality rule for versions lives with
CEL (``_cel.values.cel_equal``). Pure functions; no I/O, no imports from the rest of the package.
"""

from __future__ import annotations

import functools
import json
from typing import Final

__all__ = ["Semver", "SemverError", "parse_semver"]

_DIGITS: Final = frozenset("0123456789")
_ALPHANUMERIC: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_UINT64_MAX: Final = 2**64 - 1

_PreRelease = tuple[tuple[int, int, str], ...]  # (0 = numeric / 1 = alphanumeric, number, text)


class SemverError(ValueError):
    """blang/semver's error, worded as it words it."""


class Semver:
    """A parsed version; ``==`` and ordering follow blang's ``Compare`` (build ignored)."""

    __slots__ = ("build", "key", "major", "minor", "patch", "pre")

    def __init__(
        self, major: int, minor: int, patch: int, pre: tuple[str, ...], build: tuple[str, ...]
    ) -> None:
        self.major = major
        self.minor = minor
        self.patch = patch
        self.pre = pre
        self.build = build
        identifiers: _PreRelease = tuple(
            (0, int(p), "") if all(c in _DIGITS for c in p) else (1, 0, p) for p in pre
        )
        # A release sorts after its prereleases; then identifier by identifier, a longer list
        # of equal identifiers sorting later (tuple order does exactly that).
        self.key = (major, minor, patch, 0 if pre else 1, identifiers)

    def compare(self, other: Semver) -> int:
        return (self.key > other.key) - (self.key < other.key)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Semver({self})"


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # Go's %q, near enough for messages


def _parse_uint(part: str) -> int:
    if not part:
        raise SemverError(f'strconv.ParseUint: parsing "{part}": invalid syntax')
    value = int(part)
    if value > _UINT64_MAX:
        raise SemverError(f"strconv.ParseUint: parsing {_quoted(part)}: value out of range")
    return value


def _number(part: str, what: str) -> int:
    if not all(c in _DIGITS for c in part):
        raise SemverError(f"Invalid character(s) found in {what.lower()} number {_quoted(part)}")
    if len(part) > 1 and part[0] == "0":
        raise SemverError(f"{what} number must not contain leading zeroes {_quoted(part)}")
    return _parse_uint(part)


@functools.lru_cache(maxsize=8192)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """blang ``Parse`` (after apiserver's ``normalizeAndParse`` when asked); SemverError."""
    if normalize:
        text = _normalize(text)
    if not text:
        raise SemverError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise SemverError("No Major.Minor.Patch elements found")
    major = _number(parts[0], "Major")
    minor = _number(parts[1], "Minor")
    patch_text, plus, build_text = parts[2].partition("+")
    patch_text, dash, pre_text = patch_text.partition("-")
    patch = _number(patch_text, "Patch")
    pre = tuple(pre_text.split(".")) if dash else ()
    for identifier in pre:
        if not identifier:
            raise SemverError("Prerelease is empty")
        if all(c in _DIGITS for c in identifier):
            if len(identifier) > 1 and identifier[0] == "0":
                raise SemverError(
                    "Numeric PreRelease version must not contain leading zeroes "
                    + _quoted(identifier)
                )
            _parse_uint(identifier)
        elif not all(c in _ALPHANUMERIC for c in identifier):
            raise SemverError(f"Invalid character(s) found in prerelease {_quoted(identifier)}")
    build = tuple(build_text.split(".")) if plus else ()
    for identifier in build:
        if not identifier:
            raise SemverError("Build meta data is empty")
        if not all(c in _ALPHANUMERIC for c in identifier):
            raise SemverError(
                f"Invalid character(s) found in build meta data {_quoted(identifier)}"
            )
    return Semver(major, minor, patch, pre, build)


def _normalize(text: str) -> str:
    # apiserver's normalizeAndParse: drop one "v", strip leading zeros, fill in minor and patch.
    parts = text.removeprefix("v").split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            part = part.lstrip("0")
            if not part or part[0] not in _DIGITS:
                part = "0" + part
            parts[i] = part
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise SemverError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)

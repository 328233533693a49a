"""Opaque configuration for our driver: strict decoding and merging (pure, no I/O).

DeviceClasses and ResourceClaims may carry ``config[].opaque`` entries; the scheduler copies them
into ``status.allocation.devices.config`` with class configs first and claim configs after, so
later entries override earlier ones. Entries for other drivers are not ours and are ignored.

Our parameters are one object kind::

    apiVersion: gpu.dra-gpu.io/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: Exclusive | TimeSlicing     # default Exclusive
    env:                                    # extra environment for containers using the device
      NAME: value
    migProfile: 3g.20gb                     # only a MIG partition of this profile will do

Decoding is strict: an unknown field, a wrong type or a bad value is an ``InvalidConfig`` whose
message names the config entry and the field, because a typo silently ignored would hand a user
a GPU configured differently from what they wrote.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

API_VERSION: Final = "gpu.dra-gpu.io/v1alpha1"
KIND: Final = "GpuConfig"
SHARING_STRATEGIES: Final = ("Exclusive", "TimeSlicing")
_MIG_PROFILE = re.compile(r"[1-9][0-9]*g\.[1-9][0-9]*gb([+-][a-z][a-z0-9.]*)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_ENV = 64


class InvalidConfig(ValueError):
    """A config entry for our driver that we refuse to apply; the message names the field."""


@dataclasses.dataclass(frozen=True)
class GpuConfig:
    """The effective configuration of one allocated device."""

    sharing: str = "Exclusive"
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    mig_profile: str | None = None
    """The MIG profile the device must be a partition of (``3g.20gb``); None: any device."""
    mig_profile_field: str = ""
    """Which config entry set ``mig_profile`` (``ResourceClaim config[0].opaque.parameters
    .migProfile``), for the error that names it."""

    def merged(self, other: GpuConfig, fields: frozenset[str]) -> GpuConfig:
        """``other`` applied on top of ``self``: fields ``other`` set win, env keys merge."""
        mig = "migProfile" in fields
        return GpuConfig(
            sharing=other.sharing if "sharing" in fields else self.sharing,
            env={**self.env, **other.env},
            mig_profile=other.mig_profile if mig else self.mig_profile,
            mig_profile_field=other.mig_profile_field if mig else self.mig_profile_field,
        )

    def check_mig_profile(self, device: str, profile: str | None) -> str | None:
        """Why ``device`` (a MIG partition of ``profile``, or no partition: None) does not
        satisfy ``migProfile``; None if it does or none was asked for."""
        if self.mig_profile is None or profile == self.mig_profile:
            return None
        got = f"a {profile} partition" if profile else "not a MIG partition"
        return (
            f"{self.mig_profile_field} asks for a MIG partition of profile "
            f"{self.mig_profile}, but the device allocated, {device}, is {got}"
        )

    def container_env(self) -> dict[str, str]:
        return {"DRA_GPU_SHARING_STRATEGY": self.sharing, **self.env}


def decode(parameters: object, where: str) -> tuple[GpuConfig, frozenset[str]]:
    """Decode one ``opaque.parameters`` object; returns the config and the fields it set."""
    obj = _mapping(parameters, where)
    _only(obj, {"apiVersion", "kind", "sharing", "env", "migProfile"}, where)
    if obj.get("apiVersion") != API_VERSION:
        raise InvalidConfig(
            f"{where}.apiVersion: {obj.get('apiVersion')!r} is not supported; use {API_VERSION!r}"
        )
    if obj.get("kind") != KIND:
        raise InvalidConfig(f"{where}.kind: {obj.get('kind')!r} is not supported; use {KIND!r}")
    fields: set[str] = set()
    sharing = "Exclusive"
    if "sharing" in obj:
        block = _mapping(obj["sharing"], f"{where}.sharing")
        _only(block, {"strategy"}, f"{where}.sharing")
        strategy = block.get("strategy", "Exclusive")
        if strategy not in SHARING_STRATEGIES:
            raise InvalidConfig(
                f"{where}.sharing.strategy: {strategy!r} is not one of "
                f"{', '.join(SHARING_STRATEGIES)}"
            )
        sharing = strategy
        fields.add("sharing")
    env: dict[str, str] = {}
    if "env" in obj:
        raw = _mapping(obj["env"], f"{where}.env")
        if len(raw) > _MAX_ENV:
            raise InvalidConfig(f"{where}.env: at most {_MAX_ENV} variables, got {len(raw)}")
        for key, value in raw.items():
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise InvalidConfig(f"{where}.env: {key!r} is not an environment variable name")
            if not isinstance(value, str):
                raise InvalidConfig(
                    f"{where}.env.{key}: expected a string, found {type(value).__name__}"
                )
            env[key] = value
        fields.add("env")
    mig_profile = None
    if "migProfile" in obj:
        mig_profile = obj["migProfile"]
        if not isinstance(mig_profile, str) or not _MIG_PROFILE.fullmatch(mig_profile):
            raise InvalidConfig(
                f"{where}.migProfile: {mig_profile!r} is not a MIG profile name "
                "(<compute slices>g.<memory>gb, e.g. 3g.20gb or 1g.5gb+me)"
            )
        fields.add("migProfile")
    config = GpuConfig(
        sharing=sharing,
        env=env,
        mig_profile=mig_profile,
        mig_profile_field=f"{where}.migProfile" if mig_profile else "",
    )
    return config, frozenset(fields)


def effective_configs(
    allocation_configs: Sequence[Mapping[str, Any]], driver: str, requests: Sequence[str]
) -> dict[str, GpuConfig]:
    """The configuration of each request (as named in the allocation results, e.g. ``gpu`` or
    ``gpu/large``) from ``status.allocation.devices.config``, in order: class configs first,
    then claim configs, later entries overriding earlier ones. Raises ``InvalidConfig``."""
    result = {request: GpuConfig() for request in requests}
    seen = {"FromClass": 0, "FromClaim": 0}
    for entry in allocation_configs:
        source = "FromClass" if entry.get("source") == "FromClass" else "FromClaim"
        index = seen[source]
        seen[source] += 1
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        owner = "DeviceClass" if source == "FromClass" else "ResourceClaim"
        where = f"{owner} config[{index}].opaque.parameters"
        config, fields = decode(opaque.get("parameters"), where)
        applies_to = entry.get("requests") or []
        for request in requests:
            if not applies_to or request in applies_to or request.split("/")[0] in applies_to:
                result[request] = result[request].merged(config, fields)
    return result


def check_entries(entries: object, driver: str, where: str) -> None:
    """Decode every entry of a ``config`` list (a claim's ``spec.devices.config``, a class's
    ``spec.config``) that is for ``driver``, as prepare will; ``where`` names the list
    (``spec.devices.config``). Raises ``InvalidConfig`` naming the entry and the field:
    what admission refuses is exactly what prepare would refuse."""
    if not isinstance(entries, list):
        return  # absent (or not a list: the API server's own schema refuses that)
    for index, entry in enumerate(entries):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if isinstance(opaque, dict) and opaque.get("driver") == driver:
            decode(opaque.get("parameters"), f"{where}[{index}].opaque.parameters")


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidConfig(f"{where}: expected an object, found {type(value).__name__}")
    return value


def _only(obj: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise InvalidConfig(
            f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})"
        )

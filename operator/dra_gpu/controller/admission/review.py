"""What admission says about one object: a refusal for a config prepare would refuse, a
warning for a claim nothing can satisfy now (pure).

Owns: the three kinds the webhook reviews (ResourceClaim, ResourceClaimTemplate, DeviceClass),
where each keeps its list of configs and its claim spec, the refusal's text (the object, then
``devices.opaque``'s: the entry, the field, the allowed values — the decoder prepare runs, so
what passes here never fails at prepare for a reason admission could see), which
explanations become warnings, and their text.
Must not: do any I/O; refuse for anything but a config (devices may be published later: a
claim nothing can satisfy now is a warning, never a refusal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from dra_gpu.controller.explain import Explanation, Reason
from dra_gpu.devices import opaque

Body = Mapping[str, Any]

WARNING_LIMIT: Final = 256
"""Characters per warning: the API server may cut longer ones (``truncateItemRunes``)."""

UNSATISFIABLE: Final = frozenset(
    {
        Reason.DEVICE_CLASS_MISSING,
        Reason.SELECTOR_INVALID,
        Reason.NO_DEVICES_PUBLISHED,
        Reason.SELECTOR_ERROR,
        Reason.NO_DEVICE_FITS,
        Reason.NOT_ENOUGH_DEVICES,
    }
)
"""Reasons no allocation changes: only a new class, a new device or a fixed selector does.
Devices held by other claims, taints, incomplete pools and nodes are passing states."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind the webhook reviews."""

    plural: str
    """The resource, and the webhook's path (``/resourceclaims``)."""
    name: str
    configs: tuple[str, ...]
    """Where its list of configs is."""
    claim: tuple[str, ...] | None
    """Where its claim spec is (the claim's own, or the one a template stamps out)."""


KINDS: Final = {
    kind.plural: kind
    for kind in (
        Kind("resourceclaims", "ResourceClaim", ("spec", "devices", "config"), ("spec",)),
        Kind(
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            ("spec", "spec", "devices", "config"),
            ("spec", "spec"),
        ),
        Kind("deviceclasses", "DeviceClass", ("spec", "config"), None),
    )
}


def refusal(kind: Kind, body: Body, driver: str) -> str | None:
    """Why ``body`` is refused (its opaque config for ``driver`` is one prepare would refuse),
    e.g. ``ResourceClaim ns/c: spec.devices.config[0].opaque.parameters.sharing.strategy:
    'MPS' is not one of Exclusive, TimeSlicing``; None if it is admitted."""
    try:
        opaque.check_entries(_dig(body, kind.configs), driver, ".".join(kind.configs))
    except opaque.InvalidConfig as exc:
        return f"{kind.name} {object_name(body)}: {exc}"
    return None


def claim_of(kind: Kind, body: Body) -> Body | None:
    """The claim ``body`` is or stamps out, as ``explain`` reads one (never allocated); None
    for a class."""
    if kind.claim is None:
        return None
    spec = _dig(body, kind.claim)
    meta = body.get("metadata") or {}
    return {
        "metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", "")},
        "spec": spec if isinstance(spec, Mapping) else {},
    }


def warning(kind: Kind, body: Body, explanation: Explanation) -> str | None:
    """The warning for a claim nothing can satisfy now (``UNSATISFIABLE``), one line of at
    most ``WARNING_LIMIT`` characters; None otherwise."""
    if explanation.reason not in UNSATISFIABLE:
        return None
    text = " ".join(f"{kind.name} {object_name(body)}: {explanation.message}".split())
    return text if len(text) <= WARNING_LIMIT else text[: WARNING_LIMIT - 1] + "…"


def object_name(body: Body) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object (``generateName`` with a
    dash when the API server has not named it yet)."""
    meta = body.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


def _dig(body: Body, path: tuple[str, ...]) -> object:
    value: object = body
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value

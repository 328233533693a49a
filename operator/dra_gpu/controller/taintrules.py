"""DeviceTaintRules as the scheduler applies them: each rule's taint on the devices it selects.

A ``DeviceTaintRule`` (``resource.k8s.io``, served as v1 from Kubernetes 1.37) "has the same
effect as if the taint was specified directly in the ResourceSlice by the DRA driver", so this
module does exactly that to the slices the controller reads: ``tainted_slices`` gives a pool's
slices with every matching rule's taint added to each selected device (copies; a slice no rule
selects is the same object). Everything downstream — the tallies' tainted devices, the
explanations' "is tainted ...", ``dra-gpu status`` — then sees rule taints as the scheduler does.

A rule's selector is ``deviceSelector`` {driver, pool, device}: all the fields set must match
(v1 has no others; the alpha's ``deviceClassName`` and CEL ``selectors`` select nothing here, so a
rule using them is not applied — a rule the controller does not understand never taints
anything in its reading). A rule without a selector matches no device (the API's rule).

A taint added from a rule carries two keys of ours beside the API's (``key``, ``value``,
``effect``, ``timeAdded``): ``rule`` (its name) and, when the rule has the annotation
``DESCRIPTION_ANNOTATION``, ``description`` — what ``explain.taints.device_taint_text`` shows
after the taint ("... (DeviceTaintRule x: the agent of ... has not been ready since ...)").
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Body = Mapping[str, Any]
DESCRIPTION_ANNOTATION = "resource.dra-gpu.io/description"
"""On a DeviceTaintRule: why its devices are tainted, in words (explanations show it)."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One DeviceTaintRule, read: what it selects and the taint it adds."""

    name: str
    driver: str | None
    pool: str | None
    device: str | None
    taint: Mapping[str, Any]
    """The taint as the API has it, plus ``rule`` and (when annotated) ``description``."""

    @classmethod
    def read(cls, body: Body) -> Rule | None:
        """None for a rule that selects nothing we can tell (no selector, a class or CEL
        selectors, no readable taint)."""
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        selector = spec.get("deviceSelector")
        taint = spec.get("taint")
        if not isinstance(selector, Mapping) or not isinstance(taint, Mapping):
            return None
        if selector.get("deviceClassName") or selector.get("selectors"):
            return None
        if not taint.get("key") or not taint.get("effect"):
            return None
        shown: dict[str, Any] = {
            k: taint[k] for k in ("key", "value", "effect", "timeAdded") if taint.get(k)
        }
        shown["rule"] = str(meta.get("name", ""))
        description = (meta.get("annotations") or {}).get(DESCRIPTION_ANNOTATION)
        if description:
            shown["description"] = str(description)
        return cls(
            str(meta.get("name", "")),
            _field(selector, "driver"),
            _field(selector, "pool"),
            _field(selector, "device"),
            shown,
        )

    def selects_pool(self, driver: str, pool: str) -> bool:
        return self.driver in (None, driver) and self.pool in (None, pool)


def _field(selector: Mapping[str, Any], name: str) -> str | None:
    value = selector.get(name)
    return str(value) if value else None


def tainted_slices(slices: Sequence[Body], rules: Iterable[Rule]) -> list[Body]:
    """``slices`` (of one pool, or any) with the taint of each rule that selects a device
    added to that device; slices and devices no rule selects are passed through as they are."""
    rules = list(rules)
    if not rules:
        return list(slices)
    out: list[Body] = []
    for body in slices:
        spec = body.get("spec") or {}
        driver, pool = str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))
        here = [r for r in rules if r.selects_pool(driver, pool)]
        devices = spec.get("devices")
        if not here or not isinstance(devices, list):
            out.append(body)
            continue
        changed = False
        patched: list[Any] = []
        for device in devices:
            if not isinstance(device, Mapping):
                patched.append(device)
                continue
            name = device.get("name")
            added = [dict(r.taint) for r in here if r.device in (None, name)]
            if added:
                changed = True
                device = {**device, "taints": [*(device.get("taints") or []), *added]}
            patched.append(device)
        out.append({**body, "spec": {**spec, "devices": patched}} if changed else body)
    return out


def read_rules(bodies: Iterable[Body]) -> list[Rule]:
    """The rules of ``bodies`` that select something we can tell, by name."""
    found = (Rule.read(b) for b in bodies)
    return sorted((r for r in found if r is not None), key=lambda r: r.name)

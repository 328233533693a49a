"""What a ResourceClaim asks of this node's agent (pure: dicts in, values out).

The kubelet sends only namespace, name and UID; the claim object says which devices the
scheduler allocated. Only results whose ``driver`` is ours concern us, and they must come from
this node's pool: the agent is the last defence against handing out a device that was not
allocated, so anything unexpected is a per-claim error, never a guess.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, NewType

ClaimUID = NewType("ClaimUID", str)


class ClaimError(Exception):
    """This claim cannot be prepared as it stands; the message is what the pod's event shows."""


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: ClaimUID

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class AllocatedDevice:
    """One of our devices in a claim's allocation."""

    request: str
    """As in the allocation result: ``gpu`` or, for a ``firstAvailable`` request, ``gpu/large``."""
    pool: str
    device: str

    @property
    def base_request(self) -> str:
        """The top-level request name, which containers reference (never ``gpu/large``)."""
        return self.request.split("/", 1)[0]


def check_request(ref: ClaimRef) -> None:
    """The kubelet always sends all three; anything else is a malformed request, not a claim."""
    missing = [field for field in ("namespace", "name", "uid") if not getattr(ref, field)]
    if missing:
        raise ClaimError(
            f"claim {ref.namespace!r}/{ref.name!r} (uid {ref.uid!r}): the request lacks "
            f"{', '.join(missing)}"
        )


def check_identity(claim: Mapping[str, Any], ref: ClaimRef) -> None:
    uid = claim.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref} has UID {uid}, not {ref.uid}: it was deleted and re-created"
        )


def allocated_devices(
    claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str
) -> list[AllocatedDevice]:
    """Our driver's devices allocated to the claim, all from ``pool``. Raises ``ClaimError``."""
    allocation = claim.get("status", {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    ours = [
        r for r in allocation.get("devices", {}).get("results", []) if r.get("driver") == driver
    ]
    foreign = [f"{r.get('pool')}/{r.get('device')}" for r in ours if r.get("pool") != pool]
    if foreign:
        raise ClaimError(
            f"ResourceClaim {ref}: devices {', '.join(foreign)} are not in pool {pool} of this node"
        )
    return [AllocatedDevice(r["request"], r["pool"], r["device"]) for r in ours]


def allocation_configs(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    configs: Sequence[Mapping[str, Any]] = (
        claim.get("status", {}).get("allocation", {}).get("devices", {}).get("config", [])
    )
    return configs


def device_status(
    driver: str, pool: str, device: str, data: Mapping[str, Any], now: datetime.datetime
) -> dict[str, Any]:
    """One ``status.devices`` entry of ours: the device is configured and ready to use."""
    return {
        "driver": driver,
        "pool": pool,
        "device": device,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared on the node; CDI spec written",
                "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
        "data": dict(data),
    }

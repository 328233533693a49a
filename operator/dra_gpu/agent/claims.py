"""What a ResourceClaim asks of this node's agent (pure: dicts in, values out).

The kubelet sends only namespace, name and UID; the claim object says which devices the
scheduler allocated. Only results whose ``driver`` is ours concern us, and they must come from
this node's pool: the agent is the last defence against handing out a device that was not
allocated, so anything unexpected is a per-claim error, never a guess.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.devices import edits, model
from dra_gpu.resource import bodies, names


class ClaimError(Exception):
    """This claim cannot be prepared as it stands; the message is what the pod's event shows."""


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: bodies.ClaimUID

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def log_fields(self) -> dict[str, dict[str, str]]:
        """``extra=`` of a log call about this claim: ``--log-format json`` writes it as the
        record's ``claim`` object (``namespace``, ``name``, ``uid``), as klog's ``KObj`` names
        an object, so a log pipeline finds every line of one claim."""
        return {"claim": {"namespace": self.namespace, "name": self.name, "uid": self.uid}}

    @property
    def path(self) -> str:
        """The claim's API path (only for a ref that passed ``check_request``)."""
        return f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims/{self.name}"


@dataclasses.dataclass(frozen=True)
class AllocatedDevice:
    """One of our devices in a claim's allocation."""

    request: str
    """As in the allocation result: ``gpu`` or, for a ``firstAvailable`` request, ``gpu/large``."""
    pool: str
    device: str
    admin_access: bool = False
    """The result's ``adminAccess``: the device is shared with whoever else holds it (a
    monitoring claim), so the agent must not configure it for this claim alone."""
    share_id: str | None = None
    """The result's ``shareID``: this claim's share of a device several claims hold at once
    (``allowMultipleAllocations``); None for a device allocated whole."""
    consumed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The result's ``consumedCapacity``: how much of the device's capacity the share takes
    (``{"memory": "8Gi"}``)."""

    @property
    def base_request(self) -> str:
        """The top-level request name, which containers reference (never ``gpu/large``)."""
        return self.request.split("/", 1)[0]

    @property
    def key(self) -> str:
        """What names this device within the claim (its CDI device, its record): the device,
        or for a share, the device and the share ID, as one claim may hold two shares of one
        device."""
        return self.device if self.share_id is None else f"{self.device}-{self.share_id}"


ADMIN_ACCESS_ENV = "DRA_GPU_ADMIN_ACCESS"
"""Set to ``true`` in the container's environment for a device allocated with admin access:
the container sees the device as any claim would (the backend's variables), and this says it
is a monitoring view of a device that others may be using at the same time."""


def admin_access_env(device: AllocatedDevice) -> dict[str, str]:
    return {ADMIN_ACCESS_ENV: "true"} if device.admin_access else {}


SHARING_ENV = "DRA_GPU_SHARING_STRATEGY"
MEMORY_LIMIT_ENV = "DRA_GPU_MEMORY_LIMIT"
SHARE_ID_ENV = "DRA_GPU_SHARE_ID"
MPS_MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def share_mode_env(device: AllocatedDevice, sharing: model.Sharing | None) -> dict[str, str]:
    """A share's own variable: ``DRA_GPU_SHARING_STRATEGY=<mode>`` (in place of the opaque
    config's ``Exclusive``). Nothing for a device allocated whole."""
    if sharing is None or device.share_id is None:
        return {}
    return {SHARING_ENV: sharing.mode}


def share_env(devices: Sequence[tuple[AllocatedDevice, model.Device]]) -> dict[str, str]:
    """What a container given a claim's shares is told, once for the claim (CDI merges
    variables by key, so one per share would keep only the last share's):

    - ``DRA_GPU_MEMORY_LIMIT``: each share's memory (``consumedCapacity``, else the policy's
      default), ``DRA_GPU_SHARE_ID``: each share's ID; comma-separated, in the claim's order
      of its shares (one share: one value, ``12Gi``);
    - under MPS, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<ordinal>=<MiB>M,...``: per GPU, by its
      place in the claim's ``NVIDIA_VISIBLE_DEVICES`` (``devices.edits.visible_uuids``), the
      sum of the claim's shares of it; and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, the lowest
      ``activeThreadPercentage`` of the GPUs (the variable is one per client process).

    ``devices``: all of the claim's devices, in allocation order. Empty without shares."""
    shares = [
        (alloc, device, device.sharing)
        for alloc, device in devices
        if alloc.share_id is not None and device.sharing is not None
    ]
    if not shares:
        return {}
    memory = [alloc.consumed.get("memory", sharing.memory.default) for alloc, _, sharing in shares]
    env = {
        MEMORY_LIMIT_ENV: ",".join(memory),
        SHARE_ID_ENV: ",".join(alloc.share_id or "" for alloc, _, _ in shares),
    }
    ordinals = {uuid: k for k, uuid in enumerate(edits.visible_uuids(d for _, d in devices))}
    pinned: dict[int, int] = {}
    threads: list[int] = []
    for (_, device, sharing), share in zip(shares, memory, strict=True):
        if sharing.mode != "MPS":
            continue
        ordinal = ordinals[device.uuid]
        pinned[ordinal] = pinned.get(ordinal, 0) + int(model.parse_quantity(share)) // 2**20
        if sharing.active_thread_percentage is not None:
            threads.append(sharing.active_thread_percentage)
    if pinned:
        env[MPS_MEMORY_LIMIT_ENV] = ",".join(f"{k}={mib}M" for k, mib in sorted(pinned.items()))
    if threads:
        env[MPS_THREADS_ENV] = str(min(threads))
    return env


_UID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")


def check_request(ref: ClaimRef) -> None:
    """The kubelet always sends all three, as the API server names them; anything else is a
    malformed request, not a claim (and must never become part of a URL or a file name)."""
    missing = [field for field in ("namespace", "name", "uid") if not getattr(ref, field)]
    checks: tuple[tuple[str, Callable[[str], bool], str], ...] = (
        ("namespace", names.is_dns_label, "DNS label"),
        ("name", lambda name: len(name) > 253 or names.is_dns_subdomain(name), "DNS subdomain"),
        ("uid", lambda uid: _UID.fullmatch(uid) is not None, "Kubernetes UID"),
    )
    wrong = [
        f"{field} is not a {kind}"
        for field, check, kind in checks
        if getattr(ref, field) and not check(getattr(ref, field))
    ]
    if len(ref.name) > 253:
        wrong.append("name is longer than 253 characters")
    if missing or wrong:
        problems = [f"the request lacks {', '.join(missing)}"] if missing else []
        raise ClaimError(
            f"claim {ref.namespace!r}/{ref.name!r} (uid {ref.uid!r}): "
            + "; ".join(problems + wrong)
        )


def check_identity(claim: Mapping[str, Any], ref: ClaimRef) -> None:
    uid = bodies.metadata(claim).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref} has UID {uid}, not {ref.uid}: it was deleted and re-created"
        )


def allocated_devices(
    claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str
) -> list[AllocatedDevice]:
    """Our driver's devices allocated to the claim, all from ``pool``. Raises ``ClaimError``."""
    if bodies.allocation(claim) is None:
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    ours = [r for r in bodies.allocation_results(claim) if r.get("driver") == driver]
    foreign = [f"{r.get('pool')}/{r.get('device')}" for r in ours if r.get("pool") != pool]
    if foreign:
        raise ClaimError(
            f"ResourceClaim {ref}: devices {', '.join(foreign)} are not in pool {pool} of this node"
        )
    return [
        AllocatedDevice(
            r["request"],
            r["pool"],
            r["device"],
            r.get("adminAccess") is True,
            share_id=r.get("shareID") or None,
            consumed={k: str(v) for k, v in (r.get("consumedCapacity") or {}).items()},
        )
        for r in ours
    ]


def stale_reason(
    claim: Mapping[str, Any] | None,
    uid: str,
    prepared: Iterable[tuple[str, str]],
    driver: str,
    pool: str,
) -> str | None:
    """Why a recorded claim no longer needs the (pool, device) pairs prepared for it, or None
    if it still does. The API server keeps a claim, and its allocation, while a pod has it
    reserved, so a stale record is never in use."""
    if claim is None:
        return "it no longer exists"
    if bodies.metadata(claim).get("uid") != uid:
        return "it was deleted and re-created"
    if bodies.allocation(claim) is None:
        return "it is no longer allocated"
    ours = {
        (r.get("pool"), r.get("device"))
        for r in bodies.allocation_results(claim)
        if r.get("driver") == driver and r.get("pool") == pool
    }
    if set(prepared) != ours:
        return f"it is now allocated other devices of node {pool} than were prepared"
    return None


def device_status(
    driver: str,
    pool: str,
    device: str,
    data: Mapping[str, Any],
    now: datetime.datetime,
    health: Mapping[str, Any] | None = None,
    share_id: str | None = None,
) -> dict[str, Any]:
    """One ``status.devices`` entry of ours: the device is configured and ready to use, and
    (once its health is known) whether it is healthy (``health_condition``). A share's entry
    carries its ``shareID`` (part of the list's key: driver, pool, device, shareID)."""
    entry: dict[str, Any] = {
        "driver": driver,
        "pool": pool,
        "device": device,
        **({"shareID": share_id} if share_id else {}),
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared on the node; CDI spec written",
                "lastTransitionTime": _rfc3339(now),
            }
        ],
        "data": dict(data),
    }
    return with_health(entry, health) if health is not None else entry


HEALTHY = "Healthy"
"""The condition type of a device's health in ``status.devices``."""


def health_condition(
    healthy: bool, reason: str, message: str, since: datetime.datetime
) -> dict[str, Any]:
    """The ``Healthy`` condition of a device: False with the fault while it is tainted."""
    return {
        "type": HEALTHY,
        "status": "True" if healthy else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _rfc3339(since),
    }


def with_health(entry: Mapping[str, Any], condition: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` with its ``Healthy`` condition replaced by ``condition``."""
    kept = [c for c in entry.get("conditions", []) if c.get("type") != HEALTHY]
    return {**entry, "conditions": [*kept, dict(condition)]}


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

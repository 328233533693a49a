"""What the driver reads of a ResourceClaim body, typed, and the walks to it (pure: no I/O).

The API's JSON arrives as plain dicts (``kube.Body``). The TypedDicts here name the fields the
agent and the controller read of a claim (``resource.k8s.io/v1``): its metadata, its allocation
(``status.allocation.devices``: results and configs), who has it reserved and the devices'
status entries. A field the API may omit is optional (``total=False``); a body is never checked
against them at run time, so a reader still copes with what is missing or null.

The accessors are the one way to walk to those fields: ``allocation`` (None while the claim is
not allocated), ``allocation_results``, ``allocation_configs``, ``reserved``,
``device_statuses``, ``claim_uid`` and ``key``. Each takes any claim body (a dict as decoded,
or a ``ResourceClaim``) and tolerates absent and null fields on the way.

Owns: ``ClaimUID``, the type of a claim's UID wherever it is carried.
Must not: validate, decide (whose devices, which pool) or reach any other part of the package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NewType, Required, TypedDict

ClaimUID = NewType("ClaimUID", str)
"""A ResourceClaim's ``metadata.uid``: what tells a claim from one re-created under its name."""


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str


class AllocationResult(TypedDict, total=False):
    """One ``status.allocation.devices.results[]`` entry: a device allocated for a request."""

    request: Required[str]
    """The request's name, or ``<request>/<subrequest>`` for a ``firstAvailable`` request."""
    driver: Required[str]
    pool: Required[str]
    device: Required[str]
    adminAccess: bool
    shareID: str
    """Set where the device is shared by several claims (``allowMultipleAllocations``)."""
    consumedCapacity: dict[str, str]
    """Capacity name -> quantity that this share takes of the device."""


class OpaqueDeviceConfiguration(TypedDict, total=False):
    driver: Required[str]
    parameters: Any
    """The driver's own object, decoded as it came (``devices.opaque`` checks it)."""


class DeviceAllocationConfiguration(TypedDict, total=False):
    """One ``status.allocation.devices.config[]`` entry, copied from the class or the claim."""

    source: Required[str]
    """``FromClass`` or ``FromClaim``."""
    requests: list[str]
    """The requests it applies to; all of them when absent."""
    opaque: OpaqueDeviceConfiguration


class DeviceAllocation(TypedDict, total=False):
    results: list[AllocationResult]
    config: list[DeviceAllocationConfiguration]


class Allocation(TypedDict, total=False):
    """``status.allocation``: present once the scheduler allocated the claim."""

    devices: DeviceAllocation
    nodeSelector: dict[str, Any]
    allocationTimestamp: str


class ConsumerReference(TypedDict, total=False):
    """One ``status.reservedFor[]`` entry: a pod (as a rule) that uses the claim."""

    apiGroup: str
    resource: Required[str]
    name: Required[str]
    uid: Required[str]


class AllocatedDeviceStatus(TypedDict, total=False):
    """One ``status.devices[]`` entry, written by the driver whose device it is."""

    driver: Required[str]
    pool: Required[str]
    device: Required[str]
    shareID: str
    conditions: list[dict[str, Any]]
    data: Any
    networkData: dict[str, Any]


class ResourceClaimStatus(TypedDict, total=False):
    allocation: Allocation
    reservedFor: list[ConsumerReference]
    devices: list[AllocatedDeviceStatus]


class ResourceClaim(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Required[ObjectMeta]
    spec: dict[str, Any]
    status: ResourceClaimStatus


def allocation(claim: Mapping[str, Any]) -> Allocation | None:
    """``status.allocation``, or None while the claim is not allocated (absent, null or empty)."""
    status = claim.get("status") or {}
    found: Allocation | None = status.get("allocation") or None
    return found


def allocation_results(claim: Mapping[str, Any]) -> Sequence[AllocationResult]:
    """Every result of the claim's allocation (every driver's), in the API's order; none while
    it is not allocated. The body's own list, not a copy."""
    found = allocation(claim)
    results: Sequence[AllocationResult] = (
        (found.get("devices") or {}).get("results") or [] if found else []
    )
    return results


def allocation_configs(claim: Mapping[str, Any]) -> Sequence[DeviceAllocationConfiguration]:
    """The configs of the claim's allocation (every driver's, class ones first as the
    scheduler copies them); none while it is not allocated."""
    found = allocation(claim)
    configs: Sequence[DeviceAllocationConfiguration] = (
        (found.get("devices") or {}).get("config") or [] if found else []
    )
    return configs


def reserved(claim: Mapping[str, Any]) -> bool:
    """Whether some consumer (a pod) has the claim reserved (``status.reservedFor``)."""
    return bool((claim.get("status") or {}).get("reservedFor"))


def device_statuses(claim: Mapping[str, Any]) -> Sequence[AllocatedDeviceStatus]:
    """The claim's ``status.devices`` entries (every driver's)."""
    entries: Sequence[AllocatedDeviceStatus] = (claim.get("status") or {}).get("devices") or []
    return entries


def metadata(body: Mapping[str, Any]) -> ObjectMeta:
    """The body's ``metadata``; empty where it has none."""
    meta: ObjectMeta | None = body.get("metadata")
    return meta or {}


def claim_uid(claim: Mapping[str, Any]) -> ClaimUID:
    """The claim's UID; empty where the body has none."""
    return ClaimUID(str(metadata(claim).get("uid") or ""))


def key(body: Mapping[str, Any]) -> str:
    """``namespace/name`` of a namespaced object, ``name`` of a cluster-scoped one: how the
    controller keys what it keeps (the name must be there)."""
    meta = metadata(body)
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else meta["name"]

"""What the claims hold, read from their allocations (pure: no I/O, no metrics).

Owns: which claims hold each published device, and how, as the scheduler counts it — admin
access (DRAAdminAccess) holds nothing; a result with a ``shareID`` is one share of a shared
device, its ``consumedCapacity`` adding up; any other result holds the device alone. In two
forms, like ``published``: functions over a whole list of claims (``holders``, ``holds``,
``allocated``) and ``HolderIndex``, which the controller's view keeps up to date one claim at a
time. Devices are named by ``published.DeviceKey``.

Must not: read slices (``published``), or decide what a share leaves free (``partitions``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, NamedTuple

from dra_gpu.controller.published import Amount, Body, DeviceKey, amount, result_key
from dra_gpu.resource import bodies


def holders(
    claims: Iterable[Body], exclude: Body | None = None
) -> dict[DeviceKey, tuple[str, ...]]:
    """Allocated device -> ``ns/name`` of the claims holding it, ``exclude`` (a claim looking
    at its own chances) left out."""
    this = bodies.metadata(exclude or {})
    found: dict[DeviceKey, set[str]] = {}
    for claim in claims:
        meta = bodies.metadata(claim)
        if exclude is not None and (
            (meta.get("namespace"), meta.get("name")) == (this.get("namespace"), this.get("name"))
            or (this.get("uid") and meta.get("uid") == this.get("uid"))
        ):
            continue
        for result in bodies.allocation_results(claim):
            # Admin access (DRAAdminAccess) does not take the device from anyone.
            if not result.get("adminAccess"):
                found.setdefault(result_key(result), set()).add(owner(claim))
    return {key: tuple(sorted(owners)) for key, owners in found.items()}


def held_devices(claim: Body) -> tuple[DeviceKey, ...]:
    """The devices ``claim``'s allocation takes from others (admin access takes none)."""
    return tuple(
        result_key(r) for r in bodies.allocation_results(claim) if not r.get("adminAccess")
    )


def owner(claim: Body) -> str:
    """``ns/name`` of a claim, as holders name it (``/name`` for a body without a namespace)."""
    meta = bodies.metadata(claim)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class Hold(NamedTuple):
    """What one claim's allocation holds of one device."""

    owner: str
    """``ns/name`` of the claim."""
    uid: bodies.ClaimUID
    exclusive: bool
    """A result without a ``shareID`` names it: the device is the claim's alone."""
    shares: int = 0
    """Results with a ``shareID`` (consumable capacity): shares of a shared device."""
    consumed: tuple[tuple[str, Amount], ...] = ()
    """Those shares' ``consumedCapacity``, summed per capacity, sorted by name."""


def holds(claim: Body) -> dict[DeviceKey, Hold]:
    """What ``claim``'s allocation holds, per device, as the scheduler counts it: admin access
    holds nothing; a result with a ``shareID`` is a share whose ``consumedCapacity`` adds up;
    any other result holds the device alone."""
    parts: dict[DeviceKey, tuple[bool, int, dict[str, Amount]]] = {}
    for result in bodies.allocation_results(claim):
        if result.get("adminAccess"):
            continue
        key = result_key(result)
        exclusive, shares, consumed = parts.get(key, (False, 0, {}))
        if result.get("shareID"):
            shares += 1
            raw = result.get("consumedCapacity")
            for name, value in raw.items() if isinstance(raw, Mapping) else ():
                quantity = amount(value)
                if quantity is not None:
                    consumed[str(name)] = consumed.get(str(name), 0) + quantity
        else:
            exclusive = True
        parts[key] = (exclusive, shares, consumed)
    if not parts:
        return {}
    who, uid = owner(claim), bodies.claim_uid(claim)
    return {
        key: Hold(who, uid, exclusive, shares, tuple(sorted(consumed.items())))
        for key, (exclusive, shares, consumed) in parts.items()
    }


class HolderIndex:
    """``holders`` kept up to date one claim at a time: device -> the claims that hold it, and
    how (``Hold``: alone, or shares with the capacity they consumed).

    Each claim is filed under a token of the caller's (the view's key, a list position), so
    two bodies with one name, as a caller's list may hold, stay two holders, as in ``holders``.
    A ``Hold`` is kept as a plain tuple: the garbage collector stops tracking a tuple of plain
    values, and a cluster has thousands of claims (a full collection scans every object tracked).
    """

    def __init__(self) -> None:
        self._entries: dict[DeviceKey, dict[Hashable, tuple[Any, ...]]] = {}
        self._devices: dict[Hashable, tuple[DeviceKey, ...]] = {}
        self._names: collections.Counter[str] = collections.Counter()
        self._uids: collections.Counter[bodies.ClaimUID] = collections.Counter()
        self._owners: dict[DeviceKey, tuple[str, ...]] = {}
        self._taken: dict[DeviceKey, int] = {}
        self._consumed: dict[DeviceKey, Mapping[str, Amount]] = {}

    @classmethod
    def of(cls, claims: Iterable[Body]) -> HolderIndex:
        index = cls()
        for position, claim in enumerate(claims):
            index.put(position, claim)
        return index

    def put(self, token: Hashable, claim: Body | None) -> set[DeviceKey]:
        """File ``claim`` under ``token`` (None: remove it); returns the devices whose holders
        may have changed."""
        changed: set[DeviceKey] = set()
        for key in self._devices.pop(token, ()):
            hold = Hold._make(self._entries[key].pop(token))
            if not self._entries[key]:
                del self._entries[key]
            self._forget(key)
            self._names[hold.owner] -= 1
            self._uids[hold.uid] -= 1
            if hold.exclusive:
                self._taken[key] -= 1
                if not self._taken[key]:
                    del self._taken[key]
            changed.add(key)
        if claim is None:
            return changed
        found = holds(claim)
        if not found:
            return changed
        self._devices[token] = tuple(found)
        for key, hold in found.items():
            self._entries.setdefault(key, {})[token] = tuple(hold)
            self._forget(key)
            self._names[hold.owner] += 1
            self._uids[hold.uid] += 1
            if hold.exclusive:
                self._taken[key] = self._taken.get(key, 0) + 1
            changed.add(key)
        return changed

    def _forget(self, key: DeviceKey) -> None:
        self._owners.pop(key, None)
        self._consumed.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def membership(self) -> Callable[[object], bool]:
        """``key in index``, as a function that is quick to call in a loop."""
        return self._entries.__contains__

    def taken(self) -> Callable[[object], bool]:
        """Whether a claim holds the device alone (a result without a ``shareID``): what the
        scheduler reads as "in use"; a shared device's shares do not take it."""
        return self._taken.__contains__

    def __len__(self) -> int:
        return len(self._entries)

    def owners(self, key: DeviceKey) -> tuple[str, ...]:
        """``ns/name`` of the claims holding ``key``, sorted; empty when free."""
        found = self._owners.get(key)
        if found is None:
            entries = self._entries.get(key)
            if not entries:
                return ()
            found = self._owners[key] = tuple(sorted({h[0] for h in entries.values()}))  # owner
        return found

    def holds_of(self, key: DeviceKey) -> Iterable[Hold]:
        """How each claim holding ``key`` holds it."""
        return map(Hold._make, (self._entries.get(key) or {}).values())

    def consumed(self, key: DeviceKey) -> Mapping[str, Amount]:
        """Capacity the shares of ``key`` consumed, per capacity name."""
        found = self._consumed.get(key)
        if found is None:
            found = self._consumed[key] = add_consumed(self.holds_of(key))
        return found

    def involves(self, name: str, uid: bodies.ClaimUID) -> bool:
        """Whether the claim ``name`` (``ns/name``) or one with ``uid`` holds anything."""
        return self._names[name] > 0 or bool(uid and self._uids[uid] > 0)

    def owners_excluding(self, key: DeviceKey, name: str, uid: bodies.ClaimUID) -> tuple[str, ...]:
        """``owners`` without the claim looking at its own chances, as ``holders(exclude=)``."""
        return tuple(
            sorted(
                {
                    h.owner
                    for h in self.holds_of(key)
                    if h.owner != name and not (uid and h.uid == uid)
                }
            )
        )


def add_consumed(found: Iterable[Hold]) -> dict[str, Amount]:
    """The ``consumedCapacity`` of several holds, summed per capacity name."""
    total: dict[str, Amount] = {}
    for hold in found:
        for name, value in hold.consumed:
            total[name] = total.get(name, 0) + value
    return total


def allocated(claims: Iterable[Body]) -> dict[DeviceKey, str]:
    """Allocated devices and a claim (``ns/name``) holding each."""
    return {key: owners[0] for key, owners in holders(claims).items()}


def claim_state(claim: Body) -> str:
    if bodies.allocation(claim) is None:
        return "pending"
    return "reserved" if bodies.reserved(claim) else "allocated"

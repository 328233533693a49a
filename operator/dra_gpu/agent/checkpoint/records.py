"""The record of the claims this agent prepared on this node, as the agent holds it in memory.

Owns the record types and the changes that turn one checkpoint into the next: a claim recorded
(``Put``) or forgotten (``Delete``). They are immutable: ``with_claim`` / ``without_claim``
return new checkpoints. Must not know the file format (``v1``, ``journal``) or touch a file
(``storage``), nor prepare anything or talk to the API.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping, Sequence

from dra_gpu.agent import cdi
from dra_gpu.agent.claims import AllocatedDevice
from dra_gpu.devices import model


@dataclasses.dataclass(frozen=True)
class RecordedDevice:
    """One device of a prepared claim, as recorded: what was returned to the kubelet, and what
    unprepare and a reboot need of it."""

    request_names: tuple[str, ...]
    """Top-level request names this device serves (``"gpu"``, never ``"gpu/large"``)."""
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    """In the order the runtime applies them: ours last (one, or after the toolkit's own device
    on a node set up for CDI only: ``agent.toolkit``). A record keeps the IDs it was prepared
    with; an older agent reads and answers them as they are."""
    mig_instance: model.MigInstance | None = None
    """The MIG instance created for this device (a MIG partition), destroyed at unprepare."""
    share_id: str | None = None
    """The allocation's share of a device several claims hold at once; None: whole."""


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    """A claim this agent prepared, with everything unprepare and a reboot need."""

    uid: str
    namespace: str
    name: str
    devices: tuple[RecordedDevice, ...]
    cdi_spec: cdi.CdiSpec | None = None
    """The CDI spec written for this claim, kept whole (treat as read-only). Writing it again
    after a reboot makes the recorded ``cdi_device_ids`` resolve again, even if the driver's
    configuration changed in between; None when no spec was needed."""

    def mig_instances(self) -> list[model.MigInstance]:
        return [d.mig_instance for d in self.devices if d.mig_instance is not None]

    def with_mig_instance(
        self,
        device: str,
        instance: model.MigInstance,
        device_nodes: Sequence[cdi.DeviceNode] | None = None,
    ) -> PreparedClaim:
        """This claim with ``instance`` as the MIG instance of ``device``: one created again
        after a reboot, whose MIG device may have another UUID and other GPU and compute
        instance ids. The spec follows (``cdi.with_device_replaced``): the environment values
        that named the old UUID for that device name the new one; ``device_nodes``, when given,
        replace that device's ``deviceNodes`` (the new instance's capability nodes)."""
        old = next(d.mig_instance for d in self.devices if d.device == device)
        devices = tuple(
            dataclasses.replace(d, mig_instance=instance) if d.device == device else d
            for d in self.devices
        )
        if self.cdi_spec is None:
            return dataclasses.replace(self, devices=devices)
        spec = cdi.with_device_replaced(
            self.cdi_spec,
            self.uid,
            device,
            old_uuid=old.uuid if old is not None else "",
            new_uuid=instance.uuid,
            device_nodes=device_nodes,
        )
        return dataclasses.replace(self, devices=devices, cdi_spec=spec)


def record_claim(
    driver: str,
    uid: str,
    namespace: str,
    name: str,
    allocated: Iterable[AllocatedDevice],
    spec: cdi.CdiSpec | None,
    mig_instances: Mapping[str, model.MigInstance] | None = None,
    other_ids: Mapping[str, Sequence[str]] | None = None,
) -> PreparedClaim:
    """The record of a claim prepared with ``spec``: one entry for each allocated device that
    the spec holds, with the CDI device ID that resolves to it there (after ``other_ids``, by
    device name: the toolkit's own device, ``agent.toolkit``), and the MIG instance created
    for it (``mig_instances``, by device name) if any.

    Prepare and the rebuild of a corrupt checkpoint (from the API server and the CDI directory)
    both build the record here, so a change of the record is made once."""
    in_spec = {d["name"] for d in spec["devices"]} if spec is not None else set()
    instances = mig_instances or {}
    others = other_ids or {}
    devices = tuple(
        RecordedDevice(
            request_names=(a.base_request,),
            pool=a.pool,
            device=a.device,
            cdi_device_ids=(*others.get(a.device, ()), cdi.cdi_device_id(driver, uid, a.key)),
            mig_instance=instances.get(a.device),
            share_id=a.share_id,
        )
        for a in allocated
        if cdi.cdi_device_name(uid, a.key) in in_spec
    )
    return PreparedClaim(uid, namespace, name, devices, spec)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Every claim prepared on this node, by claim UID."""

    claims: Mapping[str, PreparedClaim] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for uid, claim in self.claims.items():
            if uid != claim.uid:
                raise ValueError(f"claim {claim.uid} is filed under UID {uid}")
        # A read-only view of a private copy: "immutable" must hold for the mapping too.
        object.__setattr__(self, "claims", types.MappingProxyType(dict(self.claims)))

    def with_claim(self, claim: PreparedClaim) -> Checkpoint:
        """A checkpoint that also records ``claim`` (replacing an entry with its UID)."""
        return Checkpoint({**self.claims, claim.uid: claim})

    def without_claim(self, uid: str) -> Checkpoint:
        """A checkpoint without claim ``uid``; the same content if it was not recorded."""
        return Checkpoint({k: v for k, v in self.claims.items() if k != uid})


@dataclasses.dataclass(frozen=True)
class Put:
    """A change: record ``claim`` (replacing an entry with its UID)."""

    claim: PreparedClaim

    def apply(self, checkpoint: Checkpoint) -> Checkpoint:
        return checkpoint.with_claim(self.claim)


@dataclasses.dataclass(frozen=True)
class Delete:
    """A change: forget claim ``uid`` (nothing if it was not recorded)."""

    uid: str

    def apply(self, checkpoint: Checkpoint) -> Checkpoint:
        return checkpoint.without_claim(self.uid)


Change = Put | Delete


def changes_between(base: Checkpoint, theirs: Checkpoint) -> list[Change]:
    """What turns ``base`` into ``theirs``: a ``Put`` for each claim added or changed, a
    ``Delete`` for each claim gone (in UID order)."""
    changes: list[Change] = [
        Put(claim) for uid, claim in sorted(theirs.claims.items()) if base.claims.get(uid) != claim
    ]
    changes.extend(Delete(uid) for uid in sorted(base.claims.keys() - theirs.claims.keys()))
    return changes


def merged(ours: Checkpoint, base: Checkpoint, theirs: Checkpoint) -> Checkpoint:
    """``ours`` with what another writer changed from ``base`` (the checkpoint it last knew)
    to ``theirs`` (what it wrote): a three-way merge, for a writer that never reads what we
    write (an agent of a release before the serialize lock). A claim both changed is theirs:
    the kubelet calls one agent at a time for a claim."""
    result = ours
    for change in changes_between(base, theirs):
        result = change.apply(result)
    return result

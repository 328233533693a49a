"""Prepared claims on this node: prepare, unprepare, and recovery at start.

Prepare reads the claim (from the watch's copy, ``claimcache``, when it may be used; else with a
GET), takes our driver's devices from its allocation, applies the opaque
configuration (class configs, then claim configs), writes the claim's CDI spec and then records
the claim in the checkpoint before answering; unprepare undoes both. Both are idempotent: a
recorded claim is answered from the checkpoint (its spec written again if a reboot emptied the
CDI directory), an unknown one unprepares as a success.

Crash consistency: the checkpoint is the record, and the kubelet gets its answer only after the
claim's entry is on stable storage (fsync'd file, renamed, directory fsync'd) and its CDI spec
is in place. The spec is written atomically (readers see all of it or none) but not fsync'd:
it lives on a tmpfs that a reboot empties anyway, and ``recover`` at start makes the CDI
directory agree with the checkpoint whatever a crash or a power cut left there: specs without
an entry are leaks (the kubelet never got an answer and will ask again) and are deleted;
entries whose spec is missing or not what was recorded get it written again. So a prepare
waits for one durability barrier, not two, and an unprepare likewise (spec deleted, then the
entry removed durably). That barrier is an append to the checkpoint's journal and one
``fdatasync`` (``checkpoint.Journal``), not a new snapshot. Checkpoint writes are
group-committed: claims prepared at the same time share one append, and their specs are
written by the same thread just before it, instead of each queueing for its own.

A second agent of the driver on the node (an old pod during an upgrade, two releases) shares
the host directories. Only the agent the kubelet calls may write them: one that finds its
sockets taken over is ``retire``d (no writes at all, not even the snapshot at stop), and
``resume``s from what the other left on disk if its sockets come back.

MIG instances (a backend with ``model.MigInstances``): prepare of a MIG partition creates its
GPU and compute instance before the spec and the checkpoint entry, and unprepare destroys it
before the entry goes, so a recorded claim always has its instance. Before creating, prepare
writes the placements it is about to create to an intents file (on the CDI directory's tmpfs),
so a crash between creation and the checkpoint write leaves an instance that nothing records
but that is known to be ours: ``recover`` at start destroys it (before the kubelet's retry
prepares the claim again, creating it anew). Instances neither recorded nor intended are
someone else's (the GPU Operator's mig-manager): left alone, reported on the Node, and their
placements not offered (``MigInstances.adopt_mig_instances``), unless the agent owns the
layout (``mig_own_layout``: they are destroyed). ``recover`` creates again the recorded ones
that are missing (a reboot: MIG instances do not survive a GPU reset), rewriting the claim's
record and spec if the new MIG device has another UUID, and reports the GPUs whose MIG
management NVML refuses (no privileges) as a Warning Event on the Node.

This module owns the checkpoint file and the CDI specs of our driver. It answers to the gRPC
servicers with ``Prepared`` (not the on-disk record) or ``PrepareFailed`` and never talks gRPC
itself; ``status.devices`` writes go to a ``StatusSink`` and do not delay the answer to the
kubelet. What a container sees of a device (its environment) is the backend's to say
(``model.Backend.container_edits``); the MPS daemons and time-slices of shared GPUs are
``sharing``'s (``agent.mps``): held before a share's spec is written, brought in line with the
checkpoint after an unprepare and at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dra_gpu import kube
from dra_gpu.agent import (
    cdi,
    checkpoint,
    claimcache,
    claims,
    failpoints,
    files,
    mps,
    opaque,
    toolkit,
)
from dra_gpu.agent.claims import ClaimError, ClaimRef
from dra_gpu.devices import edits, mig, model
from dra_gpu.kube import events
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

CLAIM_READS = 16
"""Claims read from the API server at once. The kubelet sends a few at a time; a burst of
hundreds must not open hundreds of connections (each a TLS session kept in the client's pool,
tens of KiB resident, and as many requests at once on the API server)."""

MIG_INTENTS_DIR = ".dra-gpu-mig-intents"
"""Under the CDI directory: the MIG instances each driver's agent is creating now."""
EVENT_COMPONENT = "dra-gpu-agent"

InventorySource = Callable[[bool], Awaitable[model.Inventory]]
"""Returns the node's inventory; ``True`` asks for a fresh read instead of the cached one."""

ContainerEdits = Callable[[Sequence[edits.GivenDevice]], Awaitable[edits.ClaimEdits]]
"""What a container given a claim's devices gets (``model.Backend.container_edits``)."""


@dataclasses.dataclass
class _Pending:
    """A checkpoint change waiting for the next group commit."""

    change: checkpoint.Change
    done: asyncio.Future[None]
    files: Callable[[], None] | None = None
    """Blocking file work (a claim's spec written or deleted) done in the commit's thread just
    before the checkpoint; if it fails, the change is left out and ``done`` gets the error."""


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet is told of it (its ``Device`` message)."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A claim prepared on this node: the answer for the kubelet, whatever the checkpoint keeps."""

    devices: tuple[PreparedDevice, ...]

    @classmethod
    def of(cls, record: checkpoint.PreparedClaim) -> Prepared:
        return cls(
            tuple(
                PreparedDevice(d.request_names, d.pool, d.device, d.cdi_device_ids, d.share_id)
                for d in record.devices
            )
        )


@dataclasses.dataclass(frozen=True)
class PrepareFailed:
    """A per-claim failure, reported in the claim's ``error`` field."""

    message: str


class StatusSink(Protocol):
    """Where prepared devices' ``status.devices`` entries go (see ``status.StatusWriter``)."""

    def set_devices(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Desired entries of our driver for the claim; an empty list removes ours."""


class DeviceState:
    def __init__(
        self,
        *,
        api: kube.Kube,
        driver: str,
        node: str,
        container_edits: ContainerEdits,
        cdi_dir: Path,
        checkpoint_file: Path,
        inventory: InventorySource,
        status: StatusSink,
        mig: model.MigInstances | None = None,
        mig_own_layout: bool = False,
        cache: claimcache.ClaimCache | None = None,
        sharing: mps.Sharing | None = None,
        toolkit_cdi_kind: str = "",
    ) -> None:
        self.api = api
        self._toolkit_cdi_kind = toolkit_cdi_kind  # "": our CDI devices only (agent.toolkit)
        self._cache = cache
        self._mig = mig
        self._mig_own_layout = mig_own_layout
        self._mig_intents: set[model.MigPlacement] = set()  # instances being made now
        self._mig_intents_lock = asyncio.Lock()
        self.driver = driver
        self.node = node
        self._container_edits = container_edits
        self._sharing = sharing
        self.cdi_dir = cdi_dir
        self.checkpoint_file = checkpoint_file
        self._inventory = inventory
        self._status = status
        self._checkpoint = checkpoint.Checkpoint()
        # Per-claim locks keep a prepare and an unprepare of the same claim in order while
        # different claims read the API in parallel; checkpoint changes are group-committed.
        self._claim_locks: dict[str, asyncio.Lock] = {}
        self._pending: list[_Pending] = []
        self._committing = False
        self._journal: checkpoint.Journal | None = None  # opened by the first commit
        self._writing: asyncio.Future[Any] | None = None  # the commit's thread, while it runs
        self._retired: str | None = None
        self._reads = asyncio.Semaphore(CLAIM_READS)
        # status.devices entries written since start, and the devices' health conditions:
        # a health change rewrites the entries of the claims that hold the device.
        self._entries: dict[str, tuple[ClaimRef, list[dict[str, Any]]]] = {}
        self._health: dict[str, dict[str, Any]] = {}

    @property
    def prepared(self) -> checkpoint.Checkpoint:
        return self._checkpoint

    # ---- start ---------------------------------------------------------------------------

    def load(self, recorded: checkpoint.Checkpoint) -> None:
        """Start from ``recorded`` (read from disk); the next commit writes a new snapshot."""
        self._drop_journal()
        self._checkpoint = recorded
        self._update_gauges()

    @property
    def retired(self) -> str | None:
        """Why this agent no longer writes the node's checkpoint and CDI specs, if it does not."""
        return self._retired

    def retire(self, reason: str) -> None:
        """Another agent serves the kubelet now, and owns the checkpoint and the CDI directory
        that we share with it: write neither any more. Prepares and unprepares fail."""
        self._retired = reason  # the journal stays open until ``aclose``: a write may be under way

    async def resume(self, recorded: checkpoint.Checkpoint) -> list[str]:
        """We serve the kubelet again: take over what the other agent recorded (``recorded``,
        read from disk now) and repair the CDI directory from it."""
        await self._written()
        self._retired = None
        self.load(recorded)
        return await self.recover()

    def _check_not_retired(self, ref: ClaimRef) -> None:
        if self._retired is not None:
            raise ClaimError(
                f"ResourceClaim {ref}: this agent no longer serves the node: {self._retired}"
            )

    async def _written(self) -> None:
        """Until no commit's thread is writing."""
        writing = self._writing
        if writing is not None and not writing.done():
            await asyncio.wait([writing])
        if writing is not None and not writing.cancelled():
            writing.exception()  # reported to its waiters already; here only retrieved

    def _drop_journal(self) -> None:
        if self._journal is not None:
            journal, self._journal = self._journal, None
            journal.close()

    async def aclose(self) -> None:
        """``close``, once a write still under way (its RPC cancelled at shutdown) is over;
        nothing is written if we were retired."""
        await self._written()
        if self._retired is None:
            await asyncio.to_thread(self.close)
        else:
            self._drop_journal()

    def close(self) -> None:
        """Fold the journal into a snapshot (an older agent reads only that) and close it.
        Blocking; call it once nothing is prepared or unprepared any more."""
        if self._journal is not None:
            journal, self._journal = self._journal, None
            try:
                journal.compact(self._checkpoint)
            finally:
                journal.close()

    async def recover(self) -> list[str]:
        """Make the MIG instances and the CDI directory agree with the checkpoint; returns
        what it repaired."""
        repaired = await self._reconcile_mig()
        on_disk = await asyncio.to_thread(cdi.list_claim_specs, self.cdi_dir, self.driver)
        for uid in sorted(set(on_disk) - set(self._checkpoint.claims)):
            await asyncio.to_thread(cdi.delete_claim_spec, self.cdi_dir, self.driver, uid)
            repaired.append(f"deleted CDI spec of unrecorded claim {uid}")
        for uid, claim in sorted(self._checkpoint.claims.items()):
            if claim.cdi_spec is None:
                continue
            if uid not in on_disk:
                await self._write_spec(uid, claim.cdi_spec)
                repaired.append(f"re-wrote CDI spec of claim {claim.namespace}/{claim.name}")
            elif not await asyncio.to_thread(_same_content, on_disk[uid], claim.cdi_spec):
                # Not fsync'd when it was written: a power cut may have left it empty.
                await self._write_spec(uid, claim.cdi_spec)
                repaired.append(
                    f"re-wrote damaged CDI spec of claim {claim.namespace}/{claim.name}"
                )
        if self._sharing is not None:
            repaired.extend(await self._sync_sharing())
        return repaired

    async def _reconcile_mig(self) -> list[str]:
        """Destroy the MIG instances this agent made that no recorded claim holds (a crash
        between creating one and recording it: the intents file says so); leave the instances
        of others alone, unless this agent owns the GPUs' MIG layout (``mig_own_layout``: then
        every unrecorded instance goes); create the recorded ones that are missing. Report the
        GPUs whose MIG management NVML refuses. A failure is reported and the rest goes on: the
        agent must start."""
        if self._mig is None:
            return []
        recorded = {
            d.mig_instance.placement: (claim, d.device, d.mig_instance)
            for claim in self._checkpoint.claims.values()
            for d in claim.devices
            if d.mig_instance is not None
        }
        present = {i.placement: i for i in await self._mig.mig_instances()}
        # Until the record is complete nothing counts as someone else's (a rebuilt checkpoint
        # finds its claims' partitions in the inventory).
        self._mig.adopt_mig_instances({*recorded, *present})
        repaired = await self._report_mig_refusals()
        repaired += await self._adopt_mig_instances(present)
        recorded = {
            d.mig_instance.placement: (claim, d.device, d.mig_instance)
            for claim in self._checkpoint.claims.values()
            for d in claim.devices
            if d.mig_instance is not None
        }
        intended = await asyncio.to_thread(_read_mig_intents, self._intents_file)
        left: list[model.MigInstance] = []
        for placement, instance in sorted(present.items()):
            if placement in recorded:
                continue
            if placement not in intended and not self._mig_own_layout:
                left.append(instance)
                continue
            try:
                await self._mig.destroy_mig_instance(instance)
            except Exception as exc:
                repaired.append(f"could not destroy MIG instance {instance}: {exc}")
                continue
            repaired.append(f"destroyed MIG instance {instance}: no prepared claim holds it")
        self._mig.adopt_mig_instances(set(recorded))
        repaired += await self._report_foreign_instances(left)
        for placement, (claim, device, was) in sorted(recorded.items()):
            now = present.get(placement)
            what = f"MIG instance {placement} of claim {claim.namespace}/{claim.name}"
            if now is None:
                try:
                    now = await self._mig.create_mig_instance(placement)
                except Exception as exc:
                    repaired.append(f"could not create {what} again: {exc}")
                    continue
                repaired.append(f"created {what} again (lost in a reboot?)")
            if now != was:
                current = self._checkpoint.claims[claim.uid]
                nodes = await self._mig_device_nodes(claim, device, now)
                await self._commit(checkpoint.Put(current.with_mig_instance(device, now, nodes)))
        if intended:
            await self._write_mig_intents(set(), durable=False)
        return repaired

    async def _mig_device_nodes(
        self, claim: checkpoint.PreparedClaim, device: str, instance: model.MigInstance
    ) -> list[cdi.DeviceNode] | None:
        """The device nodes the backend gives a container for ``device`` as ``instance`` (its
        GPU and compute instance capability nodes follow the instance's ids); None when the
        inventory no longer has the device (the recorded nodes stay)."""
        found = (await self._inventory(False)).by_name.get(device)
        if found is None:
            return None
        given = [edits.GivenDevice(found, instance)]
        where = f"claim {claim.namespace}/{claim.name}, device {device!r}"
        (device_edits,) = (await self._container_edits(given)).per_device
        return cdi.device_nodes(device_edits.device_nodes, where)

    @property
    def _intents_file(self) -> Path:
        """The MIG instances being created now: on the CDI directory's tmpfs (it outlives an
        agent crash, not a reboot, as MIG instances do), in a directory CDI runtimes skip."""
        return self.cdi_dir / MIG_INTENTS_DIR / f"{self.driver}.json"

    async def _write_mig_intents(self, intents: set[model.MigPlacement], *, durable: bool) -> None:
        self._mig_intents = intents
        await asyncio.to_thread(_write_mig_intents, self._intents_file, intents, durable)

    async def _intend(self, placements: Sequence[model.MigPlacement]) -> None:
        """Say, before creating them, that the instances at ``placements`` are this agent's:
        a crash before the claim is recorded leaves instances that ``recover`` then knows to
        destroy, while others' instances are left alone."""
        async with self._mig_intents_lock:
            await self._write_mig_intents({*self._mig_intents, *placements}, durable=True)

    async def _intended(self, placements: Sequence[model.MigPlacement]) -> None:
        """The claim of ``placements`` is recorded (or its instances destroyed)."""
        async with self._mig_intents_lock:
            left = self._mig_intents - set(placements)
            if left != self._mig_intents:
                await self._write_mig_intents(left, durable=False)

    async def _report_mig_refusals(self) -> list[str]:
        """A Warning Event on the Node, a log line and the ``dra_gpu_mig_management`` gauge for
        each MIG-mode GPU whose MIG management NVML refuses; the managed ones on the gauge."""
        assert self._mig is not None
        refusals = self._mig.mig_refusals()
        refused = {r.gpu for r in refusals}
        partitioned = {
            d.partition_of
            for d in (await self._inventory(False)).devices
            if d.partition_of is not None
        }
        for gpu in sorted(partitioned | refused):
            state = "refused" if gpu in refused else "managed"
            for each in ("managed", "refused"):
                metrics.MIG_MANAGEMENT.labels(self.node, gpu, each).set(int(each == state))
        lines = []
        for refusal in refusals:
            message = f"node {self.node}: {refusal}"
            log.warning("%s", message)
            await self._node_event("Warning", "MigManagementRefused", message)
            lines.append(f"MIG management refused: {refusal}")
        return lines

    async def _report_foreign_instances(self, left: Sequence[model.MigInstance]) -> list[str]:
        per_gpu: dict[str, int] = {}
        for instance in left:
            per_gpu[instance.placement.parent] = per_gpu.get(instance.placement.parent, 0) + 1
        for gpu, count in sorted(per_gpu.items()):
            metrics.MIG_FOREIGN_INSTANCES.labels(self.node, gpu).set(count)
        if not left:
            return []
        shown = "; ".join(str(i) for i in left)
        message = (
            f"node {self.node}: left {len(left)} MIG instance(s) alone that this agent did not "
            f"make ({shown}); the placements they block are not offered. To let the agent own "
            "the GPUs' MIG layout (and destroy them), set the chart value agent.mig.ownLayout "
            "(--mig-own-layout)"
        )
        log.info("%s", message)
        await self._node_event("Normal", "MigInstancesLeftAlone", message)
        return [f"left MIG instance {i} alone: not made by this agent" for i in left]

    async def _node_event(self, type_: str, reason: str, message: str) -> None:
        """An Event on this Node, best effort (the log line says it already)."""
        await events.post_on_node(
            self.api, EVENT_COMPONENT, self.node, type_=type_, reason=reason, message=message
        )

    async def _adopt_mig_instances(
        self, present: Mapping[model.MigPlacement, model.MigInstance]
    ) -> list[str]:
        """Record the instance of a partition that a claim holds but whose record does not
        say so: a checkpoint rebuilt from the API server and the CDI specs after it was
        corrupt. Only where exactly one recorded claim holds that partition."""
        held = {
            d.mig_instance.placement
            for c in self._checkpoint.claims.values()
            for d in c.devices
            if d.mig_instance is not None
        }
        bare = [
            (c, d.device)
            for c in self._checkpoint.claims.values()
            for d in c.devices
            if d.mig_instance is None and d.pool == self.node
        ]
        if not bare or not set(present) - held:
            return []
        devices = (await self._inventory(False)).by_name
        holders: dict[model.MigPlacement, list[tuple[checkpoint.PreparedClaim, str]]] = {}
        for claim, name in bare:
            placement = mig.placement_of(devices[name]) if name in devices else None
            if placement is not None:
                holders.setdefault(placement, []).append((claim, name))
        adopted: list[str] = []
        for placement, found in sorted(holders.items()):
            if placement in held or placement not in present or len(found) != 1:
                continue
            ((claim, name),) = found
            current = self._checkpoint.claims[claim.uid]
            await self._commit(checkpoint.Put(current.with_mig_instance(name, present[placement])))
            adopted.append(
                f"recorded MIG instance {present[placement]} of claim "
                f"{claim.namespace}/{claim.name}"
            )
        return adopted

    async def release_stale(self) -> list[str]:
        """Unprepare recorded claims that no longer need what was prepared (see
        ``claims.stale_reason``): the kubelet lost track of them, e.g. its state was wiped
        while the agent was down, or the record came with a copied disk. A claim that cannot
        be read now is left for the next round."""
        released: list[str] = []
        if self._retired is not None:
            return released
        for uid, record in sorted(self._checkpoint.claims.items()):
            ref = ClaimRef(record.namespace, record.name, claims.ClaimUID(uid))
            try:
                current: kube.Body | None = await self.api.get(ref.path)
            except kube.ApiError as exc:
                if not exc.not_found:
                    continue
                current = None
            except Exception as exc:  # the API server may be restarting: next round
                log.info("cannot check claim %s now: %s", ref, exc)
                continue
            prepared = [(d.pool, d.device) for d in record.devices]
            reason = claims.stale_reason(current, uid, prepared, self.driver, self.node)
            if reason is not None and await self.unprepare(ref) is None:
                released.append(f"unprepared claim {ref} (uid {uid}): {reason}")
        return released

    # ---- prepare -------------------------------------------------------------------------

    async def prepare_all(self, refs: Sequence[ClaimRef]) -> dict[str, Prepared | PrepareFailed]:
        """Each claim on its own: one bad claim does not fail the others."""
        if len(refs) == 1:  # the usual request: no task needed
            return {refs[0].uid: await self.prepare(refs[0])}
        results = await asyncio.gather(*(self.prepare(ref) for ref in refs))
        return {ref.uid: result for ref, result in zip(refs, results, strict=True)}

    async def prepare(self, ref: ClaimRef) -> Prepared | PrepareFailed:
        started = time.perf_counter()
        try:
            async with self._claim_lock(ref.uid):
                prepared = Prepared.of(await self._prepare(ref))
        except ClaimError as exc:
            result: Prepared | PrepareFailed = PrepareFailed(str(exc))
        except Exception as exc:  # the kubelet gets an answer for every claim, always
            log.exception("prepare of claim %s failed", ref)
            result = PrepareFailed(f"ResourceClaim {ref}: {type(exc).__name__}: {exc}")
        else:
            result = prepared
        outcome = "error" if isinstance(result, PrepareFailed) else "success"
        metrics.PREPARES.labels(outcome).inc()
        metrics.PREPARE_SECONDS.labels(outcome).observe(time.perf_counter() - started)
        if isinstance(result, PrepareFailed):
            log.warning("prepare %s: %s", ref, result.message)
        return result

    async def _prepare(self, ref: ClaimRef) -> checkpoint.PreparedClaim:
        claims.check_request(ref)
        self._check_not_retired(ref)
        recorded = self._checkpoint.claims.get(ref.uid)
        if recorded is not None:
            if recorded.cdi_spec is not None:
                await self._ensure_spec(ref.uid, recorded.cdi_spec)
            return recorded
        claim = await self._read_claim(ref)
        claims.check_identity(claim, ref)
        allocated = claims.allocated_devices(claim, ref, self.driver, self.node)
        try:
            configs = opaque.effective_configs(
                claims.allocation_configs(claim), self.driver, [d.request for d in allocated]
            )
        except opaque.InvalidConfig as exc:
            raise ClaimError(f"ResourceClaim {ref}: {exc}") from None
        devices = await self._inventory_devices(ref, allocated)
        placements = self._mig_placements(ref, allocated, devices, configs)
        instances = await self._create_instances(ref, placements)
        try:
            for name, instance in instances.items():
                # What the container sees is the MIG device that exists now.
                devices[name] = dataclasses.replace(devices[name], uuid=instance.uuid)
            spec = await self._claim_spec(ref, allocated, devices, configs, instances)
            record = checkpoint.record_claim(
                self.driver,
                ref.uid,
                ref.namespace,
                ref.name,
                allocated,
                spec,
                instances,
                toolkit.device_ids(self._toolkit_cdi_kind, devices.values()),
            )
            write_spec = None
            if spec is not None:
                write_spec = functools.partial(self._write_spec_blocking, ref.uid, spec)
            await self._commit(checkpoint.Put(record), write_spec)
        except Exception:
            await self._destroy_instances(ref, list(instances.values()), strict=False)
            await self._intended(list(placements.values()))
            if self._sharing is not None:  # a daemon started for this claim alone goes
                self._sharing.release(ref.uid)
                await self._sync_sharing()
            raise
        if self._sharing is not None:
            self._sharing.release(ref.uid)  # the record holds its shares now
        if placements:
            await self._intended(list(placements.values()))  # the record holds them now
        failpoints.reach("before-answer")
        self._set_entries(ref, self._status_entries(allocated, devices))
        return record

    async def _claim_spec(
        self,
        ref: ClaimRef,
        allocated: Sequence[claims.AllocatedDevice],
        devices: Mapping[str, model.Device],
        configs: Mapping[str, opaque.GpuConfig],
        instances: Mapping[str, model.MigInstance],
    ) -> cdi.CdiSpec | None:
        """The claim's CDI spec: the backend's edits for its devices (``container_edits``),
        claim-wide the shares' variables and the sharing daemons' mounts (started for it
        here, ``sharing.hold``), per device the opaque config's variables."""
        if not allocated:
            return None
        pairs = [(alloc, devices[alloc.device]) for alloc in allocated]
        given = [edits.GivenDevice(d, instances.get(a.device)) for a, d in pairs]
        try:
            claim_edits = await self._container_edits(given)
            common = claim_edits.common.merged(edits.Edits(claims.share_env(pairs)))
            shares = [mps.SharedGpu.of(d) for a, d in pairs if a.share_id and d.sharing]
            if shares and self._sharing is not None:
                common = common.merged(await self._sharing.hold(ref.uid, shares))
            spec_devices = [
                (
                    alloc.key,
                    device_edits.merged(
                        edits.Edits(
                            {
                                **configs[alloc.request].container_env(),
                                **claims.share_mode_env(alloc, device.sharing),
                                **claims.admin_access_env(alloc),
                            }
                        )
                    ),
                )
                for (alloc, device), device_edits in zip(pairs, claim_edits.per_device, strict=True)
            ]
            return cdi.claim_spec(self.driver, ref.uid, spec_devices, common)
        except ValueError as exc:  # InventoryError, a spec CDI would refuse, MpsError
            raise ClaimError(f"ResourceClaim {ref}: {exc}") from None

    async def _recorded_shares(self) -> list[mps.SharedGpu]:
        """The shared GPUs that recorded claims hold shares of, as the inventory has them."""
        held = {
            d.device
            for c in self._checkpoint.claims.values()
            for d in c.devices
            if d.share_id is not None and d.pool == self.node
        }
        if not held:
            return []
        by_name = (await self._inventory(False)).by_name
        gpus = [by_name[n] for n in sorted(held) if n in by_name]
        return [mps.SharedGpu.of(d) for d in gpus if d.sharing is not None]

    async def _sync_sharing(self) -> list[str]:
        """Start the sharing daemons recorded shares need, stop the rest; what it did. A
        failure is logged and reported: the next prepare, unprepare or start tries again."""
        assert self._sharing is not None
        try:
            return await self._sharing.sync(await self._recorded_shares())
        except Exception as exc:
            log.error("sharing daemons: %s", exc)
            return [f"could not bring the sharing daemons in line: {exc}"]

    def _mig_placements(
        self,
        ref: ClaimRef,
        allocated: Sequence[claims.AllocatedDevice],
        devices: Mapping[str, model.Device],
        configs: Mapping[str, opaque.GpuConfig],
    ) -> dict[str, model.MigPlacement]:
        """The MIG placement of each allocated partition (by device name) whose instance this
        claim creates; checks ``migProfile``. Admin access creates nothing: it is a view of
        what others hold."""
        placements: dict[str, model.MigPlacement] = {}
        for alloc in allocated:
            placement = mig.placement_of(devices[alloc.device])
            why = configs[alloc.request].check_mig_profile(
                alloc.device, placement.profile if placement else None
            )
            if why is not None:
                raise ClaimError(f"ResourceClaim {ref}: request {alloc.request}: {why}")
            if placement is None or alloc.admin_access:
                continue
            if self._mig is None:
                raise ClaimError(
                    f"ResourceClaim {ref}: {alloc.device} is a MIG partition, and this "
                    "node's backend cannot create MIG instances"
                )
            placements[alloc.device] = placement
        return placements

    async def _create_instances(
        self, ref: ClaimRef, placements: Mapping[str, model.MigPlacement]
    ) -> dict[str, model.MigInstance]:
        """The MIG instance of each placement, created now; all or none."""
        created: dict[str, model.MigInstance] = {}
        if not placements:
            return created
        assert self._mig is not None  # checked by _mig_placements
        held = {
            i.placement: c
            for c in self._checkpoint.claims.values()
            for i in c.mig_instances()
            if c.uid != ref.uid
        }
        for placement in placements.values():
            if placement in held:  # the scheduler's counters never allow it; never share one
                other = held[placement]
                raise ClaimError(
                    f"ResourceClaim {ref}: MIG placement {placement} is held by claim "
                    f"{other.namespace}/{other.name}, prepared on this node"
                )
        await self._intend(list(placements.values()))
        try:
            for device, placement in placements.items():
                created[device] = await self._mig.create_mig_instance(placement)
                log.info("claim %s: created MIG instance %s", ref, created[device])
        except Exception as exc:
            await self._destroy_instances(ref, list(created.values()), strict=False)
            await self._intended(list(placements.values()))
            raise ClaimError(f"ResourceClaim {ref}: {exc}") from None
        failpoints.reach("mig-instance-created")
        return created

    async def _destroy_instances(
        self, ref: ClaimRef, instances: Sequence[model.MigInstance], *, strict: bool
    ) -> None:
        """Destroy ``instances``; with ``strict``, a failure is the claim's error (the kubelet
        retries unprepare), else it is logged (the next start's reconciliation retries)."""
        for instance in instances:
            assert self._mig is not None
            try:
                await self._mig.destroy_mig_instance(instance)
            except Exception as exc:
                if strict:
                    raise ClaimError(
                        f"ResourceClaim {ref}: cannot destroy MIG instance {instance}: {exc}"
                    ) from None
                log.error("claim %s: cannot destroy MIG instance %s: %s", ref, instance, exc)
            else:
                log.info("claim %s: destroyed MIG instance %s", ref, instance)

    async def _read_claim(self, ref: ClaimRef) -> kube.Body:
        cached = self._cache.lookup(ref) if self._cache is not None else None
        metrics.CLAIM_READS.labels("api" if cached is None else "cache").inc()
        if cached is not None:
            return cached
        try:
            async with self._reads:
                return await self.api.get(ref.path)
        except kube.ApiError as exc:
            if exc.not_found:
                raise ClaimError(f"ResourceClaim {ref} not found") from None
            raise ClaimError(f"ResourceClaim {ref}: cannot be read: {exc}") from None

    async def _inventory_devices(
        self, ref: ClaimRef, allocated: Sequence[claims.AllocatedDevice]
    ) -> dict[str, model.Device]:
        """The allocated devices by name (a claim's own dict: prepare replaces entries)."""
        devices = (await self._inventory(False)).by_name
        if any(a.device not in devices for a in allocated):
            devices = (await self._inventory(True)).by_name  # a device may have just appeared
        missing = [a.device for a in allocated if a.device not in devices]
        if missing:
            raise ClaimError(
                f"ResourceClaim {ref}: device {', '.join(missing)} is not on node {self.node} "
                f"(it has {', '.join(sorted(devices)) or 'no devices'}); it may have been "
                "removed after the claim was allocated"
            )
        return {a.device: devices[a.device] for a in allocated}

    def _status_entries(
        self, allocated: Sequence[claims.AllocatedDevice], devices: dict[str, model.Device]
    ) -> list[dict[str, Any]]:
        now = datetime.datetime.now(datetime.UTC)
        entries = []
        for alloc in allocated:
            device = devices[alloc.device]
            data: dict[str, Any] = {
                "uuid": device.uuid,
                "productName": device.product_name or "",
                "memory": device.memory or "",
            }
            if alloc.admin_access:
                data["adminAccess"] = True
            if alloc.share_id is not None and device.sharing is not None:
                data["sharing"] = device.sharing.mode
                data["memoryShare"] = alloc.consumed.get("memory", device.sharing.memory.default)
            health = self._health.get(alloc.device) if alloc.pool == self.node else None
            entries.append(
                claims.device_status(
                    self.driver, alloc.pool, alloc.device, data, now, health, alloc.share_id
                )
            )
        return entries

    def _set_entries(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        if entries:
            self._entries[ref.uid] = (ref, entries)
        else:
            self._entries.pop(ref.uid, None)
        self._status.set_devices(ref, entries)

    def device_health(self, device: str, condition: dict[str, Any]) -> None:
        """``device`` of this node's pool is now as ``condition`` (``claims.health_condition``)
        says: the ``status.devices`` entries of the claims holding it say so too."""
        self._health[device] = condition
        for ref, entries in list(self._entries.values()):
            if any(e["device"] == device and e["pool"] == self.node for e in entries):
                updated = [
                    claims.with_health(e, condition)
                    if e["device"] == device and e["pool"] == self.node
                    else e
                    for e in entries
                ]
                self._set_entries(ref, updated)

    # ---- unprepare -----------------------------------------------------------------------

    async def unprepare_all(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareFailed | None]:
        if len(refs) == 1:
            return {refs[0].uid: await self.unprepare(refs[0])}
        results = await asyncio.gather(*(self.unprepare(ref) for ref in refs))
        return {ref.uid: result for ref, result in zip(refs, results, strict=True)}

    async def unprepare(self, ref: ClaimRef) -> PrepareFailed | None:
        started = time.perf_counter()
        error: PrepareFailed | None = None
        try:
            claims.check_request(ref)
            async with self._claim_lock(ref.uid):
                await self._unprepare(ref)
            self._claim_locks.pop(ref.uid, None)  # the claim is done with on this node
        except ClaimError as exc:
            error = PrepareFailed(str(exc))
            log.warning("unprepare %s: %s", ref, exc)
        except Exception as exc:
            log.exception("unprepare of claim %s failed", ref)
            error = PrepareFailed(f"ResourceClaim {ref}: {type(exc).__name__}: {exc}")
        outcome = "error" if error else "success"
        metrics.UNPREPARES.labels(outcome).inc()
        metrics.UNPREPARE_SECONDS.labels(outcome).observe(time.perf_counter() - started)
        return error

    async def _unprepare(self, ref: ClaimRef) -> None:
        if self._cache is not None:
            self._cache.unprepared(ref.uid)
        self._check_not_retired(ref)
        delete_spec = functools.partial(self._delete_spec_blocking, ref.uid)
        recorded = self._checkpoint.claims.get(ref.uid)
        if recorded is None:
            # The spec goes even for an unrecorded claim: it may be a leak of a crashed prepare.
            await asyncio.to_thread(delete_spec)
            return
        # Before the entry goes: a crash in between leaves a record whose instance is gone,
        # which recovery creates again and the kubelet's retry destroys; never a leak.
        await self._destroy_instances(ref, recorded.mig_instances(), strict=True)
        await self._commit(checkpoint.Delete(ref.uid), delete_spec)
        self._set_entries(ref, [])
        if self._sharing is not None and any(d.share_id for d in recorded.devices):
            for line in await self._sync_sharing():  # the last share of a GPU stops its daemon
                log.info("claim %s: %s", ref, line)

    # ---- helpers -------------------------------------------------------------------------

    async def _commit(
        self, change: checkpoint.Change, files: Callable[[], None] | None = None
    ) -> None:
        """Apply ``change`` to the checkpoint and return once it is on disk, after ``files``
        (the claim's spec work) succeeded. Whoever finds no write in progress writes every
        change queued meanwhile, in one go, in one thread."""
        if self._retired is not None:
            raise RuntimeError(
                f"this agent no longer writes {self.checkpoint_file}: {self._retired}"
            )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(change, done, files))
        if not self._committing:
            self._committing = True
            try:
                while self._pending:
                    batch, self._pending = self._pending, []
                    # Shielded: a thread cannot be cancelled, and ``aclose`` must know when
                    # the last write is over even if whoever waited for it was cancelled.
                    self._writing = asyncio.ensure_future(
                        asyncio.to_thread(self._write_batch, self._checkpoint, batch)
                    )
                    try:
                        updated, failed = await asyncio.shield(self._writing)
                    except Exception as exc:
                        for pending in batch:
                            pending.done.set_exception(exc)
                        continue
                    self._checkpoint = updated
                    self._update_gauges()
                    for i, pending in enumerate(batch):
                        if i in failed:
                            pending.done.set_exception(failed[i])
                        else:
                            pending.done.set_result(None)
            finally:
                self._committing = False
        await done

    def _write_batch(
        self, current: checkpoint.Checkpoint, batch: Sequence[_Pending]
    ) -> tuple[checkpoint.Checkpoint, dict[int, Exception]]:
        """(In a thread.) Each pending change's file work, then the checkpoint with the
        changes whose file work succeeded: the one durable write of the whole batch."""
        if self._retired is not None:  # retired while this batch waited for the thread
            raise RuntimeError(f"no longer writing {self.checkpoint_file}: {self._retired}")
        updated = current
        failed: dict[int, Exception] = {}
        changes: list[checkpoint.Change] = []
        for i, pending in enumerate(batch):
            if pending.files is not None:
                try:
                    pending.files()
                except Exception as exc:
                    failed[i] = exc
                    continue
            changes.append(pending.change)
            updated = pending.change.apply(updated)
        if changes:
            journal = self._journal
            if journal is None:
                journal = self._journal = checkpoint.Journal(self.checkpoint_file, current)
            journal.append(changes, updated)
            failpoints.reach("checkpoint-written")
        return updated, failed

    def _claim_lock(self, uid: str) -> asyncio.Lock:
        return self._claim_locks.setdefault(uid, asyncio.Lock())

    async def _write_spec(self, uid: str, spec: cdi.CdiSpec) -> None:
        await asyncio.to_thread(self._write_spec_blocking, uid, spec)

    def _write_spec_blocking(self, uid: str, spec: cdi.CdiSpec) -> None:
        # Not fsync'd: the checkpoint entry is the durable record (see the module docstring).
        cdi.write_claim_spec(self.cdi_dir, spec, claim_uid=uid, durable=False)
        failpoints.reach("cdi-spec-written")

    def _delete_spec_blocking(self, uid: str) -> None:
        cdi.delete_claim_spec(self.cdi_dir, self.driver, uid, durable=False)
        failpoints.reach("cdi-spec-deleted")

    async def _ensure_spec(self, uid: str, spec: cdi.CdiSpec) -> None:
        path = self.cdi_dir / cdi.spec_file_name(self.driver, uid)
        if not await asyncio.to_thread(path.exists):
            log.info("claim %s: CDI spec missing (reboot?), writing it again", uid)
            await self._write_spec(uid, spec)

    def _update_gauges(self) -> None:
        claims_ = self._checkpoint.claims.values()
        metrics.PREPARED_CLAIMS.set(len(claims_))
        metrics.PREPARED_DEVICES.set(sum(len(c.devices) for c in claims_))


def _same_content(path: Path, spec: cdi.CdiSpec) -> bool:
    try:
        return path.read_bytes() == cdi.spec_bytes(spec)
    except FileNotFoundError:
        return False


def _read_mig_intents(path: Path) -> set[model.MigPlacement]:
    """(In a thread.) The placements of the intents file; none if it is missing or
    unreadable (logged: then unrecorded instances are left alone, never destroyed wrongly)."""
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
        return {model.MigPlacement(i["parent"], i["profile"], int(i["start"])) for i in items}
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("MIG intents %s: unreadable, ignored: %s", path, exc)
        return set()


def _write_mig_intents(path: Path, intents: set[model.MigPlacement], durable: bool) -> None:
    body = [{"parent": p.parent, "profile": p.profile, "start": p.start} for p in sorted(intents)]
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    files.atomic_write(path, json.dumps(body).encode(), durable=durable)

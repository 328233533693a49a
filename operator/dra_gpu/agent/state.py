"""Prepared claims on this node: prepare and unprepare, the one entry the gRPC servicers call.

Prepare reads the claim (from the copy read as its pod was bound here, ``claimcache``, when it
may be used; else with a GET), takes our driver's devices from its allocation, applies the opaque
configuration (class configs, then claim configs), writes the claim's CDI spec and then records
the claim in the checkpoint before answering; unprepare undoes both. Both are idempotent: a
recorded claim is answered from the checkpoint (its spec written again if a reboot emptied the
CDI directory), an unknown one unprepares as a success.

Crash consistency: the checkpoint is the record, and the kubelet gets its answer only after the
claim's entry is on stable storage (fsync'd file, renamed, directory fsync'd) and its CDI spec
is in place. The spec is written atomically (readers see all of it or none) but not fsync'd:
it lives on a tmpfs that a reboot empties anyway, and ``recover`` at start makes the CDI
directory agree with the checkpoint whatever a crash or a power cut left there (``recovery``).
So a prepare waits for one durability barrier, not two, and an unprepare likewise (spec
deleted, then the entry removed durably). That barrier is an append to the checkpoint's
journal and one ``fdatasync``, not a new snapshot, group-committed (``commits``): claims
prepared at the same time share one append, and their specs are written by the same thread
just before it, instead of each queueing for its own.

A second agent of the driver on the node (the new pod of a rolling update beside the old one,
two releases) shares the host directories. With sockets of their own (per pod), both are
registered and the kubelet calls the newer; calls the older one is still answering, and its
release of stale claims, may overlap with the newer's. So every prepare and unprepare batch
holds the node's serialize lock (``commits.SerializeLock``, a file lock in the checkpoint
directory, as upstream's helper serializes them), and whoever takes it first reads the
checkpoint again if the other agent wrote it meanwhile (``sync_with_disk``): what ``prepared``
says is never stale while a call acts on it. The start (load, recovery) and the fold of the
journal at stop hold it too. With the fixed socket names of one driver (no pod UID), the
newer agent takes the sockets over instead: one that finds its sockets taken over is
``retire``d (no writes at all, not even the snapshot at stop), and ``resume``s from what the
other left on disk if its sockets come back.

MIG instances (a backend with ``model.MigInstances``): prepare of a MIG partition creates its
GPU and compute instance before the spec and the checkpoint entry, and unprepare destroys it
before the entry goes, so a recorded claim always has its instance (``mig_instances``, whose
intents file lets ``recovery`` destroy an instance a crash left unrecorded).

This module owns the checkpoint file and the CDI specs of our driver, through ``commits`` and
``cdi``. It answers to the gRPC servicers with ``Prepared`` (not the on-disk record) or
``PrepareFailed`` and never talks gRPC itself; ``status.devices`` entries are kept by a
``status.ClaimEntries`` and written in the background, never delaying the answer to the
kubelet. What a container sees of a device (its environment) is the backend's to say
(``model.Backend.container_edits``); the MPS daemons and time-slices of shared GPUs are
``sharing``'s (``agent.mps``): held before a share's spec is written, brought in line with the
checkpoint after an unprepare and at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu import kube
from dra_gpu.agent import (
    cdi,
    checkpoint,
    claimcache,
    claims,
    commits,
    failpoints,
    mig_instances,
    mps,
    recovery,
    sources,
    toolkit,
)
from dra_gpu.agent.claims import ClaimError, ClaimRef
from dra_gpu.agent.status import ClaimEntries, StatusSink
from dra_gpu.devices import edits, model, opaque
from dra_gpu.resource import bodies
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

CLAIM_READS = 16
"""Claims read from the API server at once. The kubelet sends a few at a time; a burst of
hundreds must not open hundreds of connections (each a TLS session kept in the client's pool,
tens of KiB resident, and as many requests at once on the API server)."""


@dataclasses.dataclass(frozen=True)
class AnsweredDevice:
    """One device of a prepared claim, as the kubelet is told of it (its ``Device`` message)."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A claim prepared on this node: the answer for the kubelet, whatever the checkpoint keeps."""

    devices: tuple[AnsweredDevice, ...]

    @classmethod
    def of(cls, record: checkpoint.PreparedClaim) -> Prepared:
        return cls(
            tuple(
                AnsweredDevice(d.request_names, d.pool, d.device, d.cdi_device_ids, d.share_id)
                for d in record.devices
            )
        )


@dataclasses.dataclass(frozen=True)
class PrepareFailed:
    """A per-claim failure, reported in the claim's ``error`` field."""

    message: str


class DeviceState:
    """The claims prepared on this node: what the gRPC servicers and the runner call, over its
    group commit, MIG instances, ``status.devices`` entries and recovery."""

    def __init__(
        self,
        *,
        api: kube.Kube,
        driver: str,
        node: str,
        container_edits: sources.EditsSource,
        cdi_dir: Path,
        checkpoint_file: Path,
        inventory: sources.InventorySource,
        status: StatusSink,
        mig: model.MigInstances | None = None,
        mig_own_layout: bool = False,
        cache: claimcache.ClaimCache | None = None,
        sharing: mps.Sharing | None = None,
        toolkit_cdi_kind: str = "",
        serialize_lock: Path | None = None,
    ) -> None:
        self.api = api
        self._toolkit_cdi_kind = toolkit_cdi_kind  # "": our CDI devices only (agent.toolkit)
        self._cache = cache
        self.driver = driver
        self.node = node
        self._container_edits = container_edits
        self._sharing = sharing
        self.cdi_dir = cdi_dir
        self.checkpoint_file = checkpoint_file
        self._inventory = inventory
        # Per-claim locks keep a prepare and an unprepare of the same claim in order while
        # different claims read the API in parallel; checkpoint changes are group-committed.
        self._claim_locks: dict[str, asyncio.Lock] = {}
        self._commits = commits.GroupCommit(checkpoint_file)
        self._instances = mig_instances.ClaimInstances(mig, cdi_dir, driver)
        self._entries = ClaimEntries(status, driver, node)
        self._recovery = recovery.Recovery(
            api=api,
            driver=driver,
            node=node,
            cdi_dir=cdi_dir,
            commits=self._commits,
            instances=self._instances,
            own_layout=mig_own_layout,
            inventory=inventory,
            container_edits=container_edits,
            write_spec=self._write_spec,
        )
        self._reads = asyncio.Semaphore(CLAIM_READS)
        self._lock = (
            commits.SerializeLock(
                serialize_lock,
                on_acquired=self.sync_with_disk,
                before_release=self._commits.written,
            )
            if serialize_lock is not None
            else None
        )
        self.reloads = 0
        """How often the checkpoint was read again because another agent had written it."""
        self._legacy_base: checkpoint.Checkpoint | None = None
        """Beside an agent of a release before the serialize lock: what it last wrote (it
        never reads what we write, so what it writes is this plus its own changes)."""

    @property
    def prepared(self) -> checkpoint.Checkpoint:
        return self._commits.committed

    @contextlib.asynccontextmanager
    async def serialized(self) -> AsyncIterator[None]:
        """Hold the node's serialize lock (shared by this agent's calls; none without a lock
        file): no other agent prepares, unprepares or writes the checkpoint meanwhile, and
        ``prepared`` is what the checkpoint says."""
        if self._lock is None:
            yield
            return
        async with self._lock.held():
            yield

    async def sync_with_disk(self) -> None:
        """(Holding the serialize lock.) Read the checkpoint again if another agent wrote it
        since we last read or wrote it."""
        await self._commits.written()
        recorded = await asyncio.to_thread(self._commits.read_if_changed)
        if recorded is None:
            return
        before = self.prepared.claims
        if self._legacy_base is not None:
            # Its snapshot lacks what we prepared and unprepared: ours, with its changes.
            base, self._legacy_base = self._legacy_base, recorded
            self._commits.reloaded(checkpoint.merged(self.prepared, base, recorded))
            await asyncio.to_thread(self._commits.write_snapshot)
        else:
            self._commits.reloaded(recorded)
        self.reloads += 1
        added = len(recorded.claims.keys() - before.keys())
        removed = len(before.keys() - recorded.claims.keys())
        log.info(
            "another agent wrote %s: read it again (%d claim(s) prepared, %d unprepared by it)",
            self.checkpoint_file,
            added,
            removed,
        )

    def beside_legacy(self, present: bool) -> None:
        """(Holding the serialize lock, right after ``load``.) Whether an agent of a release
        before the serialize lock (fixed socket names) runs beside us: the old pod of the first
        rolling update from such a release. It takes no lock and never reads the checkpoint
        again, so each of its writes is merged with ours (``checkpoint.merged``) and written
        back at once, until ``present`` is False (it is gone)."""
        self._legacy_base = self.prepared if present else None

    # ---- start and stop ------------------------------------------------------------------

    def load(self, recorded: checkpoint.Checkpoint) -> None:
        """Start from ``recorded`` (read from disk); the next commit writes a new snapshot."""
        self._commits.load(recorded)

    @property
    def retired(self) -> str | None:
        """Why this agent no longer writes the node's checkpoint and CDI specs, if it does not."""
        return self._commits.retired

    def retire(self, reason: str) -> None:
        """Another agent serves the kubelet now, and owns the checkpoint and the CDI directory
        that we share with it: write neither any more. Prepares and unprepares fail."""
        # The journal stays open until ``aclose``: a write may be under way.
        self._commits.retired = reason

    async def resume(self, recorded: checkpoint.Checkpoint) -> list[str]:
        """We serve the kubelet again: take over what the other agent recorded (``recorded``,
        read from disk now) and repair the CDI directory from it."""
        await self._commits.written()
        self._commits.retired = None
        self.load(recorded)
        return await self.recover()

    def _unserialized(self, exc: Exception) -> str:
        lock = self._lock.path if self._lock is not None else "(none)"
        return (
            f"node {self.node}: the agent could not take the serialize lock {lock} or read "
            f"{self.checkpoint_file} again under it: {type(exc).__name__}: {exc}"
        )

    def _check_not_retired(self, ref: ClaimRef) -> None:
        if self.retired is not None:
            raise ClaimError(
                f"ResourceClaim {ref}: this agent no longer serves the node: {self.retired}"
            )

    async def aclose(self) -> None:
        """``close``, once a write still under way (its RPC cancelled at shutdown) is over,
        holding the serialize lock (what another agent wrote meanwhile is read first, and
        folded in with ours); nothing is written if we were retired."""
        try:
            async with self.serialized():
                await self._commits.written()
                if self.retired is None:
                    await asyncio.to_thread(self.close)
                else:
                    self._commits.drop_journal()
        finally:
            if self._lock is not None:
                self._lock.close()

    def close(self) -> None:
        """Fold the journal into a snapshot (an older agent reads only that) and close it.
        Blocking; call it once nothing is prepared or unprepared any more (and, beside another
        agent, holding the serialize lock)."""
        self._commits.close()

    async def recover(self) -> list[str]:
        """Make the MIG instances, the CDI directory and the sharing daemons agree with the
        checkpoint (``recovery``); returns what it repaired."""
        repaired = await self._recovery.recover()
        if self._sharing is not None:
            repaired.extend(await self._sync_sharing())
        return repaired

    def device_health(self, device: str, condition: dict[str, Any]) -> None:
        """``device`` of this node's pool is now as ``condition`` (``claims.health_condition``)
        says: the ``status.devices`` entries of the claims holding it say so too."""
        self._entries.device_health(device, condition)

    async def release_stale(self) -> list[str]:
        """Unprepare recorded claims that no longer need what was prepared (see
        ``claims.stale_reason``): the kubelet lost track of them, e.g. its state was wiped
        while the agent was down, or the record came with a copied disk. A claim that cannot
        be read now is left for the next round."""
        released: list[str] = []
        if self.retired is not None:
            return released
        for uid, record in sorted(self.prepared.claims.items()):
            ref = ClaimRef(record.namespace, record.name, bodies.ClaimUID(uid))
            try:
                current: kube.Body | None = await self.api.get(ref.path)
            except kube.ApiError as exc:
                if not exc.not_found:
                    continue
                current = None
            except Exception as exc:  # the API server may be restarting: next round
                log.info("cannot check claim %s now: %s", ref, exc, extra=ref.log_fields)
                continue
            prepared = [(d.pool, d.device) for d in record.devices]
            reason = claims.stale_reason(current, uid, prepared, self.driver, self.node)
            if reason is None:
                continue
            async with self.serialized():  # read again if another agent wrote meanwhile
                if uid in self.prepared.claims and await self.unprepare(ref) is None:
                    released.append(f"unprepared claim {ref} (uid {uid}): {reason}")
        return released

    # ---- prepare -------------------------------------------------------------------------

    async def prepare_all(self, refs: Sequence[ClaimRef]) -> dict[str, Prepared | PrepareFailed]:
        """Each claim on its own: one bad claim does not fail the others. The batch holds the
        serialize lock."""
        try:
            async with self.serialized():
                if len(refs) == 1:  # the usual request: no task needed
                    return {refs[0].uid: await self.prepare(refs[0])}
                results = await asyncio.gather(*(self.prepare(ref) for ref in refs))
        except Exception as exc:  # the lock, or the checkpoint read again under it
            log.error("prepare of %d claim(s) failed: %s", len(refs), exc)
            failed = PrepareFailed(self._unserialized(exc))
            return {ref.uid: failed for ref in refs}
        return {ref.uid: result for ref, result in zip(refs, results, strict=True)}

    async def prepare(self, ref: ClaimRef) -> Prepared | PrepareFailed:
        started = time.perf_counter()
        try:
            async with self._claim_lock(ref.uid):
                prepared = Prepared.of(await self._prepare(ref))
        except ClaimError as exc:
            result: Prepared | PrepareFailed = PrepareFailed(str(exc))
        except Exception as exc:  # the kubelet gets an answer for every claim, always
            log.exception("prepare of claim %s failed", ref, extra=ref.log_fields)
            result = PrepareFailed(f"ResourceClaim {ref}: {type(exc).__name__}: {exc}")
        else:
            result = prepared
        outcome = "error" if isinstance(result, PrepareFailed) else "success"
        metrics.PREPARES.labels(outcome).inc()
        metrics.PREPARE_SECONDS.labels(outcome).observe(time.perf_counter() - started)
        if isinstance(result, PrepareFailed):
            log.warning("prepare %s: %s", ref, result.message, extra=ref.log_fields)
        return result

    async def _prepare(self, ref: ClaimRef) -> checkpoint.PreparedClaim:
        claims.check_request(ref)
        self._check_not_retired(ref)
        recorded = self.prepared.claims.get(ref.uid)
        if recorded is not None:
            if recorded.cdi_spec is not None:
                await self._ensure_spec(ref.uid, recorded.cdi_spec)
            return recorded
        claim = await self._read_claim(ref)
        claims.check_identity(claim, ref)
        allocated = claims.allocated_devices(claim, ref, self.driver, self.node)
        try:
            configs = opaque.effective_configs(
                bodies.allocation_configs(claim), self.driver, [d.request for d in allocated]
            )
        except opaque.InvalidConfig as exc:
            raise ClaimError(f"ResourceClaim {ref}: {exc}") from None
        devices = await self._inventory_devices(ref, allocated)
        placements = self._instances.placements(ref, allocated, devices, configs)
        instances = await self._instances.create(ref, placements, self.prepared)
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
            await self._commits.commit(checkpoint.Put(record), write_spec)
        except Exception:
            await self._instances.destroy(ref, list(instances.values()), strict=False)
            await self._instances.intended(list(placements.values()))
            if self._sharing is not None:  # a daemon started for this claim alone goes
                self._sharing.release(ref.uid)
                await self._sync_sharing()
            raise
        if self._sharing is not None:
            self._sharing.release(ref.uid)  # the record holds its shares now
        if placements:
            await self._instances.intended(list(placements.values()))  # the record holds them now
        failpoints.reach("before-answer")
        self._entries.set(ref, self._entries.entries(allocated, devices))
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

    async def _read_claim(self, ref: ClaimRef) -> kube.Body:
        cached = await self._cache.read(ref) if self._cache is not None else None
        metrics.CLAIM_READS.labels("api" if cached is None else "cache").inc()
        if cached is not None:
            return cached
        taken = self._cache.take(ref) if self._cache is not None else None
        claim: kube.Body | None = None
        try:
            async with self._reads:
                claim = await self.api.get(ref.path)
            return claim
        except kube.ApiError as exc:
            if exc.not_found:
                raise ClaimError(f"ResourceClaim {ref} not found") from None
            raise ClaimError(f"ResourceClaim {ref}: cannot be read: {exc}") from None
        finally:
            if taken is not None and self._cache is not None:
                self._cache.settle(taken, claim)

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

    # ---- unprepare -----------------------------------------------------------------------

    async def unprepare_all(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareFailed | None]:
        """As ``prepare_all``: each claim on its own, the batch holding the serialize lock."""
        try:
            async with self.serialized():
                if len(refs) == 1:
                    return {refs[0].uid: await self.unprepare(refs[0])}
                results = await asyncio.gather(*(self.unprepare(ref) for ref in refs))
        except Exception as exc:
            log.error("unprepare of %d claim(s) failed: %s", len(refs), exc)
            failed = PrepareFailed(self._unserialized(exc))
            return {ref.uid: failed for ref in refs}
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
            log.warning("unprepare %s: %s", ref, exc, extra=ref.log_fields)
        except Exception as exc:
            log.exception("unprepare of claim %s failed", ref, extra=ref.log_fields)
            error = PrepareFailed(f"ResourceClaim {ref}: {type(exc).__name__}: {exc}")
        outcome = "error" if error else "success"
        metrics.UNPREPARES.labels(outcome).inc()
        metrics.UNPREPARE_SECONDS.labels(outcome).observe(time.perf_counter() - started)
        return error

    async def _unprepare(self, ref: ClaimRef) -> None:
        if self._cache is not None:
            self._cache.unprepared(ref)
        self._check_not_retired(ref)
        delete_spec = functools.partial(self._delete_spec_blocking, ref.uid)
        recorded = self.prepared.claims.get(ref.uid)
        if recorded is None:
            # The spec goes even for an unrecorded claim: it may be a leak of a crashed prepare.
            await asyncio.to_thread(delete_spec)
            return
        # Before the entry goes: a crash in between leaves a record whose instance is gone,
        # which recovery creates again and the kubelet's retry destroys; never a leak.
        await self._instances.destroy(ref, recorded.mig_instances(), strict=True)
        await self._commits.commit(checkpoint.Delete(ref.uid), delete_spec)
        self._entries.set(ref, [])
        if self._sharing is not None and any(d.share_id for d in recorded.devices):
            for line in await self._sync_sharing():  # the last share of a GPU stops its daemon
                log.info("claim %s: %s", ref, line, extra=ref.log_fields)

    # ---- helpers -------------------------------------------------------------------------

    def _claim_lock(self, uid: str) -> asyncio.Lock:
        return self._claim_locks.setdefault(uid, asyncio.Lock())

    async def _recorded_shares(self) -> list[mps.SharedGpu]:
        """The shared GPUs that recorded claims hold shares of, as the inventory has them."""
        held = {
            d.device
            for c in self.prepared.claims.values()
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

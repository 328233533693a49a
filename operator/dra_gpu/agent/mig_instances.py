"""The MIG instances the agent creates for the claims it prepares, and its intents file.

Prepare of a MIG partition creates its GPU and compute instance (``ClaimInstances.create``)
before the claim's spec and checkpoint entry; unprepare destroys it (``destroy``) before the
entry goes, so a recorded claim always has its instance. Before creating, prepare writes the
placements it is about to create to an intents file (on the CDI directory's tmpfs), so a crash
between creation and the checkpoint write leaves an instance that nothing records but that is
known to be ours: ``recovery`` reads the file at start and destroys it.

Owns the intents file and which placements a claim's partitions need (``placements``, which
checks ``migProfile``). Must not record anything in the checkpoint (the caller does, and then
says ``intended``) nor decide about instances it did not make (``recovery`` does).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_gpu.agent import checkpoint, claims, failpoints, files
from dra_gpu.agent.claims import ClaimError, ClaimRef
from dra_gpu.devices import mig, model, opaque

log = logging.getLogger(__name__)

MIG_INTENTS_DIR = ".dra-gpu-mig-intents"
"""Under the CDI directory: the MIG instances each driver's agent is creating now."""


class ClaimInstances:
    """The MIG instances of claims, made through ``backend`` (None: a backend that cannot
    create them, so a claim of a MIG partition fails)."""

    def __init__(self, backend: model.MigInstances | None, cdi_dir: Path, driver: str) -> None:
        self.backend = backend
        self.intents_file = cdi_dir / MIG_INTENTS_DIR / f"{driver}.json"
        """The MIG instances being created now: on the CDI directory's tmpfs (it outlives an
        agent crash, not a reboot, as MIG instances do), in a directory CDI runtimes skip."""
        self._intents: set[model.MigPlacement] = set()  # instances being made now
        self._intents_lock = asyncio.Lock()

    def placements(
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
            if self.backend is None:
                raise ClaimError(
                    f"ResourceClaim {ref}: {alloc.device} is a MIG partition, and this "
                    "node's backend cannot create MIG instances"
                )
            placements[alloc.device] = placement
        return placements

    async def create(
        self,
        ref: ClaimRef,
        placements: Mapping[str, model.MigPlacement],
        recorded: checkpoint.Checkpoint,
    ) -> dict[str, model.MigInstance]:
        """The MIG instance of each placement, created now; all or none. A placement that a
        claim in ``recorded`` holds is never created twice."""
        created: dict[str, model.MigInstance] = {}
        if not placements:
            return created
        assert self.backend is not None  # checked by placements
        held = {
            i.placement: c
            for c in recorded.claims.values()
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
                created[device] = await self.backend.create_mig_instance(placement)
                log.info("claim %s: created MIG instance %s", ref, created[device])
        except Exception as exc:
            await self.destroy(ref, list(created.values()), strict=False)
            await self.intended(list(placements.values()))
            raise ClaimError(f"ResourceClaim {ref}: {exc}") from None
        failpoints.reach("mig-instance-created")
        return created

    async def destroy(
        self, ref: ClaimRef, instances: Sequence[model.MigInstance], *, strict: bool
    ) -> None:
        """Destroy ``instances``; with ``strict``, a failure is the claim's error (the kubelet
        retries unprepare), else it is logged (the next start's reconciliation retries)."""
        for instance in instances:
            assert self.backend is not None
            try:
                await self.backend.destroy_mig_instance(instance)
            except Exception as exc:
                if strict:
                    raise ClaimError(
                        f"ResourceClaim {ref}: cannot destroy MIG instance {instance}: {exc}"
                    ) from None
                log.error("claim %s: cannot destroy MIG instance %s: %s", ref, instance, exc)
            else:
                log.info("claim %s: destroyed MIG instance %s", ref, instance)

    async def _intend(self, placements: Sequence[model.MigPlacement]) -> None:
        """Say, before creating them, that the instances at ``placements`` are this agent's:
        a crash before the claim is recorded leaves instances that ``recover`` then knows to
        destroy, while others' instances are left alone."""
        async with self._intents_lock:
            await self._write_intents({*self._intents, *placements}, durable=True)

    async def intended(self, placements: Sequence[model.MigPlacement]) -> None:
        """The claim of ``placements`` is recorded (or its instances destroyed)."""
        async with self._intents_lock:
            left = self._intents - set(placements)
            if left != self._intents:
                await self._write_intents(left, durable=False)

    async def read_intents(self) -> set[model.MigPlacement]:
        """The placements the intents file names: instances a crashed agent was making."""
        return await asyncio.to_thread(_read_intents, self.intents_file)

    async def clear_intents(self) -> None:
        """Nothing is being made: the intents that ``read_intents`` found are dealt with."""
        await self._write_intents(set(), durable=False)

    async def _write_intents(self, intents: set[model.MigPlacement], *, durable: bool) -> None:
        self._intents = intents
        await asyncio.to_thread(_write_intents, self.intents_file, intents, durable)


def _read_intents(path: Path) -> set[model.MigPlacement]:
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


def _write_intents(path: Path, intents: set[model.MigPlacement], durable: bool) -> None:
    body = [{"parent": p.parent, "profile": p.profile, "start": p.start} for p in sorted(intents)]
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    files.atomic_write(path, json.dumps(body).encode(), durable=durable)

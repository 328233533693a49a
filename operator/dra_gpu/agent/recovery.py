"""Recovery at start: the MIG instances and the CDI directory made to agree with the checkpoint.

The checkpoint is the record; whatever a crash or a power cut left on the node is brought in
line with it (``Recovery.recover``), before the kubelet's retries come:

- CDI specs without an entry are leaks (the kubelet never got an answer and will ask again) and
  are deleted; entries whose spec is missing (a reboot empties the tmpfs) or not what was
  recorded (specs are not fsync'd) get it written again.
- MIG instances this agent made that no recorded claim holds (a crash between creating one and
  recording it: the intents file of ``mig_instances`` says so) are destroyed. Instances neither
  recorded nor intended are someone else's (the GPU Operator's mig-manager): left alone,
  reported on the Node, and their placements not offered (``MigInstances.adopt_mig_instances``),
  unless the agent owns the layout (``own_layout``: they are destroyed). Recorded ones that are
  missing (a reboot: MIG instances do not survive a GPU reset) are created again, and the
  claim's record and spec rewritten if the new MIG device has another UUID. The GPUs whose MIG
  management NVML refuses (no privileges) are reported as a Warning Event on the Node.

Owns nothing on disk; changes the checkpoint through ``commits`` only. A failure is reported
among the lines it returns and the rest goes on: the agent must start. Must not prepare or
unprepare a claim (``state`` does), nor touch the sharing daemons (``state`` syncs them after).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from dra_gpu import kube
from dra_gpu.agent import cdi, checkpoint, commits, mig_instances, sources
from dra_gpu.devices import edits, mig, model
from dra_gpu.kube import events
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)

EVENT_COMPONENT = "dra-gpu-agent"


class Recovery:
    """The repairs of one agent's node, over the state it was given (see ``DeviceState``)."""

    def __init__(
        self,
        *,
        api: kube.Kube,
        driver: str,
        node: str,
        cdi_dir: Path,
        commits: commits.GroupCommit,
        instances: mig_instances.ClaimInstances,
        own_layout: bool,
        inventory: sources.InventorySource,
        container_edits: sources.EditsSource,
        write_spec: Callable[[str, cdi.CdiSpec], Awaitable[None]],
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.cdi_dir = cdi_dir
        self._commits = commits
        self._instances = instances
        self._own_layout = own_layout
        self._inventory = inventory
        self._container_edits = container_edits
        self._write_spec = write_spec

    async def recover(self) -> list[str]:
        """Make the MIG instances and the CDI directory agree with the checkpoint; returns
        what it repaired."""
        repaired = await self._reconcile_mig()
        on_disk = await asyncio.to_thread(cdi.list_claim_specs, self.cdi_dir, self.driver)
        for uid in sorted(set(on_disk) - set(self._commits.committed.claims)):
            await asyncio.to_thread(cdi.delete_claim_spec, self.cdi_dir, self.driver, uid)
            repaired.append(f"deleted CDI spec of unrecorded claim {uid}")
        for uid, claim in sorted(self._commits.committed.claims.items()):
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
        return repaired

    async def _reconcile_mig(self) -> list[str]:
        """Destroy the MIG instances this agent made that no recorded claim holds (a crash
        between creating one and recording it: the intents file says so); leave the instances
        of others alone, unless this agent owns the GPUs' MIG layout (``own_layout``: then
        every unrecorded instance goes); create the recorded ones that are missing. Report the
        GPUs whose MIG management NVML refuses. A failure is reported and the rest goes on: the
        agent must start."""
        backend = self._instances.backend
        if backend is None:
            return []
        recorded = {
            d.mig_instance.placement: (claim, d.device, d.mig_instance)
            for claim in self._commits.committed.claims.values()
            for d in claim.devices
            if d.mig_instance is not None
        }
        present = {i.placement: i for i in await backend.mig_instances()}
        # Until the record is complete nothing counts as someone else's (a rebuilt checkpoint
        # finds its claims' partitions in the inventory).
        backend.adopt_mig_instances({*recorded, *present})
        repaired = await self._report_mig_refusals(backend)
        repaired += await self._adopt_mig_instances(present)
        recorded = {
            d.mig_instance.placement: (claim, d.device, d.mig_instance)
            for claim in self._commits.committed.claims.values()
            for d in claim.devices
            if d.mig_instance is not None
        }
        intended = await self._instances.read_intents()
        left: list[model.MigInstance] = []
        for placement, instance in sorted(present.items()):
            if placement in recorded:
                continue
            if placement not in intended and not self._own_layout:
                left.append(instance)
                continue
            try:
                await backend.destroy_mig_instance(instance)
            except Exception as exc:
                repaired.append(f"could not destroy MIG instance {instance}: {exc}")
                continue
            repaired.append(f"destroyed MIG instance {instance}: no prepared claim holds it")
        backend.adopt_mig_instances(set(recorded))
        repaired += await self._report_foreign_instances(left)
        for placement, (claim, device, was) in sorted(recorded.items()):
            now = present.get(placement)
            what = f"MIG instance {placement} of claim {claim.namespace}/{claim.name}"
            if now is None:
                try:
                    now = await backend.create_mig_instance(placement)
                except Exception as exc:
                    repaired.append(f"could not create {what} again: {exc}")
                    continue
                repaired.append(f"created {what} again (lost in a reboot?)")
            if now != was:
                current = self._commits.committed.claims[claim.uid]
                nodes = await self._mig_device_nodes(claim, device, now)
                await self._commits.commit(
                    checkpoint.Put(current.with_mig_instance(device, now, nodes))
                )
        if intended:
            await self._instances.clear_intents()
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

    async def _report_mig_refusals(self, backend: model.MigInstances) -> list[str]:
        """A Warning Event on the Node, a log line and the ``dra_gpu_mig_management`` gauge for
        each MIG-mode GPU whose MIG management NVML refuses; the managed ones on the gauge."""
        refusals = backend.mig_refusals()
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
        recorded = self._commits.committed
        held = {
            d.mig_instance.placement
            for c in recorded.claims.values()
            for d in c.devices
            if d.mig_instance is not None
        }
        bare = [
            (c, d.device)
            for c in recorded.claims.values()
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
            current = self._commits.committed.claims[claim.uid]
            await self._commits.commit(
                checkpoint.Put(current.with_mig_instance(name, present[placement]))
            )
            adopted.append(
                f"recorded MIG instance {present[placement]} of claim "
                f"{claim.namespace}/{claim.name}"
            )
        return adopted


def _same_content(path: Path, spec: cdi.CdiSpec) -> bool:
    try:
        return path.read_bytes() == cdi.spec_bytes(spec)
    except FileNotFoundError:
        return False

"""MIG instances as a backend sees them: where one goes, one that exists, a refusal to manage them,
and the optional backend capability that makes and unmakes them.

Owns ``MigPlacement`` (what a partition device stands for), ``MigInstance``, ``MigRefusal`` and
the ``MigInstances`` protocol. Must not: hold MIG profile tables or counter layouts
(``devices.mig`` does), or call NVML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True, order=True)
class MigPlacement:
    """Where a MIG GPU instance goes: a GPU (its whole-GPU device name), a MIG profile as
    NVIDIA spells it, and the first memory slice it occupies. What a partition device stands
    for (``mig.placement_of``), and what is created when one is prepared."""

    parent: str
    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.parent} {self.profile} at memory slice {self.start}"


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """A MIG GPU instance and the compute instance in it, as they exist on a GPU."""

    placement: MigPlacement
    gpu_instance: int
    """The GPU instance's id on its GPU (NVML's GI id)."""
    compute_instance: int | None
    """The compute instance's id in it; None for a GPU instance without one (left half made)."""
    uuid: str
    """``MIG-<uuid>`` of the MIG device (what ``NVIDIA_VISIBLE_DEVICES`` names); empty without
    a compute instance."""

    def __str__(self) -> str:
        return f"{self.placement} (GPU instance {self.gpu_instance}, {self.uuid or 'no CI'})"


@dataclasses.dataclass(frozen=True)
class MigRefusal:
    """A GPU in MIG mode whose MIG instances this agent may not manage: NVML answered
    ``NVML_ERROR_NO_PERMISSION`` (an agent without ``CAP_SYS_ADMIN`` and
    ``NVIDIA_MIG_CONFIG_DEVICES``). Its partitions are not published: none could be prepared."""

    gpu: str
    """The GPU's device name (``gpu-0``)."""
    uuid: str
    call: str
    """The NVML function that refused (``nvmlDeviceGetGpuInstancePossiblePlacements``)."""
    error: str
    """NVML's message (``Insufficient Permissions``)."""

    def __str__(self) -> str:
        return (
            f"{self.gpu} ({self.uuid}) is in MIG mode, but NVML refused "
            f"{self.call} ({self.error}): creating and destroying MIG instances needs a "
            f"privileged agent (CAP_SYS_ADMIN and NVIDIA_MIG_CONFIG_DEVICES=all; chart value "
            f"agent.mig.manage=true), so none of its partitions is published"
        )


@runtime_checkable
class MigInstances(Protocol):
    """An optional backend capability: MIG instances made and unmade on the node's GPUs.

    A backend that publishes MIG partitions has it; the agent asks ``isinstance(backend,
    MigInstances)`` and knows no backend by name. The agent owns the MIG instances it made: one
    per prepared partition; others' instances (a layout of the GPU Operator's mig-manager) are
    left alone unless the agent is told it owns the layout (``--mig-own-layout``). The async
    methods block nothing on the event loop and raise ``InventoryError`` naming the GPU and
    what failed; the others only read or set what the backend keeps in memory.
    """

    async def mig_instances(self) -> tuple[MigInstance, ...]:
        """Every MIG instance on the node's partitioned GPUs now (none of a GPU that refuses to
        list them: ``mig_refusals``)."""
        ...

    async def create_mig_instance(self, placement: MigPlacement) -> MigInstance:
        """Create the GPU instance of ``placement`` and a compute instance spanning it. If one
        exists at exactly that placement already, it is returned as it is (a retried call)."""
        ...

    async def destroy_mig_instance(self, instance: MigInstance) -> None:
        """Destroy the compute instance, then the GPU instance; one that is gone already (a
        reboot, a retried call) is not an error."""
        ...

    def adopt_mig_instances(self, placements: Collection[MigPlacement]) -> None:
        """The instances at ``placements`` are the agent's (its checkpoint records them), as
        are those it creates from now on: any other instance on a GPU is someone else's, left
        alone, and no partition that cannot be created beside it is published."""
        ...

    def mig_refusals(self) -> tuple[MigRefusal, ...]:
        """The GPUs in MIG mode whose instances NVML refused to list or manage when last
        asked (no privileges); their partitions are not published."""
        ...

"""The backend protocol: what the agent asks of wherever its devices come from.

Owns ``Backend``: the inventory, the container edits of a claim's devices, the faults seen, and
closing. The agent knows no backend by name; a new backend is one new module of ``devices``.
Must not: name a backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from dra_gpu.devices import health
from dra_gpu.devices.model.inventory import Inventory

if TYPE_CHECKING:
    from dra_gpu.devices import edits


class Backend(Protocol):
    """Where an agent's devices come from. ``inventory`` never blocks the event loop.

    A backend also says what a container given a claim's devices gets (``container_edits``):
    the agent puts that into the claim's CDI spec and knows no backend by name, so a new
    backend is one new module here.
    """

    async def inventory(self) -> Inventory: ...

    async def container_edits(self, devices: Sequence[edits.GivenDevice]) -> edits.ClaimEdits:
        """What a container given ``devices`` (one claim's, in allocation order) gets: the
        claim-wide part once, and one ``Edits`` per device (``devices.edits``). Raises
        ``InventoryError`` naming the device when it cannot be said (a node file missing)."""
        ...

    async def faults(self) -> tuple[health.Fault | health.Reset, ...]:
        """Faults seen since the last call (NVML events) and those still going on (a lost GPU,
        an entry of the simulated faults file), and the GPUs seen reset since (``Reset``: their
        reset-needing taints go). Called every few seconds; never blocks."""
        ...

    async def aclose(self) -> None: ...

"""What the agent's ``DeviceState`` reads of the rest of the agent, as callables it is given.

Owns the two types only: the node's inventory (the publisher's, cached) and what a container
given a claim's devices gets (the backend's ``container_edits``). Must not hold any state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from dra_gpu.devices import edits, model

InventorySource = Callable[[bool], Awaitable[model.Inventory]]
"""Returns the node's inventory; ``True`` asks for a fresh read instead of the cached one."""

EditsSource = Callable[[Sequence[edits.GivenDevice]], Awaitable[edits.ClaimEdits]]
"""What a container given a claim's devices gets (``model.Backend.container_edits``)."""

"""The inventory model's errors: what cannot be published, and a profile that cannot be used.

Owns the two exception types every backend raises and everything above catches (the agent
refuses an inventory, the CLI names the file and field). Must not: import anything of the model,
so every part can raise them.

Errors::

    ValueError
    └── InventoryError   an inventory, device or value that cannot be published as it is
        └── ProfileError a simulated-inventory profile that cannot be used (names file and field)
"""

from __future__ import annotations


class InventoryError(ValueError):
    """An inventory, device or value that cannot be published as it is."""


class ProfileError(InventoryError):
    """A simulated-inventory profile that cannot be used; the message names file and field."""

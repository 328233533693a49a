"""The node agent's device inventory: what a backend found, in the shape the API can publish.

Both backends (NVML and the simulated profile) produce these types, so everything above them
(slices, prepare, health) is exercised in CI without a GPU. The model owns the API's naming and
value rules for devices (DNS-label device names, qualified attribute and capacity names,
quantities, semver versions, the 32-entry limit) and checks them when an object is built, so
an inventory that exists is one the API server will accept. It does no I/O.

This is the model's face: callers write ``model.Device``, ``model.InventoryError``. Its parts,
one concern each:

- ``errors``: ``InventoryError`` and ``ProfileError``;
- ``values``: quantities, byte counts, semver versions and the attribute value types;
- ``policy``: how a shared GPU is shared (``Sharing``, ``MemoryPolicy``);
- ``inventory``: ``Device``, ``CounterSet``, ``Inventory``;
- ``gpu``: ``gpu_device``, a whole GPU with the attributes every backend publishes;
- ``backend``: the ``Backend`` protocol;
- ``instances``: MIG placements, instances and refusals, and the ``MigInstances`` capability.

Errors::

    ValueError
    └── InventoryError   an inventory, device or value that cannot be published as it is
        └── ProfileError a simulated-inventory profile that cannot be used (names file and field)
"""

from dra_gpu.devices.model.backend import Backend
from dra_gpu.devices.model.errors import InventoryError, ProfileError
from dra_gpu.devices.model.gpu import PCI_BUS_ID_ATTRIBUTE, gpu_device
from dra_gpu.devices.model.instances import MigInstance, MigInstances, MigPlacement, MigRefusal
from dra_gpu.devices.model.inventory import (
    MAX_ATTRIBUTES_AND_CAPACITY,
    MAX_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTERS_PER_SET,
    MAX_TAINTS,
    CounterSet,
    Device,
    Inventory,
)
from dra_gpu.devices.model.policy import SHARING_MODES, TIME_SLICES, MemoryPolicy, Sharing
from dra_gpu.devices.model.values import (
    MAX_VALUE_LENGTH,
    AttributeValue,
    BoolValue,
    IntValue,
    StringValue,
    VersionValue,
    format_bytes,
    is_semver,
    normalize_version,
    parse_quantity,
)

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITY",
    "MAX_CONSUMPTIONS_PER_DEVICE",
    "MAX_COUNTERS_PER_SET",
    "MAX_TAINTS",
    "MAX_VALUE_LENGTH",
    "PCI_BUS_ID_ATTRIBUTE",
    "SHARING_MODES",
    "TIME_SLICES",
    "AttributeValue",
    "Backend",
    "BoolValue",
    "CounterSet",
    "Device",
    "IntValue",
    "Inventory",
    "InventoryError",
    "MemoryPolicy",
    "MigInstance",
    "MigInstances",
    "MigPlacement",
    "MigRefusal",
    "ProfileError",
    "Sharing",
    "StringValue",
    "VersionValue",
    "format_bytes",
    "gpu_device",
    "is_semver",
    "normalize_version",
    "parse_quantity",
]

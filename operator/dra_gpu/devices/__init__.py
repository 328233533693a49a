"""Where the node agent's devices come from: the inventory model and its two backends.

``model`` holds the types every backend produces; ``simulated`` reads a YAML profile and
``nvml`` reads the real GPUs. Nothing here talks to Kubernetes; ``dra_gpu.agent.slices`` turns an
inventory into ResourceSlice bodies.
"""

from dra_gpu.devices.model import (
    AttributeValue,
    Backend,
    BoolValue,
    Device,
    IntValue,
    Inventory,
    InventoryError,
    ProfileError,
    StringValue,
    VersionValue,
    gpu_device,
)
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.devices.simulated import Profile, SimulatedBackend, load_profile, parse_profile

__all__ = [
    "AttributeValue",
    "Backend",
    "BoolValue",
    "Device",
    "IntValue",
    "Inventory",
    "InventoryError",
    "NvmlBackend",
    "Profile",
    "ProfileError",
    "SimulatedBackend",
    "StringValue",
    "VersionValue",
    "gpu_device",
    "load_profile",
    "parse_profile",
]

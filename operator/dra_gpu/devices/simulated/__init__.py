"""The simulated backend: GPUs described per node in a YAML profile, for clusters without GPUs.

This is the backend's face: callers write ``simulated.SimulatedBackend``,
``simulated.parse_profile``. Its parts:

- ``profile``: the profile format and its strict parsing (``Profile``, ``load_profile``,
  ``parse_profile``);
- ``faults``: the faults file and its parsing (``load_faults``, ``parse_faults``);
- ``backend``: ``SimulatedBackend``, a node's devices served from a profile, with the simulated
  GPUs' MIG instances and settings.
"""

from dra_gpu.devices.simulated.backend import SimulatedBackend
from dra_gpu.devices.simulated.faults import load_faults, parse_faults
from dra_gpu.devices.simulated.profile import (
    MAX_COUNT,
    MAX_NUMA_NODE,
    Profile,
    load_profile,
    parse_profile,
)

__all__ = [
    "MAX_COUNT",
    "MAX_NUMA_NODE",
    "Profile",
    "SimulatedBackend",
    "load_faults",
    "load_profile",
    "parse_faults",
    "parse_profile",
]

"""The NVML backend: the node's real GPUs, read through pynvml.

This is the backend's face: callers write ``nvml.NvmlBackend``, ``nvml.NvmlApi``. pynvml is
imported only when a backend is made without an API given, so a node without the NVIDIA
driver can import this package and run the simulated backend. Its parts, each over the next:

- ``backend``: ``NvmlBackend``, the GPUs read into the inventory model (and shared, as
  ``--shared-gpus`` says), the claims' CDI edits, the settings sharing needs on a GPU;
- ``watch``: health, the events thread (XIDs, ECC errors) and the polls of lost GPUs and
  recovery actions;
- ``instances``: MIG instances made, listed and destroyed (``model.MigInstances``), and the
  GPUs that refuse to have theirs managed;
- ``session``: ``NvmlApi`` (the pynvml surface used), ``NvmlCallFailed``, and the one NVML
  initialisation and call wrapper everything above goes through.
"""

from dra_gpu.devices.nvml.backend import NvmlBackend, cuda_version, pci_bus_id
from dra_gpu.devices.nvml.health_watch import (
    EVENT_WAIT_MS,
    MAX_QUEUED_FAULTS,
    NO_INSTANCE,
    WATCH_RESTART_SECONDS,
)
from dra_gpu.devices.nvml.session import NvmlApi, NvmlCallFailed

__all__ = [
    "EVENT_WAIT_MS",
    "MAX_QUEUED_FAULTS",
    "NO_INSTANCE",
    "WATCH_RESTART_SECONDS",
    "NvmlApi",
    "NvmlBackend",
    "NvmlCallFailed",
    "cuda_version",
    "pci_bus_id",
]

"""dra-gpu: a Kubernetes Dynamic Resource Allocation (DRA) driver for GPUs."""

__version__ = "0.1.0"
DEFAULT_DRIVER_NAME = "gpu.example.com"

"""dra-gpu: a Kubernetes Dynamic Resource Allocation (DRA) driver for GPUs."""

import os as _os

__version__ = "0.1.0"
DEFAULT_DRIVER_NAME = "gpu.example.com"

# An image's uid (65532) has no passwd entry; without HOME as well, a process has no home at
# all, and the Kubernetes client (imported by Kopf too) resolves ~/.kube/config at import time:
# it raises there. Such a process gets /, as container runtimes give it. Here, because this
# runs before any of our modules, and so before any import of the client.
if _os.path.expanduser("~") == "~":
    _os.environ["HOME"] = "/"

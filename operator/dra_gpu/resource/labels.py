"""The labels dra-gpu puts on the objects it owns, so that it finds them again (and only them)."""

from __future__ import annotations

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "dra-gpu"
NODE_LABEL = "resource.dra-gpu.io/node"
"""A ResourceSlice's node: its name, or a shortened unique form if it is longer than a label
value may be (63)."""

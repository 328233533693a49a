"""Why is a ResourceClaim pending? The pure reasoning behind the controller's explanations.

Owns: given API bodies (the claim, the pod that uses it, DeviceClasses, ResourceSlices, the
other claims, Nodes), say which of the tutorial's four pieces is missing (class, devices,
node, driver), per request and for the claim as a whole, in the plain words the controller
posts as a Warning Event and ``dra-gpu explain`` prints. Selectors are evaluated through
``dra_gpu.cel`` the way the scheduler does: class selectors first, then the request's, over
complete pools at their highest generation only.

Must not: do any I/O (no client, no clock, no logging, no files) or change its inputs; dicts
in, frozen dataclasses out. It does not allocate and is not a second scheduler: it looks at
each request on its own (constraints such as ``matchAttribute``, requests competing for one
device and the pod's other resources are not modelled), so its answer is "the first missing
piece we can see". The output is deterministic (devices in natural order, bounded lists), so
the controller can post "the same reason once".

The cluster side of the reasoning is a ``World``, built once and read by every claim's check:
``explain_claim`` builds one from lists for one claim; the controller keeps a ``Layout`` (devices
in order, per selector list their outcomes) until a pool changes and builds a ``World`` per pass
over its view's indexes, and calls ``explain`` for the claims whose inputs changed.

This face re-exports what callers use; the parts, each one concern:

- ``results``: the vocabulary (``Reason`` most important first, ``Verdict``, ``Piece``),
  the frozen results and their JSON form (``to_dict``); ``wording``: the limits and
  formatters of messages;
- ``claims``: the entry points, and a claim summed up from its requests; ``allocated``: an
  allocated claim, the driver piece from the kubelet's ``PrepareFailure``
  (``dra_gpu.controller.kubelet``), and the all-clear;
- ``world``: ``Layout``, ``Checks``, ``World`` and one claim's ``Scope``; ``node_filters``:
  whether the pod can run on a node;
- ``requests``: one request (class, compile errors, ``firstAvailable``); ``matching``: the
  request check against every device, partitions and shares included; ``mismatches``: why a
  selector rules a device out, from ``cel.comparison``; ``taints``: device taints.
"""

from dra_gpu.controller.explain.allocated import driver_not_ready, prepared
from dra_gpu.controller.explain.claims import explain, explain_claim, format_pieces
from dra_gpu.controller.explain.requests import class_names, selector_lists
from dra_gpu.controller.explain.results import (
    PIECE_NAMES,
    DeviceVerdict,
    Explanation,
    Piece,
    Reason,
    RequestExplanation,
    Verdict,
    to_dict,
)
from dra_gpu.controller.explain.taints import device_taint_text
from dra_gpu.controller.explain.wording import (
    LIST_LIMIT,
    MESSAGE_LIMIT,
    NOT_CHECKED,
    REQUEST_LIMIT,
)
from dra_gpu.controller.explain.world import Checks, Layout, World, build_world
from dra_gpu.controller.kubelet import PREPARE_FAILED, PrepareFailure, prepare_failure

__all__ = [
    "LIST_LIMIT",
    "MESSAGE_LIMIT",
    "NOT_CHECKED",
    "PIECE_NAMES",
    "PREPARE_FAILED",
    "REQUEST_LIMIT",
    "Checks",
    "DeviceVerdict",
    "Explanation",
    "Layout",
    "Piece",
    "PrepareFailure",
    "Reason",
    "RequestExplanation",
    "Verdict",
    "World",
    "build_world",
    "class_names",
    "device_taint_text",
    "driver_not_ready",
    "explain",
    "explain_claim",
    "format_pieces",
    "prepare_failure",
    "prepared",
    "selector_lists",
    "to_dict",
]

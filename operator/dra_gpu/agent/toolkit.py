"""The NVIDIA Container Toolkit's own CDI spec, for nodes whose workloads get GPUs through CDI only.

Our claim specs give a container its GPUs' device nodes and ``NVIDIA_VISIBLE_DEVICES`` but not
the driver: its libraries, binaries and firmware, and the hooks that make them usable
(``nvidia-cdi-hook`` ``create-symlinks``, ``update-ldcache``, ``enable-cuda-compat``). On a node
without the toolkit's runtime for workloads, the toolkit's spec (``nvidia-ctk cdi generate``)
carries those, in its top-level ``containerEdits`` (nvcdi's ``GetCommonEdits``: control nodes,
driver files, graphics mounts, hooks, and ``NVIDIA_VISIBLE_DEVICES=void``), and the runtime
applies them to a container given any of its devices. So prepare answers, for each device, that
spec's device first and ours after it (``device_ids``), as NVIDIA's device plugin in CDI mode
answers the IDs of the spec it generates with the same nvcdi (``internal/cdi``).

Names, from the toolkit's source (``pkg/nvcdi/namer.go``, ``cmd/nvidia-ctk/cdi/generate``):
kind ``nvidia.com/gpu`` (``--vendor``, ``--class``); with ``--device-name-strategy=uuid`` a GPU
is ``GPU-<uuid>`` and a MIG device ``MIG-<uuid>`` (``index``: ``0``, ``0:1``; ``type-index``:
``gpu0``, ``mig0:1``). The default strategies are ``index`` and ``uuid`` since v1.15.0. Only
``uuid`` names are used here: an index is an enumeration position at generation time, and a
spec that has gone stale (a GPU lost or added since) resolves it to another GPU's
``/dev/nvidia<N>``, silently, where a stale UUID fails as an unresolvable device.

A MIG partition gets its parent GPU's device: its MIG device is made at prepare, long after the
spec was generated, and the parent's device gives the driver and ``/dev/nvidia<N>`` while our
spec gives the instance's capability nodes (NVIDIA's DRA driver builds a MIG device's spec the
same way, from its parent's full-GPU spec plus those nodes). Since toolkit v1.18.0 ``--device-id
all`` (the default) leaves out the whole-GPU device of a GPU in MIG mode; naming each GPU
(``--device-id=GPU-<uuid>``, v1.19.0) puts it in (``generate_command``).

Order: the runtime applies a spec's top-level edits the first time one of its devices comes,
then each device's, in the order given, and a later value of a variable replaces an earlier one
(``Cache.InjectDevices``, ``ContainerEdits.Apply``). The toolkit's device first makes our
edits come after its ``NVIDIA_VISIBLE_DEVICES=void``: the variable lists the claim's GPUs. In
this set-up nothing on the node reads it (``void`` is for the toolkit's runtime, which is not
there); a node that also runs workloads under that runtime would see it inject the GPUs again,
so the two set-ups are not combined.

``device_ids``, ``missing`` and the messages are pure; ``declared`` reads the CDI directory
(blocking).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dra_gpu.devices import model

log = logging.getLogger(__name__)

_SPEC_SUFFIXES = (".json", ".yaml", ".yml")


def toolkit_name(device: model.Device) -> str:
    """The toolkit's ``uuid`` name of the device that gives ``device`` the driver: the GPU's
    ``GPU-<uuid>``, for a MIG partition its parent's."""
    if device.partition_of is not None:
        parent = device.attributes.get("parentUUID")
        if isinstance(parent, model.StringValue) and parent.value:
            return parent.value
    return device.uuid


def device_ids(kind: str, devices: Iterable[model.Device]) -> dict[str, tuple[str, ...]]:
    """Device name -> the CDI device IDs prepare answers before ours: the toolkit's
    ``<kind>=<name>`` (module docstring). Empty ``kind``: none (the default set-up)."""
    if not kind:
        return {}
    return {d.name: (f"{kind}={toolkit_name(d)}",) for d in devices}


def missing(declared: set[str] | None, devices: Iterable[model.Device]) -> list[str]:
    """The toolkit device names ``devices`` need that ``declared`` lacks, sorted; every one
    when no spec of the kind was found (``declared`` None)."""
    wanted = {toolkit_name(d) for d in devices}
    return sorted(wanted - (declared or set()))


def declared(cdi_dir: Path, kind: str) -> set[str] | None:
    """The device names that spec files in ``cdi_dir`` declare for ``kind``; None when no spec
    there is of that kind. Files that cannot be read or parsed are skipped (debug log): they
    are someone else's, and the runtime judges them itself."""
    found: set[str] | None = None
    try:
        paths = sorted(p for p in cdi_dir.iterdir() if p.suffix in _SPEC_SUFFIXES)
    except OSError:
        return None
    for path in paths:
        spec = _read(path)
        if spec is None or spec.get("kind") != kind:
            continue
        found = found or set()
        for device in spec.get("devices") or []:
            if isinstance(device, dict) and isinstance(device.get("name"), str):
                found.add(device["name"])
    return found


def _read(path: Path) -> Mapping[str, Any] | None:
    try:
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as err:
        log.debug("CDI spec %s not read: %s", path, err)
        return None
    return spec if isinstance(spec, dict) else None


def generate_command(cdi_dir: Path, *, mig: bool) -> str:
    """What makes the spec on a node, into the agent's CDI directory (so that the agent can
    check it); with ``mig`` a whole-GPU device for every GPU, MIG mode or not (toolkit
    v1.19.0 or later)."""
    devices = (
        "$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed 's/^/--device-id=/') "
        if mig
        else ""
    )
    return (
        f"nvidia-ctk cdi generate --device-name-strategy=uuid {devices}"
        f"--output={cdi_dir / 'nvidia.yaml'}"
    )


def advice(kind: str, cdi_dir: Path, absent: list[str], *, any_spec: bool, mig: bool) -> str:
    """The warning for GPUs whose toolkit device no spec in ``cdi_dir`` declares."""
    if not any_spec:
        what = f"no CDI spec in {cdi_dir} is of kind {kind}"
    else:
        what = f"the {kind} CDI specs in {cdi_dir} declare no device {', '.join(absent)}"
    return (
        f"{what}, and prepare hands the runtime {kind}=<GPU UUID> for each GPU "
        f"(--toolkit-cdi-kind): containers given them do not start unless another CDI "
        f"directory of the runtime has them. On the node, run: "
        f"{generate_command(cdi_dir, mig=mig)}"
    )

"""The nvml backend's CDI edits: which device nodes and variables a container of a claim gets.

Derived from NVIDIA's own code, read at source (nvidia-container-toolkit ``pkg/nvcdi``,
``internal/platform-support/dgpu``, ``internal/nvcaps``; kubernetes-sigs/dra-driver-nvidia-gpu
``cmd/gpu-kubelet-plugin/cdi.go``, ``internal/common/nvcaps.go``):

- claim-wide (the spec's ``containerEdits``): ``NVIDIA_VISIBLE_DEVICES=<uuid>,...`` (every GPU
  or MIG UUID of the claim, for the toolkit's runtime where the node runs it) and the control
  nodes ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` (nvcdi's
  ``controlDeviceNodeDiscoverer``; like its char-device discoverer, only those that exist);
- per GPU: ``/dev/nvidia<minor>``, the minor from ``nvmlDeviceGetMinorNumber`` (nvcdi's
  ``getDevNodePath``); path only, so the runtime takes type and numbers from the host's node;
- per MIG device: its parent's ``/dev/nvidia<minor>`` and two capability nodes,
  ``/dev/nvidia-caps/nvidia-cap<N>`` for the GPU instance and for the compute instance, ``N``
  being ``DeviceFileMinor`` of ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>/access``
  and ``.../gi<gi>/ci<ci>/access`` and the major that of ``nvidia-caps`` in ``/proc/devices``,
  given as ``type: c`` with numbers and mode (NVIDIA's DRA driver does so: the nodes need not
  exist on the host; the toolkit's nvcaps reads the same minors from
  ``/proc/driver/nvidia-caps/mig-minors``).

A node that is not there (or a capability file that cannot be read) is left out and logged,
as nvcdi leaves out what it does not find: with the toolkit's runtime the container still gets
it through ``NVIDIA_VISIBLE_DEVICES``; with CDI alone it gets no GPU, and the log says why.

What is not here: the driver's libraries, binaries and firmware (nvcdi's driver discoverer,
which walks the driver root's ld cache and needs ``nvidia-cdi-hook`` on the host for its
``update-ldcache`` and ``create-symlinks`` hooks), DRM nodes for graphics, and ``by-path``
links. A node therefore gets them from the toolkit: its runtime (``NVIDIA_VISIBLE_DEVICES``),
or its own CDI spec (``nvidia-ctk cdi generate``), whose devices prepare then answers before
ours (``--toolkit-cdi-kind``, ``agent.toolkit``). nvcdi itself was not run against go-nvml's
mock machines here: its library discovery needs a driver root with a real ld cache and driver
files, which a mock NVML does not provide, so the comparison covers only what is derived
above, from its source.

Reads files under a driver root (``/`` on a plain node); blocking, so the backend runs it in a
thread. Pure otherwise: the minors come from the backend's last inventory read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dra_gpu.devices import edits, model

CAPS_DEVICE_NAME = "nvidia-caps"
_CAPS_ROOT = "proc/driver/nvidia/capabilities"
_GPU_NAME = re.compile(r"gpu-(\d+)")


def claim_edits(
    driver_root: Path,
    devices: Sequence[edits.GivenDevice],
    minors: Mapping[int, int],
    note: Callable[[int, str], None] | None = None,
) -> edits.ClaimEdits:
    """The edits of one claim's ``devices`` (module docstring). ``minors``: NVML index ->
    device minor. ``note(level, message)`` hears of a node that is missing and left out."""
    common_nodes = tuple(
        edits.DeviceNode(path) for path in edits.CONTROL_DEVICE_NODES if _exists(driver_root, path)
    )
    per_device: list[edits.Edits] = []
    for given in devices:
        device = given.device
        index = _gpu_index(device)
        nodes: list[edits.DeviceNode] = []
        minor = minors.get(index) if index is not None else None
        if minor is not None:
            path = f"/dev/nvidia{minor}"
            if _exists(driver_root, path):
                nodes.append(edits.DeviceNode(path))
            elif note is not None:
                note(30, f"{device.name}: {path} is not under {driver_root}: left out of CDI")
        if given.mig_instance is not None and given.mig_instance.compute_instance is not None:
            try:
                if minor is None:
                    raise model.InventoryError(f"{device.name}: the minor of its GPU is unknown")
                nodes.extend(
                    mig_capability_nodes(driver_root, minor, given.mig_instance, device.name)
                )
            except model.InventoryError as err:
                if note is not None:
                    note(30, f"{err}: its MIG capability nodes are left out of CDI")
        per_device.append(edits.Edits(device_nodes=tuple(nodes)))
    common = edits.Edits(edits.visible_devices_env(devices), common_nodes)
    return edits.ClaimEdits(common, tuple(per_device))


def mig_capability_nodes(
    driver_root: Path, minor: int, instance: model.MigInstance, device: str
) -> list[edits.DeviceNode]:
    """The GPU and compute instance capability nodes of a MIG device (module docstring)."""
    gi, ci = instance.gpu_instance, instance.compute_instance
    base = f"{_CAPS_ROOT}/gpu{minor}/mig/gi{gi}"
    major = device_major(driver_root, CAPS_DEVICE_NAME, device)
    return [
        _capability_node(driver_root / base / "access", major, device),
        _capability_node(driver_root / base / f"ci{ci}" / "access", major, device),
    ]


def _capability_node(access: Path, major: int, device: str) -> edits.DeviceNode:
    fields = {}
    try:
        text = access.read_text()
    except OSError as err:
        raise model.InventoryError(
            f"{device}: cannot read MIG capability {access}: {err}"
        ) from None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            fields[key.strip()] = int(value.strip())
    if "DeviceFileMinor" not in fields:
        raise model.InventoryError(f"{device}: {access} names no DeviceFileMinor")
    minor = fields["DeviceFileMinor"]
    return edits.DeviceNode(
        f"/dev/nvidia-caps/nvidia-cap{minor}",
        type="c",
        major=major,
        minor=minor,
        file_mode=fields.get("DeviceFileMode"),
    )


def device_major(driver_root: Path, name: str, device: str) -> int:
    """The major of character device ``name`` in ``/proc/devices``."""
    path = driver_root / "proc/devices"
    try:
        text = path.read_text()
    except OSError as err:
        raise model.InventoryError(f"{device}: cannot read {path}: {err}") from None
    chars, _, _ = text.partition("Block devices:")
    for line in chars.splitlines():
        number, _, found = line.strip().partition(" ")
        if found.strip() == name and number.isdigit():
            return int(number)
    raise model.InventoryError(f"{device}: {path} lists no character device {name}")


def _gpu_index(device: model.Device) -> int | None:
    """The NVML index of the GPU a device is, or is a partition of (``gpu-<index>``)."""
    if device.partition_of is None:
        return device.index
    match = _GPU_NAME.fullmatch(device.partition_of)
    return int(match.group(1)) if match else None


def _exists(root: Path, path: str) -> bool:
    return (root / path.lstrip("/")).exists()

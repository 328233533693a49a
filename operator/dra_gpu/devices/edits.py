"""What a container given a claim's devices gets: environment, device nodes and mounts.

A backend says it (``model.Backend.container_edits``) for all the devices of one claim at once,
because some of it is the claim's, not a device's: ``NVIDIA_VISIBLE_DEVICES`` must list every
GPU of the claim, and CDI merges environment variables by key (a later device's value replaces
an earlier one's), so a variable set per device would leave a container of a 2-GPU claim with
one GPU. ``ClaimEdits`` therefore has two parts:

- ``common``: edits applied once the container is given any device of the claim's spec (the
  CDI spec's top-level ``containerEdits``): the claim-wide environment, the control device
  nodes every GPU needs (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``).
- ``per_device``: one ``Edits`` per given device, in the given order (that CDI device's own
  ``containerEdits``): its device node ``/dev/nvidia<minor>``, a MIG device's capability nodes.

Pure data and the one rule both backends share (``visible_uuids``); no I/O. The agent turns
it into a spec (``agent.cdi``); nothing here knows CDI's JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from dra_gpu.devices.model.instances import MigInstance
from dra_gpu.devices.model.inventory import Device

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA Container Toolkit's variable: the GPU and MIG UUIDs a container may use."""

CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""The driver's control nodes every CUDA container needs, as the toolkit's ``nvcdi`` lists them
for a claim's common edits (``controlDeviceNodeDiscoverer``; ``/dev/nvidia-modeset`` too where
it exists: it is for display, and absent on most compute nodes)."""


@dataclasses.dataclass(frozen=True)
class DeviceNode:
    """A device node for the container (CDI ``deviceNodes[]``). With only ``path``, the runtime
    reads type and numbers from the host's node; a node that need not exist on the host (a MIG
    capability) says them."""

    path: str
    type: str | None = None
    """``c`` for a character device; None: as the host's node at ``path``."""
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    """Permission bits (``0o444``); None: the runtime's default."""


@dataclasses.dataclass(frozen=True)
class Mount:
    """A bind mount into the container (CDI ``mounts[]``)."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rw", "nosuid", "nodev", "bind")


@dataclasses.dataclass(frozen=True)
class Edits:
    """Environment, device nodes and mounts: one CDI ``containerEdits``."""

    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "device_nodes", tuple(self.device_nodes))
        object.__setattr__(self, "mounts", tuple(self.mounts))

    def merged(self, other: Edits) -> Edits:
        """``other`` on top of this: its variables win by key; device nodes and mounts are
        added once each (by path, the first kept)."""
        nodes: dict[str, DeviceNode] = {}
        for node in (*self.device_nodes, *other.device_nodes):
            nodes.setdefault(node.path, node)
        mounts: dict[str, Mount] = {}
        for mount in (*self.mounts, *other.mounts):
            mounts.setdefault(mount.container_path, mount)
        return Edits({**self.env, **other.env}, tuple(nodes.values()), tuple(mounts.values()))


@dataclasses.dataclass(frozen=True)
class ClaimEdits:
    """A claim's container edits: ``common`` once, ``per_device`` for each device, in order."""

    common: Edits
    per_device: tuple[Edits, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_device", tuple(self.per_device))


@dataclasses.dataclass(frozen=True)
class GivenDevice:
    """One device a claim's container is given: the inventory's device (a MIG partition with
    the UUID of the MIG device that exists now) and, for a partition, its MIG instance."""

    device: Device
    mig_instance: MigInstance | None = None


def visible_uuids(devices: Iterable[GivenDevice | Device]) -> tuple[str, ...]:
    """The UUIDs ``NVIDIA_VISIBLE_DEVICES`` lists for these devices: each once, in order (two
    shares of one GPU are one GPU). A container's CUDA ordinals of MPS limits follow it."""
    uuids: dict[str, None] = {}
    for given in devices:
        device = given.device if isinstance(given, GivenDevice) else given
        uuids.setdefault(device.uuid, None)
    return tuple(uuids)


def visible_devices_env(devices: Sequence[GivenDevice]) -> dict[str, str]:
    """``NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>``: every GPU or MIG device of the claim."""
    return {VISIBLE_DEVICES_ENV: ",".join(visible_uuids(devices))} if devices else {}

"""The standard topology attributes of a PCI device, read from sysfs as Kubernetes derives them.

``resource.kubernetes.io/pcieRoot`` (the PCIe root complex, ``pci<domain>:<bus>``) and
``resource.kubernetes.io/numaNode`` (the device's NUMA node, an int) are the names and values of
upstream's helpers in ``k8s.io/dynamic-resource-allocation/deviceattribute`` (v0.37:
``GetPCIeRootAttributeByPCIBusID``, ``GetNUMANodeAttributeByPCIBusID`` in its scalar form, which
needs no feature gate), the ones dranet publishes for NICs: a claim can then ask for a GPU and a
NIC under one root complex (``matchAttribute: resource.kubernetes.io/pcieRoot``). pcieRoot is the
first element of the path the ``/sys/bus/pci/devices/<bus id>`` link points to, under
``/sys/devices/``; a device the kernel reports without NUMA affinity (``numa_node`` -1) has no
numaNode, as upstream says ("must not publish").

Reads files below an injectable sysfs root and nothing else; no NVML.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from dra_gpu.devices import model

PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
SYSFS = Path("/sys")
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def pcie_root(bus_id: str, sysfs: Path = SYSFS) -> str:
    """``pci0000:00`` for the device at ``bus_id`` (``0000:3b:00.0``, the kernel's form);
    InventoryError naming the device and the path when sysfs does not say."""
    _check(bus_id)
    link = sysfs / "bus" / "pci" / "devices" / bus_id
    try:
        target = os.readlink(link)
    except OSError as err:
        raise model.InventoryError(f"PCI device {bus_id}: reading {link}: {err}") from None
    resolved = os.path.normpath(os.path.join("bus/pci/devices", target))
    parts = resolved.split(os.sep)
    if len(parts) < 3 or parts[0] != "devices" or parts[-1] != bus_id:
        raise model.InventoryError(
            f"PCI device {bus_id}: {link} points to {target}, not to devices/pci.../{bus_id}"
        )
    if not _ROOT.fullmatch(parts[1]):
        raise model.InventoryError(
            f"PCI device {bus_id}: {link} points to {target}, under no PCIe root complex"
        )
    return parts[1]


def numa_node(bus_id: str, sysfs: Path = SYSFS) -> int | None:
    """The NUMA node of the device at ``bus_id``; None when it has no NUMA affinity (-1).
    InventoryError when sysfs does not say."""
    _check(bus_id)
    path = sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node"
    try:
        text = path.read_text().strip()
    except OSError as err:
        raise model.InventoryError(f"PCI device {bus_id}: reading {path}: {err}") from None
    try:
        node = int(text)
    except ValueError:
        raise model.InventoryError(f"PCI device {bus_id}: {path} says {text!r}") from None
    return node if node >= 0 else None


def topology(bus_id: str, sysfs: Path = SYSFS) -> dict[str, model.AttributeValue]:
    """The standard attributes sysfs gives for ``bus_id``: pcieRoot and numaNode, each left
    out when sysfs does not say (the device is published all the same)."""
    found: dict[str, model.AttributeValue] = {}
    with contextlib.suppress(model.InventoryError):
        found[PCIE_ROOT_ATTRIBUTE] = model.StringValue(pcie_root(bus_id, sysfs))
    try:
        node = numa_node(bus_id, sysfs)
    except model.InventoryError:
        node = None
    if node is not None:
        found[NUMA_NODE_ATTRIBUTE] = model.IntValue(node)
    return found


def _check(bus_id: str) -> None:
    if not _BDF.fullmatch(bus_id):
        raise model.InventoryError(f"PCI bus id {bus_id!r} is not of the form 0000:3b:00.0")

"""The standard topology attributes (pcieRoot, numaNode) come from sysfs as upstream reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_gpu.devices import model, nvml, pci
from dra_gpu.resource import names
from tests.support.fake_pynvml import FakeGpu, FakeNvml, a100_in_mig_mode


def fake_sysfs(root: Path, bus_id: str, target: str, numa: str | None = "1") -> Path:
    """A sysfs with one PCI device: its bus link (relative, as the kernel writes it)."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    real = root / "devices" / target
    real.mkdir(parents=True)
    if numa is not None:
        (real / "numa_node").write_text(f"{numa}\n")
    os.symlink(os.path.relpath(real, devices), devices / bus_id)
    return root


def test_the_pcie_root_is_the_first_element_under_devices(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, "0000:3b:00.0", "pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    assert pci.pcie_root("0000:3b:00.0", sysfs) == "pci0000:3a"
    assert pci.numa_node("0000:3b:00.0", sysfs) == 1


def test_a_device_without_numa_affinity_has_no_numa_node(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, "0000:3b:00.0", "pci0000:3a/0000:3b:00.0", numa="-1")
    assert pci.numa_node("0000:3b:00.0", sysfs) is None
    assert pci.topology("0000:3b:00.0", sysfs) == {
        pci.PCIE_ROOT_ATTRIBUTE: model.StringValue("pci0000:3a")
    }


def test_a_link_that_is_not_a_pci_device_path_is_refused(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, "0000:3b:00.0", "platform/0000:3b:00.0")
    with pytest.raises(model.InventoryError, match=r"0000:3b:00.0: .* under no PCIe root"):
        pci.pcie_root("0000:3b:00.0", sysfs)
    with pytest.raises(model.InventoryError, match="not of the form"):
        pci.pcie_root("00000000:3B:00.0", sysfs)
    with pytest.raises(model.InventoryError, match="reading"):
        pci.pcie_root("0000:99:00.0", sysfs)


def test_the_attribute_names_are_qualified_names_the_api_takes() -> None:
    assert names.is_qualified_name(pci.PCIE_ROOT_ATTRIBUTE)
    assert names.is_qualified_name(pci.NUMA_NODE_ATTRIBUTE)


async def test_the_nvml_backend_publishes_each_gpus_pcie_root_and_numa_node(
    tmp_path: Path,
) -> None:
    sysfs = fake_sysfs(tmp_path, "0000:18:00.0", "pci0000:17/0000:17:01.0/0000:18:00.0", "0")
    gpus = [
        FakeGpu(uuid="GPU-0", bus_id=b"00000000:18:00.0"),
        FakeGpu(uuid="GPU-1", bus_id=b"00000000:2A:00.0"),  # not in this sysfs
    ]
    async with nvml.NvmlBackend("node-01", nvml=FakeNvml(gpus), sysfs=sysfs) as backend:
        inventory = await backend.inventory()
    first, second = inventory.by_name["gpu-0"], inventory.by_name["gpu-1"]
    assert first.attributes[pci.PCIE_ROOT_ATTRIBUTE] == model.StringValue("pci0000:17")
    assert first.attributes[pci.NUMA_NODE_ATTRIBUTE] == model.IntValue(0)
    # sysfs says nothing of it: published without them.
    assert pci.PCIE_ROOT_ATTRIBUTE not in second.attributes
    assert pci.NUMA_NODE_ATTRIBUTE not in second.attributes


async def test_a_mig_partition_lines_up_with_its_gpus_pcie_root_and_numa_node(
    tmp_path: Path,
) -> None:
    sysfs = fake_sysfs(tmp_path, "0000:18:00.0", "pci0000:17/0000:17:01.0/0000:18:00.0", "1")
    gpu = a100_in_mig_mode(uuid="GPU-0", bus_id=b"00000000:18:00.0")
    async with nvml.NvmlBackend("node-01", nvml=FakeNvml([gpu]), sysfs=sysfs) as backend:
        inventory = await backend.inventory()
    partitions = [d for d in inventory.devices if d.partition_of == "gpu-0"]
    assert partitions
    for partition in partitions:
        assert partition.attributes[pci.PCIE_ROOT_ATTRIBUTE] == model.StringValue("pci0000:17")
        assert partition.attributes[pci.NUMA_NODE_ATTRIBUTE] == model.IntValue(1)

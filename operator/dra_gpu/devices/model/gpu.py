"""A whole GPU as every backend publishes it: the one set of attributes, so selectors work on
either backend.

Owns the attribute names and value types of a GPU (index, uuid, productName, brand,
architecture, the versions normalised to semver, migCapable, the standard PCI bus id) and its
``memory`` capacity. Must not: read a GPU; add topology or sharing (``devices.pci``,
``devices.sharing``).
"""

from __future__ import annotations

from dra_gpu.devices.model import inventory, values

PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
"""The standard attribute for a device's PCI address (a third-party name: it carries a domain)."""


def gpu_device(
    *,
    index: int,
    uuid: str,
    memory: str,
    product_name: str,
    brand: str,
    architecture: str,
    cuda_compute_capability: str,
    driver_version: str,
    mig_capable: bool,
    cuda_driver_version: str | None = None,
    pci_bus_id: str | None = None,
    name: str | None = None,
    healthy: bool = True,
) -> inventory.Device:
    """A GPU with the attributes every backend publishes, so selectors work on either backend.

    Versions are given as drivers report them and normalised to semver here.
    """
    attributes: dict[str, values.AttributeValue] = {
        "index": values.IntValue(index),
        "uuid": values.StringValue(uuid),
        "productName": values.StringValue(product_name),
        "brand": values.StringValue(brand),
        "architecture": values.StringValue(architecture),
        "cudaComputeCapability": values.VersionValue(
            values.normalize_version(cuda_compute_capability)
        ),
        "driverVersion": values.VersionValue(values.normalize_version(driver_version)),
        "migCapable": values.BoolValue(mig_capable),
    }
    if cuda_driver_version is not None:
        attributes["cudaDriverVersion"] = values.VersionValue(
            values.normalize_version(cuda_driver_version)
        )
    if pci_bus_id is not None:
        attributes[PCI_BUS_ID_ATTRIBUTE] = values.StringValue(pci_bus_id)
    return inventory.Device(
        name=name if name is not None else f"gpu-{index}",
        uuid=uuid,
        attributes=attributes,
        capacity={"memory": memory},
        healthy=healthy,
    )

"""The inventory model accepts only what the API server would accept, and says why not."""

from fractions import Fraction

import pytest

from dra_gpu.devices import model
from dra_gpu.resource import names


def _device(**overrides: object) -> model.Device:
    fields: dict[str, object] = {
        "name": "gpu-0",
        "uuid": "GPU-1",
        "attributes": {"index": model.IntValue(0)},
        "capacity": {"memory": "24Gi"},
    }
    fields.update(overrides)
    return model.Device(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104", "535.104.0"),
        ("550.54.05", "550.54.5"),
        ("9.0", "9.0.0"),
        ("12", "12.0.0"),
        ("v1.2.3", "1.2.3"),
        (" 470.82.01 ", "470.82.1"),
        ("31.0.15.3623", "31.0.15+3623"),
        ("1.2.3-rc.1", "1.2.3-rc.1"),
    ],
)
def test_driver_versions_become_semver(raw: str, semver: str) -> None:
    assert model.normalize_version(raw) == semver
    model.VersionValue(semver)  # and the result is accepted as a version attribute


@pytest.mark.parametrize("raw", ["", "abc", "1..2", "1.2.x", "1.2.3.4.x"])
def test_unreadable_version_is_rejected_saying_what_was_expected(raw: str) -> None:
    with pytest.raises(model.InventoryError, match="cannot be read as a version"):
        model.normalize_version(raw)


@pytest.mark.parametrize("bad", ["550.54.05", "9.0", "1.2.3.4", ""])
def test_version_attribute_must_already_be_semver(bad: str) -> None:
    with pytest.raises(model.InventoryError, match="not a semantic version"):
        model.VersionValue(bad)


def test_attribute_values_have_the_api_form() -> None:
    assert model.IntValue(3).to_api() == {"int": 3}
    assert model.BoolValue(False).to_api() == {"bool": False}
    assert model.StringValue("x").to_api() == {"string": "x"}
    assert model.VersionValue("12.4.0").to_api() == {"version": "12.4.0"}


def test_attribute_values_keep_to_their_type_and_limits() -> None:
    with pytest.raises(model.InventoryError, match="not an integer"):
        model.IntValue(True)
    with pytest.raises(model.InventoryError, match="64-bit"):
        model.IntValue(2**63)
    with pytest.raises(model.InventoryError, match="not true or false"):
        model.BoolValue(1)  # type: ignore[arg-type]
    with pytest.raises(model.InventoryError, match="longer than 64"):
        model.StringValue("x" * 65)
    model.StringValue("x" * 64)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("24Gi", Fraction(24 * 2**30)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("100m", Fraction(1, 10)),
        ("1e3", Fraction(1000)),
        ("2E", Fraction(2 * 10**18)),
        ("1024", Fraction(1024)),
        (".5k", Fraction(500)),
        ("-1Ki", Fraction(-1024)),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction) -> None:
    assert model.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["24GB", "24 Gi", "", "1.2.3", "24gi", "1e"])
def test_non_quantities_are_rejected_with_an_example(text: str) -> None:
    with pytest.raises(model.InventoryError, match=r"is not a Kubernetes quantity \(e.g. 24Gi\)"):
        model.parse_quantity(text)


def test_quantities_are_read_as_the_api_server_reads_them() -> None:
    # One parser (dra_gpu.resource.quantities) for the model, CEL and the controller: a bare
    # suffix is zero to apimachinery's ParseQuantity, so the model accepts what the API server
    # accepts.
    assert model.parse_quantity("Gi") == 0


@pytest.mark.parametrize(
    ("count", "text"),
    [(85520809984, "81559Mi"), (24 * 2**30, "24Gi"), (1023, "1023"), (0, "0"), (2048, "2Ki")],
)
def test_byte_counts_become_exact_quantities(count: int, text: str) -> None:
    assert model.format_bytes(count) == text
    assert model.parse_quantity(text) == count


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("memory", True),
        ("cudaComputeCapability", True),
        ("resource.kubernetes.io/pciBusID", True),
        ("_x", True),
        ("a" * 32, True),
        ("a" * 33, False),
        ("1memory", False),
        ("mem-ory", False),
        ("Example.com/memory", False),
        ("a/b/c", False),
        ("/memory", False),
    ],
)
def test_attribute_and_capacity_names_are_qualified_names(name: str, ok: bool) -> None:
    assert names.is_qualified_name(name) is ok


@pytest.mark.parametrize("name", ["GPU-0", "gpu_0", "-gpu", "gpu.0", "", "g" * 64])
def test_device_name_must_be_a_dns_label(name: str) -> None:
    with pytest.raises(model.InventoryError, match="must be a DNS label"):
        _device(name=name)


def test_bad_capacity_names_the_device_and_the_capacity() -> None:
    with pytest.raises(model.InventoryError) as err:
        _device(capacity={"memory": "24GB"})
    assert str(err.value) == (
        "device 'gpu-0': capacity 'memory': '24GB' is not a Kubernetes quantity (e.g. 24Gi)"
    )


def test_bad_attribute_name_names_the_device_and_the_attribute() -> None:
    with pytest.raises(model.InventoryError, match="device 'gpu-0': attribute 'bad-name'"):
        _device(attributes={"bad-name": model.IntValue(1)})


def test_more_than_32_attributes_and_capacities_together_are_rejected() -> None:
    attributes = {f"a{i}": model.IntValue(i) for i in range(31)}
    _device(attributes=attributes)  # 31 + memory = 32: the limit
    with pytest.raises(model.InventoryError, match="33 attributes and capacities"):
        _device(attributes={**attributes, "one_more": model.BoolValue(True)})


def test_device_maps_cannot_change_after_construction() -> None:
    capacity = {"memory": "24Gi"}
    device = _device(capacity=capacity)
    capacity["memory"] = "1Ki"
    assert device.memory == "24Gi"
    with pytest.raises(TypeError):
        device.capacity["memory"] = "1Ki"  # type: ignore[index]


def test_duplicate_device_names_are_rejected_naming_node_and_device() -> None:
    with pytest.raises(model.InventoryError, match="node 'node-01': device name 'gpu-0' is used"):
        model.Inventory("node-01", (_device(), _device(uuid="GPU-2")))


def test_inventory_errors_are_value_errors() -> None:
    assert issubclass(model.InventoryError, ValueError)
    assert issubclass(model.ProfileError, model.InventoryError)


def test_gpu_device_publishes_the_attributes_selectors_rely_on() -> None:
    device = model.gpu_device(
        index=1,
        uuid="GPU-abc",
        memory="80Gi",
        product_name="NVIDIA H100 80GB HBM3",
        brand="NVIDIA",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        driver_version="550.54.05",
        cuda_driver_version="12.4",
        mig_capable=True,
        pci_bus_id="0000:18:00.0",
    )
    assert device.name == "gpu-1"
    assert device.index == 1
    assert device.memory_bytes == 80 * 2**30
    assert device.product_name == "NVIDIA H100 80GB HBM3"
    assert {k: v.to_api() for k, v in device.attributes.items()} == {
        "index": {"int": 1},
        "uuid": {"string": "GPU-abc"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "NVIDIA"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.5"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "migCapable": {"bool": True},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
    }
    # Bare "memory" is what device.capacity["gpu.example.com"].memory reads.
    assert dict(device.capacity) == {"memory": "80Gi"}

"""The simulated backend serves a YAML profile and rejects bad ones, naming file and field."""

import shutil
from pathlib import Path
from textwrap import dedent

import pytest
import yaml

from dra_gpu.devices import edits, model, pci, simulated

CHART = Path(__file__).resolve().parents[3] / "charts" / "dra-gpu"
PROFILES = CHART / "profiles"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(dedent(text))
    return path


def _profile_error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(model.ProfileError) as err:
        simulated.load_profile(path)
    return str(err.value)


async def test_tutorial_profile_gives_gpu_0_24gi_and_gpu_1_8gi_on_node_01() -> None:
    backend = simulated.SimulatedBackend(PROFILES / "tutorial.yaml", node="node-01")
    inventory = await backend.inventory()
    assert inventory.node == "node-01"
    assert [(d.name, d.memory, d.index) for d in inventory.devices] == [
        ("gpu-0", "24Gi", 0),
        ("gpu-1", "8Gi", 1),
    ]
    assert all(d.healthy for d in inventory.devices)


async def test_a_container_sees_each_simulated_gpu_as_gpu_device_n() -> None:
    backend = simulated.SimulatedBackend(PROFILES / "tutorial.yaml", node="node-01")
    gpu0, gpu1 = (await backend.inventory()).devices
    claim = await backend.container_edits([edits.GivenDevice(gpu1), edits.GivenDevice(gpu0)])
    # One variable per position in the claim, so a container given both sees both; the
    # claim's NVIDIA_VISIBLE_DEVICES lists both, as the nvml backend's does.
    assert [dict(e.env) for e in claim.per_device] == [
        {"GPU_DEVICE_0": "gpu-1"},
        {"GPU_DEVICE_1": "gpu-0"},
    ]
    assert dict(claim.common.env) == {"NVIDIA_VISIBLE_DEVICES": f"{gpu1.uuid},{gpu0.uuid}"}
    assert not claim.common.device_nodes  # none exists: CDI would fail the container


@pytest.mark.parametrize("node", ["node-02", "node-03"])
async def test_tutorial_nodes_without_gpus_are_listed_with_no_devices(node: str) -> None:
    backend = simulated.SimulatedBackend(PROFILES / "tutorial.yaml", node=node)
    assert backend.node_in_profile
    assert (await backend.inventory()).devices == ()


async def test_node_absent_from_the_profile_has_no_devices_and_says_so() -> None:
    backend = simulated.SimulatedBackend(PROFILES / "tutorial.yaml", node="node-99")
    assert not backend.node_in_profile
    assert (await backend.inventory()) == model.Inventory("node-99", ())


def test_the_charts_default_profile_is_empty_so_that_a_users_profile_replaces_the_tutorials() -> (
    None
):
    # Helm merges a user's map into the default one: a default with nodes would leak the
    # tutorial's GPUs into every user's inventory. The chart renders profiles/tutorial.yaml
    # when the value is empty (tests/chart/test_chart_render.py).
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["agent"]["profile"] == {}
    assert simulated.parse_profile((PROFILES / "tutorial.yaml").read_text(), "tutorial") is not None


def test_large_profile_has_20_nodes_of_8_gpus_of_mixed_sizes() -> None:
    profile = simulated.load_profile(PROFILES / "large.yaml")
    assert sorted(profile.nodes) == [f"node-{i:02d}" for i in range(1, 21)]
    assert {len(devices) for devices in profile.nodes.values()} == {8}
    assert [d.name for d in profile.nodes["node-20"]] == [f"gpu-{i}" for i in range(8)]
    sizes = {d.memory for devices in profile.nodes.values() for d in devices}
    assert sizes == {"80Gi", "24Gi", "40Gi", "16Gi"}
    uuids = [d.uuid for devices in profile.nodes.values() for d in devices]
    assert len(set(uuids)) == 160


def test_count_makes_identical_devices_named_by_their_index_on_the_node() -> None:
    profile = simulated.parse_profile(
        dedent("""
        nodes:
          big:
            devices:
            - name: first
              memory: 8Gi
            - count: 200
              memory: 16Gi
        """)
    )
    devices = profile.nodes["big"]
    assert len(devices) == 201
    assert (devices[0].name, devices[0].index) == ("first", 0)
    assert (devices[1].name, devices[1].index, devices[1].memory) == ("gpu-1", 1, "16Gi")
    assert devices[-1].name == "gpu-200"


def test_uuids_are_the_same_after_a_restart_and_differ_between_nodes(tmp_path: Path) -> None:
    path = _write(tmp_path, "nodes: {a: {devices: [{memory: 1Gi}]}, b: {devices: [{memory: 1Gi}]}}")
    first, again = simulated.load_profile(path), simulated.load_profile(path)
    assert first.nodes["a"][0].uuid == again.nodes["a"][0].uuid
    assert first.nodes["a"][0].uuid != first.nodes["b"][0].uuid
    assert first.nodes["a"][0].uuid.startswith("GPU-")


def test_defaults_apply_to_every_device_and_a_device_field_wins() -> None:
    profile = simulated.parse_profile(
        dedent("""
        defaults:
          memory: 24Gi
          productName: NVIDIA L4
          driverVersion: "535.104"
        nodes:
          n:
            devices:
            - {}
            - memory: 8Gi
              productName: Other
              uuid: GPU-fixed
              pciBusID: 0000:3b:00.0
              healthy: false
              cudaDriverVersion: null
        """)
    )
    first, second = profile.nodes["n"]
    assert (first.memory, first.product_name) == ("24Gi", "NVIDIA L4")
    assert first.attributes["driverVersion"] == model.VersionValue("535.104.0")
    assert (second.memory, second.product_name, second.uuid) == ("8Gi", "Other", "GPU-fixed")
    assert second.attributes["resource.kubernetes.io/pciBusID"] == model.StringValue("0000:3b:00.0")
    assert not second.healthy
    assert "cudaDriverVersion" not in second.attributes
    assert "cudaDriverVersion" in first.attributes


def test_bad_quantity_names_the_file_node_device_index_and_field(tmp_path: Path) -> None:
    message = _profile_error(
        tmp_path,
        """
        nodes:
          node-01:
            devices:
            - name: gpu-0
              memory: 24Gi
            - name: gpu-1
              memory: 24GB
        """,
    )
    assert message == (
        f"profile {tmp_path / 'profile.yaml'}: nodes.node-01.devices[1].memory: "
        "'24GB' is not a Kubernetes quantity (e.g. 24Gi)"
    )


def test_unknown_profile_key_is_rejected_naming_the_field(tmp_path: Path) -> None:
    message = _profile_error(tmp_path, "nodes: {n: {devices: [{memory: 1Gi, memroy: 2Gi}]}}")
    assert "nodes.n.devices[0].memroy: unknown field (known: " in message
    assert _profile_error(tmp_path, "nodes: {}\nnode: {}").endswith(
        "node: unknown field (known: defaults, nodes)"
    )
    assert "nodes.n.gpus: unknown field (known: devices)" in _profile_error(
        tmp_path, "nodes: {n: {gpus: []}}"
    )
    assert "defaults.name: unknown field" in _profile_error(
        tmp_path, "defaults: {name: x}\nnodes: {}"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nodes: []", "nodes: expected a mapping, got a list"),
        ("nodes: {n: {devices: {}}}", "nodes.n.devices: expected a list, got a mapping"),
        ("nodes: {n: {devices: [{memory: 1Gi, migCapable: 1}]}}", "migCapable: expected true"),
        ("nodes: {n: {devices: [{memory: true}]}}", "memory: expected a quantity such as 24Gi"),
        ("nodes: {n: {devices: [{memory: 0}]}}", "memory: '0' must be more than zero"),
        ("nodes: {n: {devices: [{memory: 1Gi, count: 0}]}}", "count: expected a whole number"),
        ("nodes: {n: {devices: [{memory: 1Gi, name: GPU-0}]}}", "name: 'GPU-0' is not a DNS"),
        ("nodes: {n: {devices: [{memory: 1Gi, productName: ''}]}}", "productName: expected a"),
        ("nodes: {n: {devices: [{memory: 1Gi, pciBusID: x}]}}", "pciBusID: 'x' is not a PCI"),
        ("nodes: {n: {devices: [{}]}}", "devices[0].memory: required (here or in defaults)"),
        ("nodes: {N_1: {}}", "nodes.N_1: a node name must be a DNS subdomain"),
        ("nodes: {n: {devices: [7]}}", "nodes.n.devices[0]: expected a mapping, got a number"),
        ("nodes: {n: {devices: [{count: 2, name: a, memory: 1Gi}]}}", "name: cannot be combined"),
        ("{}", "nodes: required"),
        ("", "nodes: the profile is empty"),
    ],
)
def test_wrong_shapes_and_types_are_rejected_naming_the_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in _profile_error(tmp_path, text)


def test_unquoted_version_is_rejected_with_a_hint_to_quote_it(tmp_path: Path) -> None:
    message = _profile_error(
        tmp_path, "nodes: {n: {devices: [{memory: 1Gi, driverVersion: 12.10}]}}"
    )
    assert 'driverVersion: expected a quoted version string such as "9.0", got a number' in message


def test_duplicate_device_names_are_rejected_naming_both_entries(tmp_path: Path) -> None:
    message = _profile_error(
        tmp_path,
        """
        nodes:
          n:
            devices:
            - count: 2
              memory: 1Gi
            - name: gpu-1
              memory: 1Gi
        """,
    )
    assert message.endswith(
        "nodes.n.devices[1].name: 'gpu-1' is already used by nodes.n.devices[0]"
    )


def test_duplicate_yaml_keys_are_rejected_with_their_position(tmp_path: Path) -> None:
    message = _profile_error(
        tmp_path,
        """\
        nodes:
          node-01: {}
          node-01: {}
        """,
    )
    assert (
        message == f"profile {tmp_path / 'profile.yaml'}: line 3, column 3: duplicate key 'node-01'"
    )


def test_broken_yaml_is_a_profile_error_with_its_position(tmp_path: Path) -> None:
    message = _profile_error(tmp_path, "nodes:\n  n: {devices: [\n")
    assert message.startswith(f"profile {tmp_path / 'profile.yaml'}: line 3, column 1: ")


def test_yaml_anchors_and_merge_keys_still_work() -> None:
    profile = simulated.parse_profile(
        dedent("""
        nodes:
          a:
            devices: &gpus
            - &big {memory: 80Gi, productName: Big}
          b:
            devices: *gpus
          c:
            devices:
            - <<: *big
              memory: 40Gi
        """)
    )
    assert [d.memory for n in "abc" for d in profile.nodes[n]] == ["80Gi", "80Gi", "40Gi"]
    assert profile.nodes["c"][0].product_name == "Big"


def test_a_missing_file_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(model.ProfileError, match="cannot be read"):
        simulated.SimulatedBackend(tmp_path / "absent.yaml", node="n")


async def test_editing_the_profile_changes_the_next_inventory(tmp_path: Path) -> None:
    path = _write(tmp_path, "nodes: {n: {devices: [{count: 2, memory: 8Gi}]}}")
    backend = simulated.SimulatedBackend(path, node="n")
    assert len((await backend.inventory()).devices) == 2
    path.write_text("nodes: {n: {devices: [{count: 3, memory: 8Gi}]}}")
    assert len((await backend.inventory()).devices) == 3
    path.write_text("nodes: {n: {devices: [{count: 3, memory: 8GB}]}}")
    with pytest.raises(model.ProfileError, match="memory"):
        await backend.inventory()
    await backend.aclose()


async def test_a_parsed_profile_can_be_served_directly() -> None:
    profile = simulated.parse_profile("nodes: {n: {devices: [{memory: 8Gi}]}}", source="inline")
    backend = simulated.SimulatedBackend(profile, node="n")
    assert [d.name for d in (await backend.inventory()).devices] == ["gpu-0"]


async def test_simulated_mig_instances_outlive_the_agent_but_not_the_hardware_dir(
    tmp_path: Path,
) -> None:
    profile = simulated.parse_profile(
        "nodes:\n  n:\n    devices:\n    - {memory: 40Gi, migCapable: true, mig: A100-40GB}\n"
    )
    hardware = tmp_path / "run" / "sim"
    backend = simulated.SimulatedBackend(profile, "n", hardware_dir=hardware)
    placement = model.MigPlacement("gpu-0", "3g.20gb", 4)
    created = await backend.create_mig_instance(placement)
    assert created.gpu_instance == 1
    assert created.compute_instance == 0
    inventory = await backend.inventory()
    # Its MIG device is the partition device's UUID, which the container is told of.
    assert created.uuid == inventory.by_name["gpu-0-mig-3g-20gb-4"].uuid
    assert await backend.create_mig_instance(placement) == created  # a retried call
    # The hardware refuses what would over-commit the GPU, and says why.
    with pytest.raises(model.InventoryError, match="memory slice\\(s\\) 4, 5 are taken"):
        await backend.create_mig_instance(model.MigPlacement("gpu-0", "2g.10gb", 4))
    media = await backend.create_mig_instance(model.MigPlacement("gpu-0", "1g.5gb+me", 0))
    with pytest.raises(model.InventoryError, match="the media extensions are taken"):
        await backend.create_mig_instance(model.MigPlacement("gpu-0", "1g.5gb+me", 1))
    await backend.destroy_mig_instance(media)
    with pytest.raises(model.InventoryError, match=r"has no MIG profile 3g\.40gb"):
        await backend.create_mig_instance(model.MigPlacement("gpu-0", "3g.40gb", 0))
    with pytest.raises(model.InventoryError, match="starts at memory slice 0, 4, not 2"):
        await backend.create_mig_instance(model.MigPlacement("gpu-0", "3g.20gb", 2))

    # An agent crash: a new backend object finds what the old one made.
    again = simulated.SimulatedBackend(profile, "n", hardware_dir=hardware)
    assert await again.mig_instances() == (created,)
    await again.destroy_mig_instance(created)
    assert await backend.mig_instances() == ()
    await again.destroy_mig_instance(created)  # gone already: not an error

    # A reboot empties the node's tmpfs: no instance survives it.
    await backend.create_mig_instance(placement)
    shutil.rmtree(hardware)
    assert (
        await simulated.SimulatedBackend(profile, "n", hardware_dir=hardware).mig_instances() == ()
    )


async def test_pcie_root_and_numa_node_are_published_as_the_nvml_backend_names_them() -> None:
    profile = simulated.parse_profile(
        dedent("""\
            defaults: {pcieRoot: pci0000:17}
            nodes:
              n:
                devices:
                - {memory: 80Gi, numaNode: 1}
                - {memory: 80Gi, pcieRoot: pci0000:a0, numaNode: 0}
                - {memory: 80Gi, pcieRoot: pci0001:00}
            """)
    )
    inventory = await simulated.SimulatedBackend(profile, "n").inventory()
    roots = [d.attributes.get(pci.PCIE_ROOT_ATTRIBUTE) for d in inventory.devices]
    numa = [d.attributes.get(pci.NUMA_NODE_ATTRIBUTE) for d in inventory.devices]
    assert roots == [
        model.StringValue("pci0000:17"),
        model.StringValue("pci0000:a0"),
        model.StringValue("pci0001:00"),
    ]
    assert numa == [model.IntValue(1), model.IntValue(0), None]
    assert pci.PCIE_ROOT_ATTRIBUTE == "resource.kubernetes.io/pcieRoot"
    assert pci.NUMA_NODE_ATTRIBUTE == "resource.kubernetes.io/numaNode"


async def test_without_topology_fields_no_topology_attribute_is_published() -> None:
    profile = simulated.parse_profile("nodes: {n: {devices: [{memory: 8Gi}]}}")
    [device] = (await simulated.SimulatedBackend(profile, "n").inventory()).devices
    assert pci.PCIE_ROOT_ATTRIBUTE not in device.attributes
    assert pci.NUMA_NODE_ATTRIBUTE not in device.attributes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "nodes: {n: {devices: [{memory: 1Gi, pcieRoot: '0000:17'}]}}",
            "nodes.n.devices[0].pcieRoot: '0000:17' is not a PCIe root like pci0000:17",
        ),
        (
            "nodes: {n: {devices: [{memory: 1Gi, pcieRoot: PCI0000:17}]}}",
            "nodes.n.devices[0].pcieRoot: 'PCI0000:17' is not a PCIe root",
        ),
        (
            "nodes: {n: {devices: [{memory: 1Gi, pcieRoot: 17}]}}",
            "nodes.n.devices[0].pcieRoot: 17 is not a PCIe root",
        ),
        (
            "nodes: {n: {devices: [{memory: 1Gi, numaNode: -1}]}}",
            "nodes.n.devices[0].numaNode: expected a whole number from 0 to 1023",
        ),
        (
            "nodes: {n: {devices: [{memory: 1Gi, numaNode: '0'}]}}",
            "nodes.n.devices[0].numaNode: expected a whole number",
        ),
        (
            "nodes: {n: {devices: [{memory: 1Gi, numaNode: true}]}}",
            "nodes.n.devices[0].numaNode: expected a whole number",
        ),
        (
            "defaults: {numaNode: 1.5}\nnodes: {n: {devices: [{memory: 1Gi}]}}",
            "defaults.numaNode: expected a whole number",
        ),
    ],
)
def test_a_bad_pcie_root_or_numa_node_names_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    assert message in _profile_error(tmp_path, text)

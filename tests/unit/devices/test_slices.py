"""Inventory -> ResourceSlice bodies: one pool per node, <= 128 devices a slice, deterministic."""

import copy
import datetime
import json
from pathlib import Path

import pytest
import yaml

from dra_gpu.agent import slices
from dra_gpu.devices import model, simulated
from dra_gpu.resource import labels, names

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "crds-examples"
PROFILES = REPO / "charts" / "dra-gpu" / "profiles"
DRIVER = "gpu.example.com"


def _gpus(count: int, memory: str = "8Gi") -> list[model.Device]:
    profile = simulated.parse_profile(
        f"nodes: {{n: {{devices: [{{count: {count}, memory: {memory}}}]}}}}"
    )
    return list(profile.nodes["n"])


def _tutorial_devices() -> tuple[model.Device, ...]:
    return simulated.load_profile(PROFILES / "tutorial.yaml").inventory("node-01").devices


def _names(body: slices.SliceBody) -> list[str]:
    return [d["name"] for d in body["spec"]["devices"]]


def test_tutorial_inventory_publishes_what_the_hand_written_slice_did() -> None:
    (body,) = slices.build_slices("node-01", "uid-1", DRIVER, _tutorial_devices(), generation=1)
    hand_written = yaml.safe_load((EXAMPLES / "resourceslice.yaml").read_text())["spec"]
    for key in ("driver", "nodeName", "pool"):
        assert body["spec"][key] == hand_written[key]
    assert [(d["name"], d["capacity"]) for d in body["spec"]["devices"]] == [
        (d["name"], d["capacity"]) for d in hand_written["devices"]
    ]
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceSlice"


def test_slices_carry_our_labels_and_belong_to_the_node() -> None:
    (body,) = slices.build_slices("node-01", "uid-1", DRIVER, _tutorial_devices(), generation=3)
    assert body["metadata"]["name"] == "node-01-gpu-example-com-0"
    assert body["metadata"]["labels"] == {
        labels.MANAGED_BY_LABEL: "dra-gpu",
        labels.NODE_LABEL: "node-01",
    }
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-01", "uid": "uid-1", "controller": True}
    ]
    gpu0 = body["spec"]["devices"][0]
    assert gpu0["attributes"]["index"] == {"int": 0}
    assert gpu0["attributes"]["cudaComputeCapability"] == {"version": "8.9.0"}


def test_more_than_128_devices_become_several_slices_of_one_pool() -> None:
    bodies = slices.build_slices("big", "uid", DRIVER, _gpus(200), generation=7)
    assert [len(b["spec"]["devices"]) for b in bodies] == [128, 72]
    assert [b["metadata"]["name"] for b in bodies] == [
        "big-gpu-example-com-0",
        "big-gpu-example-com-1",
    ]
    for body in bodies:
        assert body["spec"]["pool"] == {"name": "big", "generation": 7, "resourceSliceCount": 2}
    all_names = _names(bodies[0]) + _names(bodies[1])
    assert all_names == [f"gpu-{i}" for i in range(200)]


def test_a_smaller_slice_size_can_be_chosen_but_not_above_the_api_limit() -> None:
    bodies = slices.build_slices("n", "uid", DRIVER, _gpus(10), 1, max_devices_per_slice=4)
    assert [len(b["spec"]["devices"]) for b in bodies] == [4, 4, 2]
    with pytest.raises(ValueError, match=r"must be 1\.\.128"):
        slices.build_slices("n", "uid", DRIVER, _gpus(1), 1, max_devices_per_slice=129)


def test_an_empty_inventory_still_publishes_one_empty_slice() -> None:
    (body,) = slices.build_slices("node-02", "uid", DRIVER, [], generation=1)
    assert body["spec"]["devices"] == []
    assert body["spec"]["pool"] == {"name": "node-02", "generation": 1, "resourceSliceCount": 1}


def test_devices_are_ordered_by_index_whatever_order_they_came_in() -> None:
    devices = _gpus(12)
    shuffled = devices[5:] + devices[:5][::-1]
    (body,) = slices.build_slices("n", "uid", DRIVER, shuffled, 1)
    assert _names(body) == [f"gpu-{i}" for i in range(12)]  # gpu-2 before gpu-10
    again = slices.build_slices("n", "uid", DRIVER, list(reversed(devices)), 1)
    assert json.dumps(again, sort_keys=False) == json.dumps([body], sort_keys=False)


def test_unhealthy_devices_are_left_out_of_the_pool() -> None:
    healthy, sick = _gpus(2)
    sick = model.Device(sick.name, sick.uuid, sick.attributes, sick.capacity, healthy=False)
    (body,) = slices.build_slices("n", "uid", DRIVER, [healthy, sick], 1)
    assert _names(body) == ["gpu-0"]


def test_duplicate_device_names_in_a_pool_are_rejected() -> None:
    device = _gpus(1)[0]
    with pytest.raises(model.InventoryError, match="'gpu-0' is used more than once"):
        slices.build_slices("n", "uid", DRIVER, [device, device], 1)


@pytest.mark.parametrize("driver", ["Gpu.Example.com", "gpu_example", "a" * 64, ""])
def test_a_driver_name_that_is_not_a_dns_subdomain_is_rejected(driver: str) -> None:
    with pytest.raises(ValueError, match="driver name"):
        slices.build_slices("n", "uid", driver, [], 1)


def test_long_node_names_still_give_valid_slice_names_and_labels() -> None:
    node = ".".join(["a" * 63] * 3) + ".b"  # 194 characters: a valid node name
    driver = "gpu." + "x" * 40 + ".example.com"  # 56 of the 63 allowed
    slice_names = [slices.slice_name(node, driver, i) for i in (0, 1)]
    assert all(len(n) <= 253 and names.is_dns_subdomain(n) for n in slice_names)
    assert slice_names[0] != slice_names[1]
    label = slices.node_label_value(node)
    assert len(label) <= 63
    assert label != slices.node_label_value(node[:-1] + "c")
    (body,) = slices.build_slices(node, "uid", driver, [], 1)
    assert body["metadata"]["labels"][labels.NODE_LABEL] == label


# --- slices_differ -------------------------------------------------------------------------------


def _pool(generation: int = 1, count: int = 3) -> list[slices.SliceBody]:
    return slices.build_slices("n", "uid", DRIVER, _gpus(count), generation)


def _as_stored(bodies: list[slices.SliceBody]) -> list[slices.SliceBody]:
    """What the API server hands back: server metadata added, quantities in canonical form."""
    stored = copy.deepcopy(bodies)
    for body in stored:
        body["metadata"] |= {"uid": "x", "resourceVersion": "42", "managedFields": []}
        for device in body["spec"]["devices"]:
            device["capacity"]["memory"]["value"] = "8192Mi"  # same amount, other spelling
    return stored


def test_an_unchanged_pool_does_not_differ_whatever_its_generation() -> None:
    assert not slices.slices_differ(_as_stored(_pool(generation=4)), _pool(generation=5))


def test_quantities_compare_by_value() -> None:
    stored = _as_stored(_pool())
    stored[0]["spec"]["devices"][0]["capacity"]["memory"]["value"] = "9Gi"
    assert slices.slices_differ(stored, _pool())


def test_no_existing_slices_differ_from_any_wanted_pool() -> None:
    assert slices.slices_differ([], _pool())
    assert slices.slices_differ([], slices.build_slices("n", "uid", DRIVER, [], 1))


def test_added_removed_or_changed_devices_differ() -> None:
    assert slices.slices_differ(_pool(count=3), _pool(count=4))
    assert slices.slices_differ(_pool(count=3), _pool(count=2))
    changed = _pool()
    changed[0]["spec"]["devices"][1]["attributes"]["productName"] = {"string": "Other"}
    assert slices.slices_differ(_pool(), changed)


def test_a_pool_caught_in_the_middle_of_an_update_differs() -> None:
    existing = slices.build_slices("n", "uid", DRIVER, _gpus(200), 2)
    existing[1]["spec"]["pool"]["generation"] = 1
    assert slices.slices_differ(existing, slices.build_slices("n", "uid", DRIVER, _gpus(200), 3))


def test_a_different_slice_count_differs_but_a_different_split_does_not() -> None:
    one = slices.build_slices("n", "uid", DRIVER, _gpus(10), 1)
    two = slices.build_slices("n", "uid", DRIVER, _gpus(10), 1, max_devices_per_slice=5)
    assert slices.slices_differ(one, two)
    other_split = copy.deepcopy(two)
    moved = other_split[0]["spec"]["devices"].pop()
    other_split[1]["spec"]["devices"].append(moved)
    assert not slices.slices_differ(other_split, two)


def test_driver_or_node_changes_differ_and_metadata_does_not() -> None:
    wanted = _pool()
    other_driver = copy.deepcopy(wanted)
    other_driver[0]["spec"]["driver"] = "other.example.com"
    assert slices.slices_differ(other_driver, wanted)
    relabelled = copy.deepcopy(wanted)
    relabelled[0]["metadata"] = {"name": "generated-x7k2p", "labels": {}}
    assert not slices.slices_differ(relabelled, wanted)


def test_every_slice_says_which_agent_published_it_and_that_is_no_change_of_the_pool() -> None:
    registered = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
    me = slices.Publisher.at(registered, "agent-x.1a2b3c4d")
    bodies = slices.build_slices("big", "uid", DRIVER, _gpus(200), 7, publisher=me)
    assert [slices.publisher_of(b) for b in bodies] == [me, me]
    assert bodies[0]["metadata"]["annotations"] == {
        slices.PUBLISHER_ANNOTATION: "2026-01-02T03:04:05.678901Z agent-x.1a2b3c4d"
    }
    other = slices.Publisher.at(registered, "agent-y.00000000")
    theirs = slices.build_slices("big", "uid", DRIVER, _gpus(200), 8, publisher=other)
    assert not slices.slices_differ(theirs, bodies)
    unsigned = slices.build_slices("big", "uid", DRIVER, _gpus(200), 7)
    assert "annotations" not in unsigned[0]["metadata"]
    assert slices.publisher_of(unsigned[0]) is None

"""MIG as partitionable devices: NVIDIA's A100 40GB and H100 80GB tables as counter layouts,
and the slices they are published in (Kubernetes 1.37's ``resource.k8s.io/v1`` rules)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from dra_gpu import slices
from dra_gpu.devices import mig, model, simulated

DRIVER = "gpu.example.com"
TABLES = [mig.A100_40GB, mig.H100_80GB]

# NVIDIA MIG User Guide, "Supported MIG Profiles": the most instances of each profile.
MAX_INSTANCES = {
    "A100-SXM4-40GB": {
        "1g.5gb": 7,
        "1g.5gb+me": 1,
        "1g.10gb": 4,
        "2g.10gb": 3,
        "3g.20gb": 2,
        "4g.20gb": 1,
        "7g.40gb": 1,
    },
    "H100-SXM5-80GB": {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
}


def fits(placements: list[mig.Placement]) -> bool:
    """What the scheduler admits: the summed consumption stays within the GPU's counters."""
    used: Counter[str] = Counter()
    for placement in placements:
        used.update(placement.counters())
    totals = mig.gpu_counters()
    return all(used[name] <= totals[name] for name in used)


def gpu(memory: str = "40Gi", index: int = 0) -> model.Device:
    return model.gpu_device(
        index=index,
        uuid=f"GPU-{index}",
        memory=memory,
        product_name="NVIDIA A100-SXM4-40GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        driver_version="550.54.15",
        mig_capable=True,
    )


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.model)
def test_profiles_add_up_to_the_hardware(table: mig.MigTable) -> None:
    per_slice = table.memory_gib // mig.MEMORY_SLICES
    for profile in table.profiles:
        assert profile.memory_gib == profile.memory_slices * per_slice, profile
        assert profile.name.startswith(f"{profile.compute_slices}g."), profile
        assert profile.name.split(".")[1].removesuffix("+me") == f"{profile.memory_gib}gb"
        for start in profile.starts:
            assert start >= 0
            assert start + profile.memory_slices <= mig.MEMORY_SLICES
            assert start % profile.memory_slices == 0 or profile.memory_slices == 1
    assert table.profiles[-1].memory_slices == mig.MEMORY_SLICES  # the 7g profile: all of it
    assert table.profiles[-1].compute_slices == mig.COMPUTE_SLICES


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.model)
def test_the_counters_admit_exactly_nvidias_instance_counts(table: mig.MigTable) -> None:
    for profile in table.profiles:
        own = [p for p in mig.placements(table) if p.profile == profile]
        most = max(
            n for n in range(len(own) + 1) for c in itertools.combinations(own, n) if fits(list(c))
        )
        assert most == MAX_INSTANCES[table.model][profile.name], profile.name


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.model)
def test_placements_the_counters_admit_never_overlap(table: mig.MigTable) -> None:
    # Every pair, and every maximal set found greedily from each start: admitted => disjoint
    # memory slices and at most 7 compute slices.
    every = mig.placements(table)
    for a, b in itertools.combinations(every, 2):
        overlap = set(a.memory_slices) & set(b.memory_slices)
        if fits([a, b]):
            assert not overlap, (a, b)
        else:
            assert (
                overlap
                or a.profile.compute_slices + b.profile.compute_slices > 7
                or (a.profile.media_extensions and b.profile.media_extensions)
            ), (a, b)
    for first in every:
        chosen = [first]
        for other in every:
            if other is not first and fits([*chosen, other]):
                chosen.append(other)
        slices_used = [i for p in chosen for i in p.memory_slices]
        assert len(slices_used) == len(set(slices_used))
        assert sum(p.profile.compute_slices for p in chosen) <= mig.COMPUTE_SLICES


def test_known_a100_layouts_are_admitted_and_impossible_ones_are_not() -> None:
    by_name = {(p.profile.name, p.start): p for p in mig.placements(mig.A100_40GB)}

    def layout(*keys: tuple[str, int]) -> list[mig.Placement]:
        return [by_name[k] for k in keys]

    assert fits(layout(("4g.20gb", 0), ("3g.20gb", 4)))
    assert fits(layout(("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)))
    assert fits(layout(*((("1g.5gb", i)) for i in range(7))))
    assert not fits(layout(("3g.20gb", 0), ("3g.20gb", 4), ("1g.5gb", 6)))  # slice 6 taken
    assert not fits(layout(("1g.5gb+me", 0), ("1g.5gb+me", 1)))  # one media extension
    assert not fits(layout(("4g.20gb", 0), ("2g.10gb", 4), ("2g.10gb", 2)))


def test_the_whole_gpu_consumes_every_counter_and_excludes_every_partition() -> None:
    counters, devices = mig.partitioned(gpu(), mig.A100_40GB)
    whole, *parts = devices
    assert whole.name == "gpu-0"
    assert whole.partition_of is None
    assert dict(whole.consumes[counters.name]) == dict(counters.counters)
    assert len(parts) == sum(len(p.starts) for p in mig.A100_40GB.profiles) == 25
    for part in parts:
        assert part.partition_of == "gpu-0"
        assert model.is_dns_label(part.name)
        together: Counter[str] = Counter(whole.consumes[counters.name])
        together.update(part.consumes[counters.name])
        assert any(together[c] > v for c, v in counters.counters.items())
    three = next(p for p in parts if p.name == "gpu-0-mig-3g-20gb-4")
    assert three.capacity["memory"] == "20Gi"
    assert three.attributes["profile"] == model.StringValue("3g.20gb")
    assert three.attributes["placementStart"] == model.IntValue(4)
    assert three.uuid.startswith("MIG-")


def test_slices_keep_counter_sets_apart_and_at_most_64_consuming_devices_each() -> None:
    inventory = mig.partition_inventory(
        "n", [gpu(index=i) for i in range(9)], {f"gpu-{i}": mig.A100_40GB for i in range(9)}
    )
    bodies = slices.build_slices(
        "n", "uid", DRIVER, inventory.devices, 3, counter_sets=inventory.counter_sets
    )
    counter_slices = [b for b in bodies if "sharedCounters" in b["spec"]]
    device_slices = [b for b in bodies if "devices" in b["spec"]]
    assert [len(b["spec"]["sharedCounters"]) for b in counter_slices] == [8, 1]
    assert all("devices" not in b["spec"] for b in counter_slices)
    assert sum(len(b["spec"]["devices"]) for b in device_slices) == 9 * 26
    assert max(len(b["spec"]["devices"]) for b in device_slices) == 64
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {len(bodies)}
    defined = {
        s["name"]: set(s["counters"]) for b in counter_slices for s in b["spec"]["sharedCounters"]
    }
    for body in device_slices:
        for device in body["spec"]["devices"]:
            assert 1 <= len(device["consumesCounters"]) <= 2
            for use in device["consumesCounters"]:
                assert set(use["counters"]) <= defined[use["counterSet"]]
                assert len(use["counters"]) <= 32
    assert all(len(c) <= 32 for c in defined.values())
    assert not slices.slices_differ(bodies, bodies)


def test_a_device_consuming_an_undefined_counter_is_refused() -> None:
    _, devices = mig.partitioned(gpu(), mig.A100_40GB)
    with pytest.raises(model.InventoryError, match=r"gpu-0-counters.*does not exist"):
        model.Inventory("n", devices)


def test_without_partitions_leaves_whole_gpus_that_consume_nothing() -> None:
    inventory = mig.partition_inventory("n", [gpu()], {"gpu-0": mig.A100_40GB})
    whole = inventory.without_partitions()
    assert [d.name for d in whole.devices] == ["gpu-0"]
    assert not whole.devices[0].consumes
    assert not whole.counter_sets


def test_a_profile_publishes_a_gpu_partitioned_by_its_mig_table() -> None:
    profile = simulated.parse_profile(
        "nodes:\n  n:\n    devices:\n"
        "    - {memory: 80Gi, migCapable: true, mig: H100-80GB}\n"
        "    - {memory: 24Gi}\n"
    )
    inventory = profile.inventory("n")
    assert [c.name for c in inventory.counter_sets] == ["gpu-0-counters"]
    names = [d.name for d in inventory.devices]
    assert names[:2] == ["gpu-0", "gpu-0-mig-1g-10gb-0"]
    assert names[-1] == "gpu-1"
    assert not inventory.by_name["gpu-1"].consumes


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("{memory: 40Gi, migCapable: true, mig: V100}", "devices[0].mig: 'V100' is not a MIG"),
        ("{memory: 40Gi, mig: A100-40GB}", "devices[0].migCapable: must be true"),
        ("{memory: 80Gi, migCapable: true, mig: A100-40GB}", "devices[0].memory: 80Gi is not"),
    ],
)
def test_bad_mig_fields_name_the_field(device: str, message: str) -> None:
    with pytest.raises(model.ProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        simulated.parse_profile(f"nodes:\n  n:\n    devices:\n    - {device}\n")

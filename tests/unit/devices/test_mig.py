"""MIG as partitionable devices: NVIDIA's A100 40GB and H100 80GB tables as counter layouts,
and the slices they are published in (Kubernetes 1.37's ``resource.k8s.io/v1`` rules)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter

import pytest

from dra_gpu.agent import slices
from dra_gpu.devices import mig, model, simulated
from dra_gpu.resource import names

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


def test_a_mig_mode_gpu_is_published_as_its_partitions_only() -> None:
    # NVIDIA's driver does not announce the full GPU of a MIG-mode GPU (whose mode it does not
    # toggle): a container given it would have no MIG device to run on.
    counters, parts = mig.partitioned(gpu(), mig.A100_40GB)
    assert counters is not None
    assert dict(counters.counters) == mig.gpu_counters()
    assert "gpu-0" not in {p.name for p in parts}
    assert len(parts) == sum(len(p.starts) for p in mig.A100_40GB.profiles) == 25
    for part in parts:
        assert part.partition_of == "gpu-0"
        assert names.is_dns_label(part.name)
        assert part.attributes["type"] == model.StringValue("mig")
    three = next(p for p in parts if p.name == "gpu-0-mig-3g-20gb-4")
    assert three.capacity["memory"] == "20Gi"
    assert three.attributes["profile"] == model.StringValue("3g.20gb")
    assert three.attributes["placementStart"] == model.IntValue(4)
    assert three.uuid.startswith("MIG-")
    inventory = mig.partition_inventory("n", [gpu(), gpu(index=1)], {"gpu-0": mig.A100_40GB})
    assert [d.name for d in inventory.devices if d.partition_of is None] == ["gpu-1"]


def test_device_names_tell_every_profile_option_apart_and_keep_the_old_ones() -> None:
    labels = {
        "3g.20gb": "3g-20gb",  # as every earlier version named them (recorded claims)
        "1g.5gb+me": "1g-5gb-me",
        "1g.24gb-me": "1g-24gb-no-me",  # without the media engines
        "1g.24gb+me.all": "1g-24gb-me-all",
        "1g.24gb+gfx": "1g-24gb-gfx",
        "2g.48gb-gfx": "2g-48gb-no-gfx",
    }
    for name, label in labels.items():
        assert mig.profile_label(name) == label, name
        assert names.is_dns_label(f"gpu-127-mig-{label}-6")
    assert len(set(labels.values())) == len(labels)
    assert mig.MigProfile("1g.5gb+me", 5, 1, 1, (0,), media_extensions=True).device_suffix == (
        "1g-5gb-me"
    )
    for table in TABLES:  # every placement of a table has a name of its own
        parts = [mig.partition_name_of("gpu-0", p) for p in mig.placements(table)]
        assert len(set(parts)) == len(parts)


def test_instances_of_others_keep_their_placements_and_counters_out() -> None:
    table = mig.A100_40GB
    by = {(p.profile.name, p.start): p for p in mig.placements(table)}
    theirs = dataclasses.replace(table, foreign=(by[("3g.20gb", 4)], by[("1g.5gb+me", 0)]))
    counters, parts = mig.partitioned(gpu(), theirs)
    assert counters is not None
    # Slices 0 and 4-7 are theirs, and 4 compute slices and the media engines.
    assert dict(counters.counters) == {
        "memory-slice-1": 1,
        "memory-slice-2": 1,
        "memory-slice-3": 1,
        "compute-slices": 3,
    }

    def placement(part: model.Device) -> mig.Placement:
        found = mig.placement_of(part)
        assert found is not None
        return by[(found.profile, found.start)]

    offered = sorted((p.profile.name, p.start) for p in map(placement, parts))
    assert offered == [("1g.10gb", 2), ("1g.5gb", 1), ("1g.5gb", 2), ("1g.5gb", 3), ("2g.10gb", 2)]
    # Whatever the scheduler may allocate together within these counters, the hardware takes.
    for n in range(1, len(parts) + 1):
        for chosen in itertools.combinations(parts, n):
            used: Counter[str] = Counter()
            for part in chosen:
                used.update(part.consumes[counters.name])
            if all(used[c] <= counters.counters[c] for c in used):
                placed = [placement(p) for p in chosen]
                for i, one in enumerate(placed):
                    assert mig.conflict(one, [*theirs.foreign, *placed[:i]]) is None, placed
    taken = dataclasses.replace(table, foreign=(by[("7g.40gb", 0)],))
    assert mig.partitioned(gpu(), taken) == (None, ())


def test_a_gpu_whose_placements_could_not_be_read_publishes_nothing() -> None:
    unread = dataclasses.replace(mig.A100_40GB, profiles=())
    inventory = mig.partition_inventory("n", [gpu(), gpu(index=1)], {"gpu-0": unread})
    assert [d.name for d in inventory.devices] == ["gpu-1"]
    assert not inventory.counter_sets


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
    assert sum(len(b["spec"]["devices"]) for b in device_slices) == 9 * 25
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
    assert devices
    with pytest.raises(model.InventoryError, match=r"gpu-0-counters.*does not exist"):
        model.Inventory("n", devices)


def test_without_partitions_a_mig_mode_gpu_keeps_only_its_full_size_partition() -> None:
    # 1.35: no counters, so only devices that cannot overlap: the whole GPUs, and of a MIG-mode
    # GPU the one partition that excludes every other (its 7g placement), consuming nothing.
    inventory = mig.partition_inventory("n", [gpu(), gpu(index=1)], {"gpu-0": mig.A100_40GB})
    alone = inventory.without_partitions()
    assert [d.name for d in alone.devices] == ["gpu-0-mig-7g-40gb-0", "gpu-1"]
    assert not any(d.consumes for d in alone.devices)
    assert not alone.counter_sets
    # With others' instances on it, no partition excludes all the others: nothing is offered.
    by = {(p.profile.name, p.start): p for p in mig.placements(mig.A100_40GB)}
    theirs = dataclasses.replace(mig.A100_40GB, foreign=(by[("1g.5gb", 6)],))
    taken = mig.partition_inventory("n", [gpu()], {"gpu-0": theirs}).without_partitions()
    assert taken.devices == ()


def test_a_profile_publishes_a_gpu_partitioned_by_its_mig_table() -> None:
    profile = simulated.parse_profile(
        "nodes:\n  n:\n    devices:\n"
        "    - {memory: 80Gi, migCapable: true, mig: H100-80GB}\n"
        "    - {memory: 24Gi}\n"
    )
    inventory = profile.inventory("n")
    assert [c.name for c in inventory.counter_sets] == ["gpu-0-counters"]
    names = [d.name for d in inventory.devices]
    assert names[0] == "gpu-0-mig-1g-10gb-0"
    assert "gpu-0" not in names
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


def test_mig_management_denied_is_a_field_of_a_gpu_with_mig_only() -> None:
    profile = simulated.parse_profile(
        "nodes:\n  n:\n    devices:\n"
        "    - {memory: 40Gi, migCapable: true, mig: A100-40GB, migManagement: denied}\n"
    )
    assert profile.mig_denied == {"n": frozenset({"gpu-0"})}
    assert not profile.inventory("n").devices
    for device, message in [
        ("{memory: 40Gi, migManagement: denied}", "devices[0].migManagement: only a GPU with mig"),
        (
            "{memory: 40Gi, migCapable: true, mig: A100-40GB, migManagement: maybe}",
            "devices[0].migManagement: expected allowed or denied, got 'maybe'",
        ),
    ]:
        with pytest.raises(model.ProfileError, match=re.escape(message)):
            simulated.parse_profile(f"nodes:\n  n:\n    devices:\n    - {device}\n")


def test_a_second_wave_sampled_half_allocated_is_not_taken_for_the_scheduler_being_done() -> None:
    # The flake of tests/e2e/test_mig.py (issue 26): the first wave's pods left, the scheduler
    # had allocated one waiting claim so far. The old wait took that sample as the second wave
    # (every pod "Running or refused once", and refused pods keep their FailedScheduling
    # Event), then waited for the instances of exactly that claim while the scheduler went on
    # allocating the others: the instance table never matched. The wait now goes on while a
    # waiting claim could still get a placement beside what is allocated.
    from tests.e2e.test_mig import PLACEMENTS, could_still_get

    offered = set(PLACEMENTS)
    by_name = {(p.profile.name, p.start): p for p in PLACEMENTS.values()}
    half = [by_name[("2g.10gb", 0)]]
    assert could_still_get("2g.10gb", half, offered)  # at memory slice 2 or 4: not done yet
    assert could_still_get("1g.5gb", half, offered)
    done = [by_name[("2g.10gb", 0)], by_name[("2g.10gb", 2)], by_name[("2g.10gb", 4)]]
    done.append(by_name[("1g.5gb", 6)])
    assert not could_still_get("2g.10gb", done, offered)  # 7 compute slices in use
    assert not could_still_get("1g.5gb", done, offered)
    # Only what is offered counts (1.35: the full-size partition alone).
    full = {"gpu-0-mig-7g-40gb-0"}
    assert not could_still_get("2g.10gb", [], full)
    assert could_still_get("7g.40gb", [], full)

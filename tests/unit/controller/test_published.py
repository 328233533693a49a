"""What the controller counts: complete pools at their newest generation, allocations."""

from dra_gpu.agent import slices
from dra_gpu.controller import claimed, published
from dra_gpu.devices import mig, simulated


def slice_(
    name: str,
    pool: str,
    generation: int,
    count: int,
    devices: list[str],
    node: str = "node-01",
    driver: str = "gpu.example.com",
) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": d, "capacity": {"memory": {"value": "8Gi"}}} for d in devices],
        },
    }


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    devices, problems = published.current_pools(
        [
            slice_("old", "node-01", 1, 1, ["gpu-0", "gpu-1", "gpu-2"]),
            slice_("new", "node-01", 2, 1, ["gpu-0"]),
        ]
    )
    assert [d.body["name"] for d in devices] == ["gpu-0"]
    assert problems == []


def test_an_incomplete_pool_is_a_problem_and_publishes_nothing() -> None:
    devices, problems = published.current_pools([slice_("a", "node-01", 3, 2, ["gpu-0"])])
    assert devices == []
    assert [p.message for p in problems] == [
        "pool node-01 of gpu.example.com is incomplete: 1 of 2 slices at generation 3"
    ]


def test_slices_that_disagree_on_their_count_make_an_incomplete_pool() -> None:
    devices, problems = published.current_pools(
        [
            slice_("a", "node-01", 3, 2, ["gpu-0"]),
            slice_("b", "node-01", 3, 2, ["gpu-1"]),
            slice_("c", "node-01", 3, 3, ["gpu-2"]),
        ]
    )
    assert devices == []
    assert [p.message for p in problems] == [
        "pool node-01 of gpu.example.com is incomplete: its 3 slices at generation 3 disagree "
        "on resourceSliceCount (2, 3)"
    ]


def test_per_node_counts_allocated_devices_and_memory_of_our_driver_only() -> None:
    devices, _ = published.current_pools(
        [
            slice_("a", "node-01", 1, 1, ["gpu-0", "gpu-1"]),
            slice_("b", "node-01-nic", 1, 1, ["nic-0"], driver="nic.example.com"),
        ]
    )
    holders = claimed.allocated(
        [
            {
                "metadata": {"namespace": "ns", "name": "c"},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "driver": "gpu.example.com",
                                    "pool": "node-01",
                                    "device": "gpu-1",
                                    "request": "g",
                                },
                                {
                                    "driver": "gpu.example.com",
                                    "pool": "node-01",
                                    "device": "gpu-0",
                                    "request": "a",
                                    "adminAccess": True,
                                },
                            ]
                        }
                    }
                },
            }
        ]
    )
    assert holders == {("gpu.example.com", "node-01", "gpu-1"): "ns/c"}
    counts = published.per_node(devices, holders, "gpu.example.com")["node-01"]
    assert (counts.published, counts.allocated, counts.free) == (2, 1, 1)
    assert (counts.memory, counts.memory_allocated) == (16 * 2**30, 8 * 2**30)


def test_claim_states() -> None:
    assert claimed.claim_state({"status": {}}) == "pending"
    assert claimed.claim_state({"status": {"allocation": {"x": 1}}}) == "allocated"
    assert claimed.claim_state({"status": {"allocation": {"x": 1}, "reservedFor": [{}]}}) == (
        "reserved"
    )


def test_a_partitioned_pool_with_counter_slices_reads_as_complete() -> None:
    # MIG: the counter sets come in slices without devices; the pool counts them all.
    profile = simulated.parse_profile(
        "nodes:\n  node-01:\n    devices:\n"
        "    - {memory: 40Gi, migCapable: true, mig: A100-40GB}\n    - {memory: 24Gi}\n"
    )
    inv = profile.inventory("node-01")
    bodies = slices.build_slices(
        "node-01", "uid", "gpu.example.com", inv.devices, 2, counter_sets=inv.counter_sets
    )
    assert len(bodies) == 2
    devices, problems = published.current_pools(bodies)
    assert problems == []
    assert len(devices) == 26  # 25 placements (not the whole GPU of a MIG-mode GPU), gpu-1
    assert {d.name for d in devices} >= {"gpu-1", "gpu-0-mig-7g-40gb-0"}
    assert len(mig.placements(mig.A100_40GB)) == 25

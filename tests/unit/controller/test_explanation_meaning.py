"""An explanation is posted again when its meaning changes, not when a count or a holder moves.

``meanings.of`` reads an explanation's structured form (reason, pieces, failing requests; the
words only where they count nothing); the ``Reporter`` posts an explanation only when that
differs from what it last posted on the claim, or from what the last Event on the claim says
it meant (its annotation) after a restart or a change of leader. The counts and holders stay in
each explanation (``Explainer.last``, ``dra-gpu explain``), so they are asserted there. Events
go to a fake API server that keeps them and lists them back in the core/v1 shape.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from dra_gpu.agent import slices
from dra_gpu.controller import command, explain, meanings
from dra_gpu.controller.explain import Reason
from dra_gpu.controller.explainer import Explainer
from dra_gpu.controller.meanings import Meaning
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.view import ClusterView
from dra_gpu.devices import simulated
from tests.support.events import FakeEvents

DRIVER = "gpu.example.com"
ALL = f'device.driver == "{DRIVER}"'
Body = dict[str, Any]


# --- bodies ------------------------------------------------------------------------------------


def gpu_class(name: str = "g", expression: str = ALL) -> Body:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def ready_node(name: str = "node-01", *, ready: bool = True) -> Body:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def gpu_slice(count: int, *, generation: int = 1, node: str = "node-01") -> Body:
    """``node``'s pool of ``count`` 80Gi GPUs, gpu-0 to gpu-<count-1>."""
    return {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}}
                for i in range(count)
            ],
        },
    }


MIG_PROFILE = """\
nodes:
  node-01:
    devices:
    - {memory: 40Gi, migCapable: true, mig: A100-40GB}
"""
FULL = "gpu-0-mig-7g-40gb-0"
FULL_SIZE = (
    f'"profile" in device.attributes["{DRIVER}"] && '
    f'device.attributes["{DRIVER}"].profile == "7g.40gb"'
)


def mig_slices() -> list[Body]:
    """node-01's A100 40GB, published by the agent as its partitions and their counters."""
    inventory = simulated.parse_profile(MIG_PROFILE).inventory("node-01")
    return slices.build_slices(
        "node-01", "uid", DRIVER, inventory.devices, 1, counter_sets=inventory.counter_sets
    )


def pending(
    name: str, *, count: int = 1, device_class: str = "g", selector: str | None = None
) -> Body:
    exactly: Body = {"deviceClassName": device_class, "count": count}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {},
    }


def allocated(name: str, device: str) -> Body:
    body = pending(name)
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "node-01", "device": device}
                ]
            }
        }
    }
    return body


def waiting_pod(claim: str) -> Body:
    return {
        "metadata": {"namespace": "ns", "name": f"pod-{claim}", "uid": f"uid-pod-{claim}"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
        "status": {"phase": "Pending"},
    }


def explained(
    claim: Body,
    holders: list[Body],
    *,
    slice_bodies: list[Body] | None = None,
    classes: dict[str, Body] | None = None,
    node: Body | None = None,
    detail: bool = True,
) -> explain.Explanation:
    """``claim`` against node-01 (ready unless told) and the ``holders``' allocations."""
    found = explain.build_world(
        slice_bodies if slice_bodies is not None else [gpu_slice(4)],
        [claim, *holders],
        {"node-01": node or ready_node()},
    )
    return explain.explain(
        claim,
        found,
        classes=classes if classes is not None else {"g": gpu_class()},
        pod=waiting_pod(claim["metadata"]["name"]),
        detail=detail,
    )


def held(*devices: str) -> list[Body]:
    """Claims a, b, c, ... holding ``devices`` in order."""
    return [allocated(chr(ord("a") + i), d) for i, d in enumerate(devices)]


# --- the key -----------------------------------------------------------------------------------


def test_more_devices_allocated_is_the_same_meaning_with_a_new_count() -> None:
    four = explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3"))
    five = explained(
        pending("w"),
        held("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"),
        slice_bodies=[gpu_slice(5)],
    )
    assert four.reason == five.reason == Reason.DEVICES_ALLOCATED
    assert four.message.endswith("and 1 more are allocated")  # the count is in the words...
    assert five.message.endswith("and 2 more are allocated")
    assert meanings.of(four) == meanings.of(five)  # ...not in the meaning


def test_other_holders_of_the_same_devices_are_the_same_meaning() -> None:
    before = explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3"))
    others = [*held("gpu-0", "gpu-1"), allocated("x", "gpu-2"), allocated("d", "gpu-3")]
    after = explained(pending("w"), others)
    assert "node-01/gpu-2 is allocated to ns/c" in before.message
    assert "node-01/gpu-2 is allocated to ns/x" in after.message
    assert meanings.of(before) == meanings.of(after)


def test_partitions_taking_more_counters_are_the_same_meaning() -> None:
    """The MIG burst: each partition allocated changed the full-size one's "held by" list."""
    burst = ["gpu-0-mig-1g-5gb-0", "gpu-0-mig-1g-5gb-1", "gpu-0-mig-1g-5gb-2"]
    found = [
        explained(pending("full", selector=FULL_SIZE), held(*burst[:n]), slice_bodies=mig_slices())
        for n in (1, 2, 3)
    ]
    assert [f.reason for f in found] == [Reason.DEVICES_ALLOCATED] * 3
    assert found[0].message.endswith("memory-slice 8, 7 free (held by ns/a)")
    assert found[2].message.endswith("memory-slice 8, 5 free (held by ns/a, ns/b, ns/c)")
    assert len({f.message for f in found}) == 3
    assert len({meanings.of(f) for f in found}) == 1


def test_the_counts_and_holders_stay_in_dra_gpu_explain() -> None:
    found = explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3"))
    rows = (command.Row(found, ("ns/pod-w",)),)
    target = command.render_target(rows, "")
    assert "devices  NO   request gpu: no device fits: node-01/gpu-0 is allocated to ns/a" in target
    assert "and 1 more are allocated" in target
    assert "and 1 more are allocated" in command.render_list(rows, "wide", all_namespaces=False)
    assert "and 1 more are allocated" in str(command.document(rows))


def test_the_devices_written_out_change_nothing() -> None:
    holders = held("gpu-0", "gpu-1", "gpu-2", "gpu-3")
    brief = explained(pending("w"), holders, detail=False)
    full = explained(pending("w"), holders)
    assert full.requests[0].devices
    assert not brief.requests[0].devices
    assert meanings.of(brief) == meanings.of(full)


def test_a_new_reason_piece_request_or_class_is_a_new_meaning() -> None:
    claim = pending("w")
    seen = {
        "allocated": explained(claim, held("gpu-0", "gpu-1", "gpu-2", "gpu-3")),
        "no class": explained(claim, [], classes={}),
        "no fit": explained(claim, [], classes={"g": gpu_class(expression="false")}),
        "node": explained(claim, [], node=ready_node(ready=False)),
        "not enough": explained(pending("w", count=5), []),
        "other class": explained(
            pending("w", device_class="h"),
            held("gpu-0", "gpu-1", "gpu-2", "gpu-3"),
            classes={"h": gpu_class("h")},
        ),
    }
    assert seen["node"].reason == Reason.NODE_EXCLUDED
    assert seen["not enough"].reason == Reason.NOT_ENOUGH_DEVICES
    found = {name: meanings.of(e) for name, e in seen.items()}
    assert len(set(found.values())) == len(found), found
    assert found["node"].pieces == (True, True, False, None)
    (request,) = found["other class"].requests
    assert (request.request, request.device_class, request.reason) == (
        "gpu",
        "h",
        Reason.DEVICES_ALLOCATED,
    )


def test_where_the_words_count_nothing_they_are_the_meaning() -> None:
    claim = pending("w")
    missing = meanings.of(explained(claim, [], classes={}))
    assert missing.requests[0].words == "request gpu: device class g does not exist"
    broken = [
        meanings.of(explained(claim, [], classes={"g": gpu_class(expression=e)}))
        for e in ("device.(", "device.driver ==")
    ]
    assert [b.reason for b in broken] == [Reason.SELECTOR_INVALID] * 2
    assert broken[0] != broken[1]  # which selector, and why, is what blocks

    claim["status"] = allocated("w", "gpu-0")["status"]
    bound = waiting_pod("w")
    bound["spec"]["nodeName"] = "node-01"

    def not_ready(message: str, since: str) -> Meaning:
        failure = explain.PrepareFailure(message, "node-01", since, "uid-pod-w")
        return meanings.of(
            explain.explain_claim(
                claim,
                pod=bound,
                classes={"g": gpu_class()},
                slices=[gpu_slice(4)],
                claims=[],
                nodes={"node-01": ready_node()},
                prepare_failure=failure,
            )
        )

    registered = "DRA driver gpu.example.com is not registered"
    first = not_ready(registered, "2026-01-01T10:00:00Z")
    assert first.reason == Reason.DRIVER_NOT_READY
    assert "on node-01" in first.words
    assert not_ready(registered, "2026-01-01T10:00:00Z") == first  # the kubelet's retry
    assert not_ready("NodePrepareResources failed: gpu-0 fell off", "2026-01-01T10:00:00Z") != first


def test_the_digest_names_a_meaning() -> None:
    meaning = meanings.of(explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3")))
    again = meanings.of(explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3")))
    other = meanings.of(explained(pending("w"), [], classes={}))
    assert meanings.digest(meaning) == meanings.digest(again)
    assert meanings.digest(meaning) != meanings.digest(other)
    assert len(meanings.digest(meaning)) == 20
    int(meanings.digest(meaning), 16)
    assert meanings.event_annotations(meaning) == {meanings.ANNOTATION: meanings.digest(meaning)}


def test_news_is_a_new_meaning_in_new_words() -> None:
    four = explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3"))
    five = explained(
        pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"), slice_bodies=[gpu_slice(5)]
    )
    missing = explained(pending("w"), [], classes={})
    said = meanings.Said(four.reason, four.message, meanings.of(four))

    def news(e: explain.Explanation, last: meanings.Said | None = said) -> bool:
        return meanings.is_news(last, e.reason, e.message, meanings.of(e))

    assert news(four, None)  # nothing said yet
    assert not news(four)
    assert not news(five)  # a new count
    assert news(missing)
    # The node goes NotReady while its devices are all held: a second piece missing, the same
    # reason and the very same words; posted again, it would read as a repeat.
    excluded = explained(
        pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3"), node=ready_node(ready=False)
    )
    assert meanings.of(excluded) != meanings.of(four)
    assert (excluded.reason, excluded.message) == (four.reason, four.message)
    assert not news(excluded)
    unknown = meanings.Said(four.reason, four.message)  # an Event without the annotation
    assert not news(four, unknown)
    assert news(five, unknown)


def test_an_event_says_what_it_meant_by_its_annotation() -> None:
    meaning = meanings.of(explained(pending("w"), held("gpu-0", "gpu-1", "gpu-2", "gpu-3")))
    other = meanings.of(explained(pending("w"), [], classes={}))
    annotations = meanings.event_annotations(meaning)
    event = {"metadata": {"annotations": annotations}, "reason": "R", "message": "words"}
    assert meanings.heard(event, meaning) == meanings.Said("R", "words", meaning)
    assert meanings.heard(event, other) == meanings.Said("R", "words")  # meant something else
    older = {"metadata": {}, "reason": "R", "message": "words"}  # before the annotation
    assert meanings.heard(older, meaning) == meanings.Said("R", "words")
    posted = {"metadata": {"annotations": annotations}, "reason": "R", "note": "words"}
    assert meanings.heard(posted, meaning) == meanings.Said("R", "words", meaning)
    assert meanings.heard(None, meaning) is None


# --- the post/skip decision ------------------------------------------------------------------


class Cluster:
    """One view, the Explainer and its Reporter on a fake API server; node-01 Ready."""

    def __init__(self, api: FakeEvents | None = None) -> None:
        self.api = api or FakeEvents()
        self.view = ClusterView(pods_without_claims=False)
        self.reporter = Reporter(self.api, "test")  # type: ignore[arg-type]
        self.explainer = Explainer(self.view, self.reporter, DRIVER, Selections())
        self.view.apply("DeviceClass", "ADDED", gpu_class())
        self.view.apply("Node", "ADDED", ready_node())

    def apply(self, kind: str, event_type: str, body: Body) -> None:
        self.view.apply(kind, event_type, copy.deepcopy(body))

    def wait(self, claim: Body) -> None:
        self.apply("ResourceClaim", "ADDED", claim)
        self.apply("Pod", "ADDED", waiting_pod(claim["metadata"]["name"]))

    def step(self) -> list[tuple[str, str, str]]:
        """One leader's pass and its posts: (kind, name, reason) of each Event it posted."""
        before = len(self.api.events)

        async def run() -> None:
            self.explainer.note(self.view.take_changes())
            await self.explainer.explain_pending()
            await self.explainer.post_due()

        asyncio.run(run())
        return [
            (e["regarding"]["kind"], e["regarding"]["name"], e["reason"])
            for e in self.api.events[before:]
        ]

    def message(self, key: str) -> str:
        found = self.explainer.last(key)
        assert found is not None
        return found.message


def test_allocations_elsewhere_are_worked_out_but_posted_only_when_the_reason_changes() -> None:
    cluster = Cluster()
    cluster.apply("ResourceSlice", "ADDED", gpu_slice(6))
    cluster.wait(pending("big", count=8))  # never 8 on one node of 6
    assert cluster.step() == [
        ("ResourceClaim", "big", "NotEnoughDevices"),
        ("Pod", "pod-big", "NotEnoughDevices"),
    ]
    assert cluster.message("ns/big").startswith(
        "request gpu: needs 8 devices on one node, at most 6 available"
    )
    posted = cluster.api.events[0]
    assert posted["metadata"]["annotations"] == {
        meanings.ANNOTATION: meanings.digest(meanings.of(cluster.explainer.last("ns/big")))  # type: ignore[arg-type]
    }

    for n in range(3):  # each allocation moves the counts and the holders in big's message
        explained = cluster.explainer.explained
        cluster.apply("ResourceClaim", "ADDED", allocated(f"x{n}", f"gpu-{n}"))
        assert cluster.step() == []
        assert cluster.explainer.explained == explained + 1  # worked out again: its inputs moved
        assert cluster.explainer.queued() == 0
    # The count as it is now: in the explanation (``dra-gpu explain``), not in a new Event.
    assert cluster.message("ns/big").startswith(
        "request gpu: needs 8 devices on one node, at most 3 available"
    )
    assert "node-01/gpu-2 is allocated to ns/x2" in cluster.message("ns/big")

    cluster.apply("DeviceClass", "DELETED", gpu_class())  # a new reason: told at once
    assert cluster.step() == [
        ("ResourceClaim", "big", "DeviceClassMissing"),
        ("Pod", "pod-big", "DeviceClassMissing"),
    ]
    cluster.apply("DeviceClass", "ADDED", gpu_class())  # back to the first meaning: told again
    assert [reason for _, _, reason in cluster.step()] == ["NotEnoughDevices"] * 2


def test_a_holder_that_changes_posts_nothing_and_a_free_device_is_the_schedulers_move() -> None:
    cluster = Cluster()
    cluster.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in held("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        cluster.apply("ResourceClaim", "ADDED", holder)
    cluster.wait(pending("w"))
    assert [reason for _, _, reason in cluster.step()] == ["DevicesAllocated"] * 2
    assert "node-01/gpu-2 is allocated to ns/c" in cluster.message("ns/w")

    cluster.apply("ResourceClaim", "DELETED", allocated("c", "gpu-2"))  # gpu-2 changes hands
    cluster.apply("ResourceClaim", "ADDED", allocated("y", "gpu-2"))
    assert cluster.step() == []
    assert "node-01/gpu-2 is allocated to ns/y" in cluster.message("ns/w")

    cluster.apply("ResourceClaim", "DELETED", allocated("y", "gpu-2"))  # free: nothing missing
    assert cluster.step() == []
    assert cluster.explainer.last("ns/w").reason == Reason.SATISFIABLE  # type: ignore[union-attr]


def test_a_burst_of_partitions_posts_the_waiting_claims_warning_once() -> None:
    cluster = Cluster()
    for body in mig_slices():
        cluster.apply("ResourceSlice", "ADDED", body)
    cluster.wait(pending("full", selector=FULL_SIZE))
    assert cluster.step() == []  # the full-size partition is free: the scheduler's move
    posted = []
    burst = ["gpu-0-mig-1g-5gb-0", "gpu-0-mig-1g-5gb-1", "gpu-0-mig-1g-5gb-2"]
    for holder in held(*burst):
        cluster.apply("ResourceClaim", "ADDED", holder)
        posted += cluster.step()
    assert posted == [
        ("ResourceClaim", "full", "DevicesAllocated"),
        ("Pod", "pod-full", "DevicesAllocated"),
    ]
    assert cluster.api.events[0]["note"].endswith("memory-slice 8, 7 free (held by ns/a)")
    assert cluster.message("ns/full").endswith(
        f"node-01/{FULL} needs compute-slices 7 of gpu-0-counters, 4 free; memory-slice 8, 5 free "
        "(held by ns/a, ns/b, ns/c)"
    )


def test_a_restarted_controller_reads_what_the_last_event_meant() -> None:
    first = Cluster()
    first.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in held("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        first.apply("ResourceClaim", "ADDED", holder)
    first.wait(pending("w"))
    assert len(first.step()) == 2

    # A new process, the same Events: gpu-2 changed hands meanwhile (other words, same meaning).
    second = Cluster(first.api)
    second.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in [*held("gpu-0", "gpu-1"), allocated("x", "gpu-2"), allocated("d", "gpu-3")]:
        second.apply("ResourceClaim", "ADDED", holder)
    second.wait(pending("w"))
    assert second.step() == []
    assert second.message("ns/w") != first.message("ns/w")


def test_an_event_of_a_controller_before_the_annotation_is_read_by_its_words() -> None:
    cluster = Cluster()
    cluster.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in held("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        cluster.apply("ResourceClaim", "ADDED", holder)
    cluster.wait(pending("w"))
    assert len(cluster.step()) == 2
    for event in cluster.api.events:
        del event["metadata"]["annotations"]

    same = Cluster(cluster.api)  # restarted: the last Event's words are today's
    same.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in held("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        same.apply("ResourceClaim", "ADDED", holder)
    same.wait(pending("w"))
    assert same.step() == []

    moved = Cluster(cluster.api)  # restarted: the words moved, and nothing says what they meant
    moved.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in [*held("gpu-0", "gpu-1"), allocated("x", "gpu-2"), allocated("d", "gpu-3")]:
        moved.apply("ResourceClaim", "ADDED", holder)
    moved.wait(pending("w"))
    assert [reason for _, _, reason in moved.step()] == ["DevicesAllocated"] * 2
    assert moved.step() == []  # annotated now: once


def test_a_replica_leading_again_reads_what_another_leader_posted_meanwhile() -> None:
    cluster = Cluster()
    cluster.apply("ResourceSlice", "ADDED", gpu_slice(4))
    for holder in held("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        cluster.apply("ResourceClaim", "ADDED", holder)
    cluster.wait(pending("w"))
    assert len(cluster.step()) == 2

    # While this replica stood by, the class went and the other leader said so.
    other = Cluster(cluster.api)
    other.apply("ResourceSlice", "ADDED", gpu_slice(4))
    other.apply("DeviceClass", "DELETED", gpu_class())
    other.wait(pending("w"))
    assert [reason for _, _, reason in other.step()] == ["DeviceClassMissing"] * 2

    cluster.explainer.restart()  # leading again; the class is back, as this replica last said
    assert [reason for _, _, reason in cluster.step()] == ["DevicesAllocated"] * 2

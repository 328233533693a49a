"""How the explanations are posted: a new leader's sweep does not hold up a new waiting pod, a
lane whose posts fail backs off, and a new leader reads what the last Events said with one list.

The Explainer and its Reporter on the fake Events server (``tests.support.events``)
(kept, listed back in the core/v1 shape); time is a ``FakeTime``: waits recorded, not slept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from dra_gpu.controller import meanings
from dra_gpu.controller.explainer import Explainer
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.view import ClusterView
from tests.support.api_servers import FakeTime
from tests.support.events import FakeEvents

DRIVER = "gpu.example.com"
Body = dict[str, Any]


def world(view: ClusterView) -> None:
    """A class of every GPU of ours and node-01 (Ready) with 4 of them."""
    view.apply(
        "DeviceClass",
        "ADDED",
        {
            "metadata": {"name": "g"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    view.apply(
        "Node",
        "ADDED",
        {
            "metadata": {"name": "node-01", "labels": {"kubernetes.io/hostname": "node-01"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )
    devices = [{"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}} for i in range(4)]
    view.apply(
        "ResourceSlice",
        "ADDED",
        {
            "metadata": {"name": "node-01-slice"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "node-01",
                "pool": {"name": "node-01", "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
    )


def wait(view: ClusterView, name: str) -> None:
    """Claim ``name`` (8 GPUs on one node of 4: never) and its waiting pod."""
    request = {"name": "gpu", "exactly": {"deviceClassName": "g", "count": 8}}
    view.apply(
        "ResourceClaim",
        "ADDED",
        {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [request]}},
            "status": {},
        },
    )
    view.apply(
        "Pod",
        "ADDED",
        {
            "metadata": {"namespace": "ns", "name": f"pod-{name}", "uid": f"uid-pod-{name}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
            "status": {"phase": "Pending"},
        },
    )


class Failing(Reporter):
    """A Reporter whose posts fail as long as ``failures`` says (one each)."""

    def __init__(self, api: FakeEvents, failures: Sequence[bool]) -> None:
        super().__init__(api, "test")  # type: ignore[arg-type]
        self.failures = list(failures)
        self.tries = 0

    async def report(self, claim: Body, pods: Sequence[Body], *args: Any, **kwargs: Any) -> bool:
        self.tries += 1
        if self.failures and self.failures.pop(0):
            raise OSError("connection reset by peer")
        return await super().report(claim, pods, *args, **kwargs)


async def test_a_new_leaders_sweep_goes_with_the_others_and_a_new_waiting_pod_before_them() -> None:
    view = ClusterView(pods_without_claims=False)
    world(view)
    for name in ("a", "b", "c"):
        wait(view, name)
    explainer = Explainer(view, Reporter(FakeEvents(), "test"), DRIVER, Selections())  # type: ignore[arg-type]
    explainer.note(view.take_changes())
    explainer.restart()  # this replica leads: what waits now is its sweep
    await explainer.explain_pending()
    assert explainer.lanes() == ([], ["ns/a", "ns/b", "ns/c"])
    wait(view, "new")  # a pod created meanwhile: the lane of new waiting pods
    explainer.note(view.take_changes())
    await explainer.explain_pending()
    assert explainer.lanes() == (["ns/new"], ["ns/a", "ns/b", "ns/c"])
    assert await explainer.post_due() == 4


async def test_a_lane_whose_posts_fail_backs_off_and_a_success_resets_it() -> None:
    time = FakeTime()
    view = ClusterView(pods_without_claims=False)
    world(view)
    wait(view, "a")
    reporter = Failing(FakeEvents(), [True, True, False, True, False])
    explainer = Explainer(view, reporter, DRIVER, Selections(), timing=time.timing)
    explainer.note(view.take_changes())
    posting = asyncio.create_task(explainer.post_forever())
    try:
        await explainer.explain_pending()
        for _ in range(50):
            await asyncio.sleep(0)
        assert reporter.tries == 3
        assert explainer.queued() == 0
        assert time.slept == [1.5, 3.0]  # RETRY: 1 s, then 2 s, each x 1.5 (the jitter drawn)
        wait(view, "b")
        explainer.note(view.take_changes())
        await explainer.explain_pending()
        for _ in range(50):
            await asyncio.sleep(0)
        assert reporter.tries == 5
        assert explainer.queued() == 0
        assert time.slept == [1.5, 3.0, 1.5]  # from the first delay again
    finally:
        posting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await posting


async def test_a_new_leader_reads_what_the_last_events_meant_with_one_list() -> None:
    api = FakeEvents()
    view = ClusterView(pods_without_claims=False)
    world(view)
    for name in ("a", "b", "c"):
        wait(view, name)
    first = Explainer(view, Reporter(api, "one"), DRIVER, Selections())  # type: ignore[arg-type]
    first.note(view.take_changes())
    first.restart()
    await first.explain_pending()
    assert await first.post_due() == 3
    posted = len(api.events)
    assert posted == 6
    assert all(meanings.ANNOTATION in e["metadata"]["annotations"] for e in api.events)

    api.lists.clear()
    again = ClusterView(pods_without_claims=False)  # another replica takes over
    world(again)
    for name in ("a", "b", "c"):
        wait(again, name)
    second = Explainer(again, Reporter(api, "two"), DRIVER, Selections())  # type: ignore[arg-type]
    second.note(again.take_changes())
    second.restart()
    await second.explain_pending()
    await second.post_due()
    assert len(api.events) == posted  # the same meaning on every claim: nothing posted
    assert api.lists == ["reportingComponent=dra-gpu-controller,involvedObject.kind=ResourceClaim"]

"""The fourth message on the claim: the kubelet's prepare failure, explained once, cleared once.

``PrepareFailures`` reads the kubelet's Events into the view; the ``Explainer`` explains the
claims of a bound, Pending pod as DriverNotReady (which driver, node, since when, what the
kubelet said) and, once the pod runs, posts one Normal all-clear. Events go to a recorder that
keeps what the API server would have stored.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dra_gpu.controller import explain
from dra_gpu.controller.explainer import Explainer
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.prepares import PrepareFailures
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.view import ClusterView
from dra_gpu.serving import metrics

DRIVER = "gpu.example.com"
Body = dict[str, Any]


class Recorder:
    """Takes Events as the API server would (create) and lists none back."""

    def __init__(self) -> None:
        self.events: list[Body] = []

    async def create(self, path: str, body: Body) -> Body:
        self.events.append(body)
        return body

    async def get(self, path: str, **query: Any) -> Body:
        return {"items": []}


def claim(name: str = "c", driver: str = DRIVER) -> Body:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver, "pool": "node-01", "device": "gpu-0"}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-p"}],
        },
    }


def pod(phase: str = "Pending", node: str | None = "node-01", uid: str = "uid-p") -> Body:
    spec: Body = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": uid},
        "spec": spec,
        "status": {"phase": phase},
    }


def kubelet_event(
    uid: str = "e1",
    count: int = 1,
    message: str = "DRA driver gpu.example.com is not registered",
    last: str = "2026-01-01T10:00:00Z",
) -> Body:
    return {
        "metadata": {"uid": uid, "namespace": "ns"},
        "reason": explain.PREPARE_FAILED,
        "type": "Warning",
        "message": f"Failed to prepare dynamic resources: prepare dynamic resources: {message}",
        "source": {"component": "kubelet", "host": "node-01"},
        "involvedObject": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "uid-p"},
        "firstTimestamp": "2026-01-01T10:00:00Z",
        "lastTimestamp": last,
        "count": count,
    }


class Cluster:
    def __init__(self) -> None:
        self.api = Recorder()
        self.view = ClusterView(pods_without_claims=False)
        self.prepares = PrepareFailures(self.api, self.view, lambda: None)  # type: ignore[arg-type]
        reporter = Reporter(self.api, "test")  # type: ignore[arg-type]
        self.explainer = Explainer(self.view, reporter, DRIVER, Selections())
        self.view.apply("DeviceClass", "ADDED", {"metadata": {"name": "g"}, "spec": {}})

    def posted(self) -> list[tuple[str, str, str, str]]:
        """(kind, type, reason, note) of every Event posted so far."""
        return [
            (e["regarding"]["kind"], e["type"], e["reason"], e["note"]) for e in self.api.events
        ]

    def step(self) -> list[tuple[str, str, str, str]]:
        """One leader's pass and its posts; returns the Events it posted."""
        before = len(self.api.events)

        async def run() -> None:
            self.explainer.note(self.view.take_changes())
            await self.explainer.explain_pending()
            await self.explainer.post_due()

        asyncio.run(run())
        return self.posted()[before:]


NOT_READY = (
    "driver gpu.example.com on node-01 has not prepared the claim since 2026-01-01T10:00:00Z; "
    "the kubelet says: DRA driver gpu.example.com is not registered (the node agent of "
    "gpu.example.com is not running on node-01, or has not registered with its kubelet yet)"
)


def test_the_kubelets_failure_is_explained_on_claim_and_pod_once_and_cleared_when_it_runs() -> None:
    cluster = Cluster()
    cluster.view.apply("ResourceClaim", "ADDED", claim())
    cluster.view.apply("Pod", "ADDED", pod())
    assert cluster.step() == []  # bound and Pending, but the kubelet has said nothing

    assert cluster.prepares.apply("ADDED", kubelet_event())  # the watch wakes the passes
    assert cluster.step() == [
        ("ResourceClaim", "Warning", "DriverNotReady", NOT_READY),
        ("Pod", "Warning", "DriverNotReady", NOT_READY),
    ]
    # The kubelet retries every sync: the same failure is nothing new.
    for count in range(2, 6):
        retried = kubelet_event(count=count, last=f"2026-01-01T10:00:{count * 10}Z")
        assert not cluster.prepares.apply("MODIFIED", retried)
        assert cluster.step() == []

    # The agent is back, the kubelet's next retry prepares the claim, the pod runs.
    cluster.view.apply("Pod", "MODIFIED", pod(phase="Running"))
    cleared = "driver gpu.example.com on node-01 prepared the claim: pod ns/p is Running"
    assert cluster.step() == [
        ("ResourceClaim", "Normal", "Prepared", cleared),
        ("Pod", "Normal", "Prepared", cleared),
    ]
    assert cluster.step() == []


def test_a_new_failure_of_the_same_pod_is_a_new_explanation() -> None:
    cluster = Cluster()
    cluster.view.apply("ResourceClaim", "ADDED", claim())
    cluster.view.apply("Pod", "ADDED", pod())
    cluster.prepares.apply("ADDED", kubelet_event())
    assert len(cluster.step()) == 2
    refused = "NodePrepareResources failed for claim ns/c: gpu-0 fell off the bus"
    later = kubelet_event(uid="e2", message=refused, last="2026-01-01T10:01:00Z")
    assert cluster.prepares.apply("ADDED", later)
    [(_, _, reason, note), _] = cluster.step()
    assert reason == "DriverNotReady"
    assert note.endswith(f"the kubelet says: {refused}")


def test_failures_of_other_drivers_pods_of_other_nodes_or_unbound_pods_are_not_ours() -> None:
    cluster = Cluster()
    cluster.view.apply("ResourceClaim", "ADDED", claim())
    cluster.view.apply("Pod", "ADDED", pod())
    other = "DRA driver nic.example.com is not registered"
    cluster.prepares.apply("ADDED", kubelet_event(message=other))
    assert cluster.step() == []
    cluster.prepares.apply("ADDED", kubelet_event(uid="e2", last="2026-01-01T11:00:00Z"))
    cluster.view.apply("Pod", "MODIFIED", pod(uid="another-pod-of-that-name"))
    assert cluster.step() == []


def test_occurrences_are_counted_once_and_expired_events_are_forgotten() -> None:
    cluster = Cluster()
    cluster.view.apply("Pod", "ADDED", pod())
    before = metrics.PREPARE_FAILURES._value.get()
    cluster.prepares.apply("ADDED", kubelet_event(count=1))
    cluster.prepares.apply("MODIFIED", kubelet_event(count=4))
    cluster.prepares.apply("SYNC", {"items": [kubelet_event(count=4)]})  # a relist
    assert metrics.PREPARE_FAILURES._value.get() - before == 4
    assert "ns/p" in cluster.view.prepare_failures
    assert cluster.prepares.apply("SYNC", {"items": []})  # expired meanwhile
    assert cluster.view.prepare_failures == {}

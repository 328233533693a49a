"""The controller's cluster-wide series: served by the leader only (absent on a standby's
page), the oldest pending claim's age, and time to Ready read from the pod's own Ready
condition — not from when the controller saw it."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller.main import Controller
from dra_gpu.controller.selections import Selections
from dra_gpu.controller.tallies import Tally, oldest_created, pending_age, timestamp
from dra_gpu.controller.timings import PodTimings, ready_since
from dra_gpu.controller.view import ClusterView
from dra_gpu.kube import transport
from dra_gpu.serving import metrics

UTC = datetime.UTC
CREATED = "2026-01-01T10:00:00Z"
NOON = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(text: str) -> datetime.datetime:
    moment = timestamp(text)
    assert moment is not None
    return moment


def claim(name: str, created: str | None = CREATED, allocated: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": f"uid-{name}"}
    if created is not None:
        meta["creationTimestamp"] = created
    body: dict[str, Any] = {"metadata": meta, "spec": {"devices": {"requests": []}}}
    if allocated:
        body["status"] = {"allocation": {"devices": {"results": []}}}
    return body


def pod(name: str, *conditions: dict[str, str], phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": CREATED,
        },
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
        "status": {"phase": phase, "conditions": list(conditions)},
    }


def condition(kind: str, status: str, since: str | None = None) -> dict[str, str]:
    found = {"type": kind, "status": status}
    if since is not None:
        found["lastTransitionTime"] = since
    return found


def page() -> str:
    return generate_latest(metrics.CONTROLLER).decode()


@pytest.fixture
def standby_afterwards() -> Iterator[None]:
    yield
    metrics.CLUSTER_WIDE.leading = False


# --- leader only -------------------------------------------------------------------------


async def test_a_standby_serves_no_cluster_wide_series_and_the_leader_all_of_them(
    standby_afterwards: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = kube.Kube(transport.Client("http://127.0.0.1:1"))  # never called: nothing to write
    controller = Controller(ControllerSettings(identity="replica-a"), api)
    controller.view.apply("ResourceClaim", "ADDED", claim("waiting"))
    cluster_wide = (
        "dra_gpu_claims{",
        "dra_gpu_pending_claim_age_seconds ",
        "dra_gpu_inconsistent_pools ",
        "dra_gpu_pod_running_seconds_bucket{",
        "dra_gpu_pod_claims_allocated_seconds_bucket{",
        "dra_gpu_prepare_failures_total ",
    )
    controller.leader.is_leader = False
    await controller.reconcile_once()
    standby = page()
    assert "dra_gpu_controller_leader 0.0" in standby
    assert "dra_gpu_controller_reconciles_total" in standby  # its own work: on every replica
    assert [name for name in cluster_wide if name in standby] == []
    # Kept up to date all the same: a standby that takes over serves current numbers.
    assert metrics.CLUSTER.get_sample_value("dra_gpu_claims", {"state": "pending"}) == 1

    controller.leader.is_leader = True
    await controller.reconcile_once()
    leading = page()
    assert "dra_gpu_controller_leader 1.0" in leading
    assert [name for name in cluster_wide if name not in leading] == []
    assert 'dra_gpu_claims{state="pending"} 1.0' in leading
    # A scrape of some names only (``/metrics?name[]=``) finds them on the leader too.
    restricted = metrics.CONTROLLER.restricted_registry(["dra_gpu_claims"])
    assert 'dra_gpu_claims{state="pending"} 1.0' in generate_latest(restricted).decode()

    # ... collecting that metric alone, not every cluster-wide series (tens of ms at 1,000
    # nodes: the probes of a benchmark, or a dashboard's single query, would pay for all).
    collected: list[str] = []
    for metric in (metrics.CLAIMS, metrics.DEVICES):
        monkeypatch.setattr(metric, "collect", _counting(metric, collected))
    generate_latest(restricted)
    assert collected == ["dra_gpu_claims"]
    generate_latest(metrics.CONTROLLER)
    assert sorted(collected) == ["dra_gpu_claims", "dra_gpu_claims", "dra_gpu_devices"]

    controller.leader.is_leader = False  # lost the lease: gone at the next pass
    await controller.reconcile_once()
    assert "dra_gpu_claims{" not in page()
    assert generate_latest(restricted).decode() == ""


def _counting(metric: Any, collected: list[str]) -> Callable[[], Any]:
    """``metric.collect``, noting the metric's name in ``collected`` at each call."""
    collect = metric.collect

    def counted() -> Any:
        collected.append(metric.describe()[0].name)
        return collect()

    return counted


# --- pending claim age -------------------------------------------------------------------


def test_the_oldest_pending_claim_is_the_earliest_created_readable_one() -> None:
    claims = [
        claim("b", "2026-01-01T11:00:00Z"),
        claim("a", "2026-01-01T10:30:00Z"),
        claim("unreadable", "yesterday"),
        claim("none", None),
    ]
    assert oldest_created(claims) == at("2026-01-01T10:30:00Z")
    assert oldest_created([]) is None
    assert pending_age(at("2026-01-01T10:30:00Z"), NOON) == 90 * 60
    assert pending_age(None, NOON) == 0
    assert pending_age(at("2026-01-01T12:00:05Z"), NOON) == 0  # our clock behind the API's


def test_the_age_gauge_follows_the_pending_claims_and_is_read_at_the_scrape() -> None:
    clock = [NOON]
    view = ClusterView(pods_without_claims=False)
    tally = Tally("gpu.example.com", Selections(), clock=lambda: clock[0])

    def age() -> float | None:
        return metrics.CLUSTER.get_sample_value("dra_gpu_pending_claim_age_seconds")

    view.apply("ResourceClaim", "ADDED", claim("old", "2026-01-01T11:00:00Z"))
    view.apply("ResourceClaim", "ADDED", claim("new", "2026-01-01T11:59:00Z"))
    view.apply("ResourceClaim", "ADDED", claim("done", "2026-01-01T09:00:00Z", allocated=True))
    tally.update(view, view.take_changes())
    assert age() == 3600
    clock[0] = NOON + datetime.timedelta(seconds=30)  # no pass in between: still current
    assert age() == 3630
    view.apply("ResourceClaim", "MODIFIED", claim("old", "2026-01-01T11:00:00Z", allocated=True))
    tally.update(view, view.take_changes())
    assert age() == 90  # "new" is the oldest one waiting now
    view.apply("ResourceClaim", "DELETED", claim("new", "2026-01-01T11:59:00Z"))
    tally.update(view, view.take_changes())
    assert age() == 0


# --- time to Ready -----------------------------------------------------------------------


def test_ready_since_is_the_ready_conditions_transition_while_it_is_true() -> None:
    ready = condition("Ready", "True", "2026-01-01T10:00:07Z")
    scheduled = condition("PodScheduled", "True", "2026-01-01T10:00:01Z")
    assert ready_since(pod("p", scheduled, ready), NOON) == at("2026-01-01T10:00:07Z")
    assert ready_since(pod("p", scheduled, condition("Ready", "False", CREATED)), NOON) is None
    assert ready_since(pod("p", scheduled), NOON) is None  # Running, no Ready condition yet
    assert ready_since(pod("p", condition("Ready", "True")), NOON) == NOON  # no time: ours


def test_the_view_keeps_the_pods_ready_condition_and_only_that() -> None:
    view = ClusterView(pods_without_claims=False)
    view.apply(
        "Pod",
        "ADDED",
        pod(
            "p",
            condition("PodScheduled", "True", "2026-01-01T10:00:01Z"),
            {**condition("Ready", "True", "2026-01-01T10:00:07Z"), "reason": "x"},
        ),
    )
    kept = view.pods["ns/p"]["status"]
    assert kept["conditions"] == [condition("Ready", "True", "2026-01-01T10:00:07Z")]
    assert kept["phase"] == "Running"


def test_time_to_ready_is_the_pods_own_whenever_the_controller_sees_it() -> None:
    def observed() -> tuple[float, float]:
        def sample(name: str) -> float:
            value = metrics.CLUSTER.get_sample_value(name)
            assert value is not None
            return value

        return (
            sample("dra_gpu_pod_running_seconds_count"),
            sample("dra_gpu_pod_running_seconds_sum"),
        )

    view = ClusterView(pods_without_claims=False)
    timings = PodTimings()
    count, total = observed()
    view.apply("ResourceClaim", "ADDED", claim("p", allocated=True))
    view.apply("Pod", "ADDED", pod("p", condition("Ready", "False", CREATED)))
    timings.update(view, view.take_changes(), NOON)
    assert observed() == (count, total)  # Running is not Ready
    view.apply("Pod", "MODIFIED", pod("p", condition("Ready", "True", "2026-01-01T10:00:07Z")))
    # Seen two hours late (a controller that just started): still the pod's 7 s.
    timings.update(view, view.take_changes(), NOON)
    assert observed() == (count + 1, total + 7)
    view.apply(
        "Pod",
        "MODIFIED",
        pod("p", condition("Ready", "True", "2026-01-01T10:05:00Z"), phase="Running"),
    )
    timings.update(view, view.take_changes(), NOON)
    assert observed() == (count + 1, total + 7)  # ready again later: timed once per pod

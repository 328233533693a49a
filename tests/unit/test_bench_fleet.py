"""``benchmarks/bench_fleet.py``'s readings: the API server's metrics page, the agents' log
lines, and the arithmetic that takes the idle window out (no cluster: text in, numbers out)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]

PAGE = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 7
apiserver_request_total{code="410",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 5
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 40
apiserver_selfrequest_total{group="",resource="configmaps",subresource="",verb="POST"} 2
apiserver_selfrequest_total{group="",resource="",subresource="/readyz",verb="GET"} 38
apiserver_watch_events_total{group="",resource="pods",version="v1"} 12
apiserver_watch_events_total{group="resource.k8s.io",resource="resourceclaims",version="v1"} 4
apiserver_watch_cache_events_dispatched_total{group="",resource="pods"} 6
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 13
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="CONNECT",version="v1"} 1
"""  # noqa: E501 - the page's lines as the API server writes them

LOG = """\
2026-12-02 13:53:12,511 WARNING dra_gpu.kube.watch: watch /apis/resource.k8s.io/v1/resourceslices broke (the server closed the connection in the middle of its answer); watching again from resourceVersion 286 in 1.5 s
2026-12-02 13:53:12,512 WARNING dra_gpu.kube.watch: watch /api/v1/pods broke (the server closed the connection in the middle of its answer); watching again from resourceVersion 284 in 0.9 s
2026-12-02 13:53:14,402 INFO dra_gpu.kube.watch: watch /api/v1/pods: resourceVersion gone (410); listing again in 2.9 s
2026-12-02 13:53:15,000 WARNING dra_gpu.agent.publisher: publishing the slices of node fleet-002 failed: connection refused
2026-12-02 13:53:17,348 INFO dra_gpu.agent.claimcache: claim cache: 0 pod(s) of node fleet-002 use claims; reading 0 claim(s)
"""  # noqa: E501 - an agent's log lines as it writes them


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        yield importlib.import_module("bench_fleet")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_resource_requests_are_counted_by_verb_and_resource_without_the_servers_own(
    bench: ModuleType,
) -> None:
    metrics = bench.ApiServerMetrics.parse(PAGE)
    assert metrics.requests == {
        ("LIST", "pods"): 8,
        ("POST", "pods/binding"): 3,
        ("POST", "configmaps"): 3,
    }


def test_watch_events_and_open_watches_are_read_by_resource(bench: ModuleType) -> None:
    metrics = bench.ApiServerMetrics.parse(PAGE)
    assert metrics.watch_events == {"pods": 12, "resourceclaims": 4}
    assert metrics.dispatched == {"pods": 6}
    assert metrics.watches == {"pods": 13}


def test_agent_log_lines_count_breaks_relists_and_failed_publications_by_path(
    bench: ModuleType,
) -> None:
    assert bench.log_counts(LOG) == {
        "broken watches /apis/resource.k8s.io/v1/resourceslices": 1,
        "broken watches /api/v1/pods": 1,
        "relists (410) /api/v1/pods": 1,
        "failed publishes": 1,
    }


def test_the_idle_rate_is_taken_out_over_the_windows_length(bench: ModuleType) -> None:
    # 12 s in 60 s, idle 1 s in 30 s: 12 - 2 = 10
    assert bench.above_idle(12.0, 60.0, 1.0, 30.0) == pytest.approx(10.0)


def test_cpu_time_is_read_for_a_live_process_and_zero_for_none(bench: ModuleType) -> None:
    assert bench.cpu_seconds(None) == 0.0
    assert bench.cpu_seconds(os.getpid()) > 0.0

"""A real Prometheus scrapes the driver; its answers are the cluster's truth.

The tutorial and a load of pods run on the session's real nodes, with an agent per node and the
session's controller, and a real Prometheus (Debian's package, ``dra_gpu.testing.Prometheus``)
scrapes them with the labels of the chart's ServiceMonitor and PodMonitor. The agents and the
controller are the host-side processes (same flags, ports and paths as the chart's pods): pods
of a real node live in its network namespace, which a Prometheus on the host cannot reach.

Then PromQL — the queries a platform team would write — must equal what the API server says:
free GPUs and allocated memory per node, pending claims, prepare failures, the p95 time from pod
creation to Ready. The chart's alert rules are loaded and evaluated by this Prometheus, every
dashboard panel's query returns data, every metric of docs/operations.md's tables is scraped, and
``promtool check metrics`` finds nothing to say about either component's page.

The load, on the tutorial profile plus four 16Gi GPUs on node-02:
  recomendador (tutorial, >= 24Gi)       -> node-01 gpu-0, Running
  load-0..2 (exactly 16Gi)               -> three of node-02's GPUs, Running
  bad-config (<= 8Gi, invalid GpuConfig) -> node-01 gpu-1, prepare fails at the agent
  too-big (>= 40Gi)                      -> pending: fits nowhere while one GPU is free
node-03 has a MIG-mode A100 40GB and a shared 20Gi GPU, so that the dashboard's partition and
share panels have data (Kubernetes 1.36+; on 1.35 the API server drops counters and sharing, and
those panels must be empty); it is cordoned for the load, so none of its devices (MIG
partitions of 5Gi and 40Gi among them) is allocated, and all are free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from dra_gpu import kube
from dra_gpu.devices import mig
from dra_gpu.resource import quantities
from dra_gpu.testing import (
    AgentProcess,
    ControllerProcess,
    ControlPlane,
    Prometheus,
    RealNode,
    ScrapeTarget,
    eventually,
)
from tests.e2e.helpers import (
    EXAMPLES,
    REPO,
    Kubectl,
    delete_our_slices,
    exists,
    gone,
    server_minor,
    workload,
)

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.example.com"
NODES = ("node-01", "node-02", "node-03")
CHART = REPO / "charts" / "dra-gpu"
DASHBOARD = CHART / "dashboards" / "dra-gpu.json"
RATE_INTERVAL = "5m"
"""What the dashboard's ``$__rate_interval`` stands for here (the load is minutes old)."""
RUNNING_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
"""``dra_gpu_pod_running_seconds``'s buckets (dra_gpu/serving/metrics.py)."""
REPLICA_LABELS = "instance, pod, service, endpoint, container"
"""Target labels that differ between controller replicas (combined with max, as the rules do)."""
PROFILE = """\
nodes:
  node-01:
    devices:
    - {name: gpu-0, memory: 24Gi, productName: NVIDIA L4}
    - {name: gpu-1, memory: 8Gi, productName: NVIDIA GeForce RTX 4060}
  node-02:
    devices:
    - {count: 4, memory: 16Gi}
  node-03:
    devices:
    - name: gpu-0
      memory: 40Gi
      migCapable: true
      mig: A100-40GB
      productName: NVIDIA A100-SXM4-40GB
    - name: gpu-1
      memory: 20Gi
      sharing: {mode: MPS, memory: {default: 4Gi, min: 4Gi, step: 4Gi}}
"""
PARTITIONED_NODE = "node-03"
PARTITION_METRICS = (
    "dra_gpu_counters",
    "dra_gpu_partitions_allocated",
    "dra_gpu_shared_memory_bytes",
    "dra_gpu_shares",
)
"""Series of partitioned and shared GPUs only (none on 1.35)."""


def node_03_devices(minor: int) -> int:
    """What node-03 publishes: every MIG placement of the A100 and the shared GPU; on 1.35
    the MIG GPU's full-size partition and the shared GPU exclusive."""
    return len(mig.placements(mig.A100_40GB)) + 1 if minor >= 36 else 2


def partition_panel(expr: str) -> bool:
    return any(f"{metric}{{" in expr for metric in PARTITION_METRICS)


def _rules(control_plane: ControlPlane, path: Path) -> Path:
    """The chart's PrometheusRule as a rule file, for release dra-gpu in namespace dra-gpu (the
    labels ScrapeTarget gives), the pending alert without its 10 minutes."""
    done = subprocess.run(
        [
            *(str(control_plane.binary("helm")), "template", "dra-gpu", str(CHART)),
            *("--namespace", "dra-gpu", "--set", "metrics.prometheusRule.enabled=true"),
            *("--set", "metrics.prometheusRule.for.claimsPendingWhileDevicesFree=0s"),
            *("--show-only", "templates/prometheusrule.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path.write_text(yaml.safe_dump({"groups": yaml.safe_load(done.stdout)["spec"]["groups"]}))
    return path


def _claim(name: str, selector: str, config: dict[str, Any] | None = None) -> kube.Body:
    exactly = {
        "deviceClassName": "gpu-inferencia",
        "selectors": [{"cel": {"expression": selector}}],
    }
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if config is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": config}]
    return {"metadata": {"name": name}, "spec": spec}


def _pod(name: str) -> kube.Body:
    return {
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [workload(claims=["gpu"])],
        },
    }


def _memory_at_least(size: str) -> str:
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{size}")) >= 0'


@dataclass
class Observed:
    """What the test set up, for the tests of this module to look at."""

    prometheus: Prometheus
    agents: list[AgentProcess]
    controller: ControllerProcess
    namespace: str
    minor: int
    """The API server's minor version."""
    load_started: float
    """``time.time()`` when the load began; PromQL's ``offset`` looks from before it."""

    def since_load(self) -> str:
        return f"{math.ceil(time.time() - self.load_started) + 1}s"


@pytest_asyncio.fixture(scope="module")
async def observed(
    api: kube.Kube,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    nodes: list[RealNode],
    controller: ControllerProcess,
    short_root: Path,
    prometheus_bin: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Observed]:
    root = short_root / "prometheus-test"
    root.mkdir()
    profile = root / "profile.yaml"
    profile.write_text(PROFILE)
    agents = [
        AgentProcess.on(
            node, control_plane.kubeconfig, root / f"agent-{node.name}", profile=profile
        )
        for node in nodes
    ]
    state = tmp_path_factory.mktemp("prometheus")
    prometheus = Prometheus(
        state, prometheus_bin, rule_files=[_rules(control_plane, state / "rules.yml")]
    )
    namespace = "t-prometheus"
    minor = await server_minor(api)
    cordon = f"/api/v1/nodes/{PARTITIONED_NODE}"
    try:
        await asyncio.gather(*(agent.astart(120) for agent in agents))
        await prometheus.astart()
        prometheus.set_targets(
            [ScrapeTarget.controller(controller), *(ScrapeTarget.agent(a) for a in agents)]
        )
        await eventually(prometheus.targets_up, what="every target scraped")
        # The pool of every node published and counted before the load (offsets look back).
        await eventually(
            lambda: prometheus.value('max(dra_gpu_devices{node="node-02",state="published"}) == 4'),
            what="node-02's four GPUs in Prometheus",
        )
        published = node_03_devices(minor)
        await eventually(
            lambda: prometheus.value(
                f'max(dra_gpu_devices{{node="{PARTITIONED_NODE}",state="published"}})'
                f" == {published}"
            ),
            what=f"{PARTITIONED_NODE}'s {published} devices in Prometheus",
        )
        # Nothing of the load goes to node-03: its devices stay free (the panels' data).
        await api.patch(cordon, {"spec": {"unschedulable": True}})
        await asyncio.sleep(2)  # one scrape of the quiet cluster before the load, for offsets
        load_started = time.time()
        await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        await eventually(
            lambda: exists(api, f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
            what="the namespace's default ServiceAccount",
        )
        await kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
        await kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "recomendador.yaml"))
        # Exactly 16Gi: node-02's GPUs, never the recomendador's gpu-0, whoever is first.
        sixteen = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) == 0'
        claims = [_claim(f"load-{i}", sixteen) for i in range(3)]
        claims.append(_claim("too-big", _memory_at_least("40Gi")))
        bad = {"apiVersion": "gpu.dra-gpu.io/v1alpha1", "kind": "GpuConfig"}
        claims.append(
            _claim(
                "bad-config",
                f'device.capacity["{DRIVER}"].memory.compareTo(quantity("8Gi")) <= 0',
                {"driver": DRIVER, "parameters": {**bad, "sharing": {"strategy": "Bogus"}}},
            )
        )
        for claim in claims:
            await api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim)
            await api.create(
                f"/api/v1/namespaces/{namespace}/pods", _pod(claim["metadata"]["name"])
            )

        async def settled() -> bool:
            pods = (await api.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            failures = await _prepare_failure_events(api, namespace)
            return len(running) == 4 and failures >= 1

        await eventually(settled, timeout=180, what="4 pods Running and a failed prepare")
        yield Observed(prometheus, agents, controller, namespace, minor, load_started)
    finally:
        with contextlib.suppress(kube.ApiError):
            await api.patch(cordon, {"spec": {"unschedulable": None}})
        with contextlib.suppress(kube.ApiError):
            await api.delete(f"/api/v1/namespaces/{namespace}")
        await eventually(
            lambda: gone(api, f"/api/v1/namespaces/{namespace}"),
            timeout=120,
            what=f"namespace {namespace} gone",
        )
        prometheus.stop()
        for agent in agents:
            agent.stop()
        with contextlib.suppress(kube.ApiError):
            await api.delete(f"{RESOURCE}/deviceclasses/gpu-inferencia")
        await delete_our_slices(api, NODES)


async def _prepare_failure_events(api: kube.Kube, namespace: str) -> int:
    """Occurrences of the kubelet's FailedPrepareDynamicResources in the namespace."""
    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/events",
        fieldSelector="reason=FailedPrepareDynamicResources",
    )
    return sum(int(e.get("count") or 1) for e in listing["items"])


@dataclass
class Truth:
    """The cluster as the API server says, for the session's nodes."""

    free: dict[str, int]
    allocated_memory: dict[str, int]
    pending_claims: int


async def _truth(api: kube.Kube) -> Truth:
    devices: dict[tuple[str, str], int] = {}  # (pool, device) -> memory bytes
    for item in (await api.get(f"{RESOURCE}/resourceslices"))["items"]:
        spec = item["spec"]
        if spec["driver"] != DRIVER or spec.get("nodeName") not in NODES:
            continue
        for device in spec.get("devices", []):
            memory = device.get("capacity", {}).get("memory", {}).get("value", "0")
            devices[(spec["pool"]["name"], device["name"])] = int(quantities.exact_value(memory))
    allocated: set[tuple[str, str]] = set()
    pending = 0
    for claim in (await api.get(f"{RESOURCE}/resourceclaims"))["items"]:
        allocation = claim.get("status", {}).get("allocation")
        if allocation is None:
            pending += 1
            continue
        for result in allocation["devices"]["results"]:
            if result["driver"] == DRIVER:
                allocated.add((result["pool"], result["device"]))
    free = {node: 0 for node in NODES}
    memory = {node: 0 for node in NODES}
    for (pool, device), size in devices.items():
        if (pool, device) in allocated:
            memory[pool] += size
        else:
            free[pool] += 1
    return Truth(free, memory, pending)


def _by_node(prometheus: Prometheus, metric: str, state: str) -> dict[str, int]:
    answer = prometheus.values(f'max by (node) ({metric}{{state="{state}"}})', by="node")
    return {node: int(answer.get(node, 0)) for node in NODES}


async def test_promql_answers_equal_the_cluster(observed: Observed, api: kube.Kube) -> None:
    prometheus = observed.prometheus

    async def agree() -> tuple[Truth, Truth] | None:
        truth = await _truth(api)
        seen = Truth(
            free=_by_node(prometheus, "dra_gpu_devices", "free"),
            allocated_memory=_by_node(prometheus, "dra_gpu_memory_bytes", "allocated"),
            pending_claims=int(prometheus.value('max(dra_gpu_claims{state="pending"})') or 0),
        )
        return (truth, seen) if truth == seen else None

    truth, _ = await eventually(agree, timeout=60, what="PromQL equal to the API server")
    # What the load should have made of the cluster, so the agreement means something.
    assert truth.free == {"node-01": 0, "node-02": 1, "node-03": node_03_devices(observed.minor)}
    assert truth.allocated_memory == {"node-01": 32 * 2**30, "node-02": 48 * 2**30, "node-03": 0}
    assert truth.pending_claims == 1
    # "Which node has a free 24Gi GPU?" — none now: gpu-0 is the recomendador's.
    assert (
        prometheus.query('max by (node) (dra_gpu_devices{state="free",node="node-01"}) > 0') == []
    )


async def test_prepare_failures_in_promql_equal_the_kubelets_events(
    observed: Observed, api: kube.Kube
) -> None:
    prometheus = observed.prometheus
    window = observed.since_load

    async def agree() -> tuple[int, int, int] | None:
        events = await _prepare_failure_events(api, observed.namespace)
        kubelet = prometheus.value(
            "max(dra_gpu_prepare_failures_total)"
            f" - max(dra_gpu_prepare_failures_total offset {window()})"
        )
        agents = prometheus.value('sum(dra_gpu_prepare_claims_total{result="error"})')
        found = (events, int(kubelet or 0), int(agents or 0))
        return found if events >= 1 and found == (events, events, events) else None

    # The kubelet retries every 10-15 s: the counts agree between two retries.
    await eventually(agree, timeout=90, what="agents' errors == controller's count == events")


async def test_p95_time_to_ready_is_the_pods_p95(observed: Observed, api: kube.Kube) -> None:
    prometheus = observed.prometheus
    pods = (await api.get(f"/api/v1/namespaces/{observed.namespace}/pods"))["items"]
    durations = sorted(
        _seconds(_ready_since(p)) - _seconds(p["metadata"]["creationTimestamp"])
        for p in pods
        if p["status"].get("phase") == "Running"
    )
    assert len(durations) == 4

    def since_load(le: str = "") -> str:
        """The histogram's buckets counted since the load (an offset to just before it)."""
        bucket = (
            f'dra_gpu_pod_running_seconds_bucket{{le="{le}"}}'
            if le
            else ("dra_gpu_pod_running_seconds_bucket")
        )
        return (
            f"max without ({REPLICA_LABELS}) ({bucket})"
            f" - max without ({REPLICA_LABELS}) ({bucket} offset {observed.since_load()})"
        )

    await eventually(
        lambda: prometheus.value(since_load("+Inf")) == len(durations),
        timeout=60,
        what=f"{len(durations)} pods timed to Ready in Prometheus",
    )
    p95 = prometheus.value(f"histogram_quantile(0.95, {since_load()})")
    assert p95 is not None
    # The true p95 (nearest rank) and PromQL's are in the same bucket: the controller reads
    # the same two timestamps of each pod (creation, the Ready condition's transition), not
    # the time its watch showed the pod.
    true_p95 = durations[math.ceil(0.95 * len(durations)) - 1]
    low, high = _bucket(true_p95)
    assert low <= p95 <= high, (p95, durations)


def _ready_since(pod: kube.Body) -> str:
    """When the kubelet reported the pod Ready (its containers running)."""
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", pod["status"]
    return str(ready["lastTransitionTime"])


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _bucket(seconds: float) -> tuple[float, float]:
    lower = 0.0
    for upper in RUNNING_BUCKETS:
        if seconds <= upper:
            return lower, upper
        lower = upper
    return lower, math.inf


async def test_chart_alerts_evaluate_and_fire_for_what_happened(
    observed: Observed, api: kube.Kube
) -> None:
    prometheus = observed.prometheus
    groups = prometheus.rule_groups()
    rules = [rule for group in groups for rule in group["rules"]]
    shipped = [
        rule["alert"]
        for path in prometheus.rule_files
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    assert sorted(rule["name"] for rule in rules) == sorted(shipped), "every alert loaded"
    assert all(rule["health"] == "ok" for rule in rules), [
        (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
    ]

    def firing() -> set[str] | None:
        names = {a["labels"]["alertname"] for a in prometheus.alerts() if a["state"] == "firing"}
        wanted = {"DraGpuClaimsPendingWhileDevicesFree", "DraGpuPrepareFailures"}
        return names if wanted <= names else None

    names = await eventually(firing, what="the pending and the prepare-failure alerts firing")
    assert not names & {
        "DraGpuControllerNoLeader",
        "DraGpuAgentDown",
        "DraGpuCheckpointCorrupted",
        "DraGpuInconsistentPools",
        "DraGpuNoFreeDeviceInClass",
    }, names
    pending = next(
        a
        for a in prometheus.alerts()
        if a["labels"]["alertname"] == "DraGpuClaimsPendingWhileDevicesFree"
    )
    assert pending["annotations"]["summary"] == "1 ResourceClaims pending while GPUs are free"
    free = sum((await _truth(api)).free.values())  # node-02's one and all of node-03's
    assert f"while {free} GPUs are free" in pending["annotations"]["description"]


def _dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


async def test_every_dashboard_query_returns_data(observed: Observed) -> None:
    prometheus = observed.prometheus
    # The dashboard's job variables are label_values(<metric>, job), "All" selected.
    jobs = {
        "$controller_job": prometheus.api(
            "label/job/values", **{"match[]": "dra_gpu_controller_leader"}
        ),
        "$agent_job": prometheus.api(
            "label/job/values", **{"match[]": "dra_gpu_prepare_claims_total"}
        ),
    }
    assert all(jobs.values()), jobs
    empty = []
    finite: dict[str, bool] = {}
    plain = observed.minor < 36  # no counters, no shares: those panels are empty
    for title, expr in _dashboard_queries():
        query = expr.replace("$__rate_interval", RATE_INTERVAL)
        for variable, values in jobs.items():
            # As Grafana writes an "All" of a multi-value variable: a|b, dots escaped.
            query = query.replace(variable, "|".join(v.replace(".", "\\\\.") for v in values))
        assert "$" not in query, f"{title}: unknown variable in {expr}"
        samples = prometheus.query(query)
        if plain and partition_panel(expr):
            assert samples == [], f"{title}: series of partitions or shares on 1.{observed.minor}"
            continue
        if not samples:
            empty.append(f"{title}: {query}")
        numbers = [float(s["value"][1]) for s in samples]
        finite[title] = finite.get(title, False) or any(not math.isnan(v) for v in numbers)
    assert not empty, "queries without data:\n" + "\n".join(empty)
    # A quantile is NaN where nothing was observed (no unprepare yet); never a whole panel.
    assert all(finite.values()), [title for title, ok in finite.items() if not ok]


def _readme_metrics() -> set[str]:
    text = (REPO / "docs" / "operations.md").read_text()
    found = set()
    for section in ("### Agent metrics", "### Controller metrics"):
        table = text.split(section, 1)[1].split("\n#", 1)[0]
        found |= set(re.findall(r"^\| `(dra_gpu_[a-z_]+)`", table, flags=re.MULTILINE))
    return found


async def test_every_readme_metric_is_scraped_and_queried(observed: Observed) -> None:
    names = set(observed.prometheus.api("label/__name__/values"))
    documented = _readme_metrics()
    assert len(documented) >= 20
    queried = " ".join(expr for _, expr in _dashboard_queries())
    # Only while two agents fight over a pool does this one have a series (docs/); the
    # foreign instances only where MIG instances of others exist (tests/e2e/test_mig.py).
    # node-03's MIG-mode GPU is on dra_gpu_mig_management.
    only_sometimes = {"dra_gpu_slice_pool_other_writer", "dra_gpu_mig_foreign_instances"}
    for metric in sorted(documented):
        series = {metric, f"{metric}_bucket"}
        assert metric in only_sometimes or series & names, f"{metric} not scraped"
        assert metric in queried, f"{metric} in no dashboard query"


async def test_promtool_finds_both_metrics_pages_clean(observed: Observed) -> None:
    for process in (observed.controller, *observed.agents):
        page = await asyncio.to_thread(process.metrics)
        assert observed.prometheus.check_metrics(page) == "", f"{process}"

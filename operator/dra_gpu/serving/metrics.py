"""Every Prometheus metric of dra-gpu, defined once with its help text.

Names follow the conventions: prefix ``dra_gpu_``, base units, counters end in ``_total``.
Labels stay bounded (result, node, class — never a claim or a pod), and the series of every
known label value exist from the start, so dashboards show zeros instead of gaps. No label is
called ``instance`` or ``job``: a scrape sets those, and would rename ours ``exported_*``.

Each registry also carries what Prometheus' client libraries export by default — the
process's ``process_*`` (resident memory, CPU, open files) and ``python_*`` collectors — and
``dra_gpu_build_info``; counters and histograms carry no ``_created`` series (one more series
each, which nothing here queries). Both components count their API client's requests
(``ApiRequests``, the ``kube.RequestObserver`` each passes to its client).

The controller's cluster-wide series (devices, memory, classes, claims, partitions and shares,
pools, pod timings, the kubelets' prepare failures) live in ``CLUSTER``, which every replica
keeps up to date but only the leader serves (``CLUSTER_WIDE``: one gate per metric on
``CONTROLLER``, which yields its series while ``leading``). A standby's page has none of
them — absent, not zero — so ``sum`` over replicas counts each device once, and a standby
that takes over serves numbers already current. What a replica did itself (explanations
posted, repairs, passes, its API requests) stays on every replica's page.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from typing import TypeVar

import prometheus_client
from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

import dra_gpu

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

AGENT = CollectorRegistry()
"""What ``dra-gpu agent`` serves on ``/metrics``."""
CONTROLLER = CollectorRegistry()
"""What ``dra-gpu controller`` serves on ``/metrics``."""

for _registry in (AGENT, CONTROLLER):
    ProcessCollector(registry=_registry)
    PlatformCollector(registry=_registry)
    _registry.register(GC_COLLECTOR)
    Gauge(
        "dra_gpu_build_info",
        "1, labelled with the running dra-gpu version and the Python it runs on.",
        ["version", "python_version"],
        registry=_registry,
    ).labels(dra_gpu.__version__, platform.python_version()).set(1)

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)
RESULTS = ("success", "error")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 45)
_API_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_POD_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)


class ApiRequests:
    """A component's API client requests: a counter by verb and code and a latency histogram
    by verb, in ``registry``. Called as a ``kube.RequestObserver`` (``kube.Kube(observer=...)``);
    series appear with the first request of each verb (and code)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dra_gpu_api_requests_total",
            "Requests of this process's Kubernetes API client, by verb (the HTTP method; WATCH "
            "for a watch) and code (the answer's status code; <error> for no answer).",
            ["verb", "code"],
            registry=registry,
        )
        self.seconds = Histogram(
            "dra_gpu_api_request_duration_seconds",
            "Time from sending a request of this process's API client to its answer's status "
            "line (a watch: until it streams), by verb.",
            ["verb"],
            buckets=_API_BUCKETS,
            registry=registry,
        )

    def __call__(self, verb: str, code: str, seconds: float) -> None:
        self.requests.labels(verb, code).inc()
        self.seconds.labels(verb).observe(seconds)


class LeaderOnly:
    """Whether ``registry`` serves the cluster-wide series (``serve``): while ``leading``.

    One gate per metric, so that a scrape of some names only (``name[]``) collects those
    metrics alone: a single collector holding every cluster-wide series would be collected
    whole for any of its names (tens of milliseconds at a thousand nodes)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.leading = False

    def serve(self, metric: _Metric) -> _Metric:
        """``metric`` (kept in ``CLUSTER``) served on ``registry`` while ``leading``."""
        self.registry.register(_Gated(self, metric))
        return metric


class _Gated:
    """One metric's series while its ``LeaderOnly`` is ``leading``; its name always."""

    def __init__(self, gate: LeaderOnly, metric: MetricWrapperBase) -> None:
        self.gate, self.metric = gate, metric

    def collect(self) -> Iterable[Metric]:
        return self.metric.collect() if self.gate.leading else ()

    def describe(self) -> Iterable[Metric]:
        return self.metric.describe()


# --- node agent ---------------------------------------------------------------------------------

AGENT_API = ApiRequests(AGENT)
"""The agent's API client's requests (its ``kube.Kube``'s observer)."""
REGISTERED = Gauge(
    "dra_gpu_agent_registered",
    "1 once the kubelet registered this agent's plugin; 0 before, after the kubelet refused "
    "it, and while its sockets are gone or another agent's replaced them (until the kubelet "
    "registers it again).",
    registry=AGENT,
)

PREPARES = Counter(
    "dra_gpu_prepare_claims_total",
    "Claims prepared by NodePrepareResources, by result.",
    ["result"],
    registry=AGENT,
)
UNPREPARES = Counter(
    "dra_gpu_unprepare_claims_total",
    "Claims unprepared by NodeUnprepareResources, by result.",
    ["result"],
    registry=AGENT,
)
PREPARE_SECONDS = Histogram(
    "dra_gpu_prepare_claim_duration_seconds",
    "Time to prepare one claim (claim read, CDI spec, checkpoint), by result.",
    ["result"],
    buckets=_LATENCY_BUCKETS,
    registry=AGENT,
)
UNPREPARE_SECONDS = Histogram(
    "dra_gpu_unprepare_claim_duration_seconds",
    "Time to unprepare one claim, by result.",
    ["result"],
    buckets=_LATENCY_BUCKETS,
    registry=AGENT,
)
CLAIM_READS = Counter(
    "dra_gpu_claim_reads_total",
    "Claims read by prepare, by source: the copy read as its pod was bound to the node (cache) "
    "or a GET of its own (api).",
    ["source"],
    registry=AGENT,
)
WATCH_LIVE = Gauge(
    "dra_gpu_watch_live",
    "1 while the agent's watch of its node's objects has their state and is open (pods: the "
    "claim cache's; resourceslices: the publisher's), 0 while it is broken or not synced yet.",
    ["resource"],
    registry=AGENT,
)
STATUS_WRITES_PENDING = Gauge(
    "dra_gpu_status_writes_pending",
    "ResourceClaim status.devices writes not done yet (waiting to coalesce, in flight, or to "
    "be retried): how far the claims' status is behind this agent.",
    registry=AGENT,
)
PREPARED_DEVICES = Gauge(
    "dra_gpu_prepared_devices",
    "Devices of prepared claims on this node (from the checkpoint).",
    registry=AGENT,
)
PREPARED_CLAIMS = Gauge("dra_gpu_prepared_claims", "Claims prepared on this node.", registry=AGENT)
INVENTORY_DEVICES = Gauge(
    "dra_gpu_inventory_devices",
    "Devices the inventory backend reports, by node.",
    ["node"],
    registry=AGENT,
)
INVENTORY_MEMORY = Gauge(
    "dra_gpu_inventory_memory_bytes",
    "Memory of the devices the backend reports, by node.",
    ["node"],
    registry=AGENT,
)
SLICE_PUBLICATIONS = Counter(
    "dra_gpu_slice_publications_total",
    "ResourceSlice pool publications (a new generation written), by result.",
    ["result"],
    registry=AGENT,
)
SLICE_POOL_CONFLICTS = Counter(
    "dra_gpu_slice_pool_conflicts_total",
    "Writes of another agent (same driver and node) found over this agent's ResourceSlice pool.",
    registry=AGENT,
)
SLICE_POOL_YIELDING = Gauge(
    "dra_gpu_slice_pool_yielding",
    "1 while this agent leaves its pool to another agent that the kubelet registered later.",
    registry=AGENT,
)
SLICE_POOL_OTHER_WRITER = Gauge(
    "dra_gpu_slice_pool_other_writer",
    "1 for the other agent last found writing this agent's pool (agent: this agent, other: "
    "that one, or 'unnamed'); no series without a conflict in the last 5 minutes.",
    ["agent", "other"],
    registry=AGENT,
)
MIG_MANAGEMENT = Gauge(
    "dra_gpu_mig_management",
    "1 for each MIG-mode GPU's state at the agent's start (managed: the agent creates and "
    "destroys its instances; refused: NVML refused it MIG management, no privileges, so its "
    "partitions are not published), 0 for the other.",
    ["node", "gpu", "state"],
    registry=AGENT,
)
MIG_FOREIGN_INSTANCES = Gauge(
    "dra_gpu_mig_foreign_instances",
    "MIG instances on a GPU that the agent did not make and leaves alone (found at its start); "
    "the placements they block are not published.",
    ["node", "gpu"],
    registry=AGENT,
)
DEVICE_HEALTH = Gauge(
    "dra_gpu_device_health",
    "1 for each device's current health state (healthy; degraded: tainted until quiet; "
    "fatal: tainted until the GPU is reset), 0 for the others.",
    ["node", "device", "state"],
    registry=AGENT,
)
DEVICE_MONITORED = Gauge(
    "dra_gpu_device_health_monitored",
    "1 for each device whose faults the agent sees (NVML events registered), 0 for one whose "
    "registration NVML refused: its XIDs and ECC errors go unseen (a lost GPU is still noticed).",
    ["node", "device"],
    registry=AGENT,
)
DEVICE_FAULTS = Counter(
    "dra_gpu_device_faults_total",
    "Device faults that tainted a device (a new or escalated taint), by cause (xid, ecc, lost, "
    "recovery).",
    ["node", "cause"],
    registry=AGENT,
)
DEVICE_TAINT_CHANGES = Counter(
    "dra_gpu_device_taint_changes_total",
    "Device taints published (added) or cleared (after the quiet period, a reset, an operator).",
    ["node", "change"],
    registry=AGENT,
)
CHECKPOINT_CORRUPTIONS = Counter(
    "dra_gpu_checkpoint_corruptions_total",
    "Checkpoint files found corrupt at start, moved aside and rebuilt.",
    registry=AGENT,
)

for _result in RESULTS:
    PREPARES.labels(_result)
    UNPREPARES.labels(_result)
    PREPARE_SECONDS.labels(_result)
    UNPREPARE_SECONDS.labels(_result)
    SLICE_PUBLICATIONS.labels(_result)
for _source in ("cache", "api"):
    CLAIM_READS.labels(_source)
for _watched in ("pods", "resourceslices"):
    WATCH_LIVE.labels(_watched)

# --- controller ---------------------------------------------------------------------------------

CLUSTER = CollectorRegistry()
"""The controller's cluster-wide series: served on ``CONTROLLER`` only while ``CLUSTER_WIDE``
is ``leading``."""
CLUSTER_WIDE = LeaderOnly(CONTROLLER)
"""Serves each metric of ``CLUSTER`` on ``CONTROLLER`` while this replica leads."""
CONTROLLER_API = ApiRequests(CONTROLLER)
"""The controller's API client's requests (its ``kube.Kube``'s observer; Kopf's watches use
Kopf's own client)."""

DEVICES = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_devices",
        "Devices of our driver in published (complete) pools, by node and state "
        "(published, allocated, free).",
        ["node", "state"],
        registry=CLUSTER,
    )
)
TAINTED_DEVICES = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_tainted_devices",
        "Published devices of our driver with a taint, by node and worst effect (NoSchedule: no "
        "new claims; NoExecute: their pods are evicted too).",
        ["node", "effect"],
        registry=CLUSTER,
    )
)
CLASS_DEVICES = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_class_devices",
        "Devices that a DeviceClass's selectors admit, by class and state "
        "(published, allocated, free).",
        ["deviceclass", "state"],
        registry=CLUSTER,
    )
)
MEMORY = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_memory_bytes",
        "Memory capacity of our devices, by node and state (published, allocated, free).",
        ["node", "state"],
        registry=CLUSTER,
    )
)
COUNTERS = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_counters",
        "Counters of our partitioned devices' counter sets (sharedCounters), by node, counter set, "
        "counter and state (used by allocated devices, free); counters alike add up "
        "(memory-slice-0..7 as memory-slice).",
        ["node", "counter_set", "counter", "state"],
        registry=CLUSTER,
    )
)
PARTITIONS_ALLOCATED = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_partitions_allocated",
        "Allocated devices of our driver that consume a counter set (MIG partitions, or the whole "
        "GPU), by node and counter set.",
        ["node", "counter_set"],
        registry=CLUSTER,
    )
)
SHARED_MEMORY = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_shared_memory_bytes",
        "Memory capacity of our shared devices (allowMultipleAllocations), by node, device and "
        "state (published, used by the shares held, free).",
        ["node", "device", "state"],
        registry=CLUSTER,
    )
)
SHARES = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_shares",
        "Shares held of each of our shared devices (allocation results with a shareID).",
        ["node", "device"],
        registry=CLUSTER,
    )
)
CLAIMS = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_claims",
        "ResourceClaims by state: pending (not allocated), allocated (not reserved), reserved.",
        ["state"],
        registry=CLUSTER,
    )
)
POD_CLAIMS_ALLOCATED_SECONDS = CLUSTER_WIDE.serve(
    Histogram(
        "dra_gpu_pod_claims_allocated_seconds",
        "Time from a pod's creation until all its resource claims were allocated.",
        buckets=_POD_BUCKETS,
        registry=CLUSTER,
    )
)
POD_RUNNING_SECONDS = CLUSTER_WIDE.serve(
    Histogram(
        "dra_gpu_pod_running_seconds",
        "Time from the creation of a pod with resource claims until it was Ready (its Ready "
        "condition's lastTransitionTime).",
        buckets=_POD_BUCKETS,
        registry=CLUSTER,
    )
)
PENDING_CLAIM_AGE = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_pending_claim_age_seconds",
        "Age of the oldest pending (not allocated) ResourceClaim, from its creationTimestamp; 0 "
        "when none is pending.",
        registry=CLUSTER,
    )
)
EXPLAIN_EVENTS = Counter(
    "dra_gpu_explain_events_total",
    "Warning Events the controller posted to explain a pending claim, by reason.",
    ["reason"],
    registry=CONTROLLER,
)
PREPARE_FAILURES = CLUSTER_WIDE.serve(
    Counter(
        "dra_gpu_prepare_failures_total",
        "FailedPrepareDynamicResources events the kubelet posted on pods (each occurrence).",
        registry=CLUSTER,
    )
)
INCONSISTENT_POOLS = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_inconsistent_pools",
        "Pools of our driver whose slices disagree on generation or slice count.",
        registry=CLUSTER,
    )
)
STALE_SLICES_DELETED = Counter(
    "dra_gpu_stale_slices_deleted_total",
    "Our ResourceSlices deleted because their node no longer exists.",
    registry=CONTROLLER,
)
DEVICE_STATUS_REPAIRS = Counter(
    "dra_gpu_device_status_repairs_total",
    "status.devices entries of our driver removed because the device is no longer allocated.",
    registry=CONTROLLER,
)
NODES_DRIVER_GONE = CLUSTER_WIDE.serve(
    Gauge(
        "dra_gpu_nodes_driver_gone",
        "Nodes with a pool of our driver whose agent pod has been absent or not Ready for longer "
        "than the grace period (controller.driverGone.graceSeconds): their devices are tainted "
        "NoSchedule (a DeviceTaintRule), or, where the API server serves none, only reported.",
        registry=CLUSTER,
    )
)
TAINT_RULE_WRITES = Counter(
    "dra_gpu_taint_rule_writes_total",
    "DeviceTaintRules the leader wrote for nodes whose agent is gone, by change (create: a "
    "node's devices tainted; delete: its agent is back, or the node or its pool is gone).",
    ["change"],
    registry=CONTROLLER,
)
ADMISSION_RESULTS = ("allowed", "refused", "error")
ADMISSION_REQUESTS = Counter(
    "dra_gpu_admission_requests_total",
    "Admission reviews this replica answered, by kind (resourceclaims, resourceclaimtemplates, "
    "deviceclasses) and result: allowed, refused (a config prepare would refuse), error (the "
    "review failed; the API server applies the webhook's failurePolicy).",
    ["kind", "result"],
    registry=CONTROLLER,
)
ADMISSION_WARNINGS = Counter(
    "dra_gpu_admission_warnings_total",
    "Objects admitted with a warning that nothing can satisfy them now, by kind.",
    ["kind"],
    registry=CONTROLLER,
)
ADMISSION_UNEXPLAINED = Counter(
    "dra_gpu_admission_unexplained_total",
    "Objects admitted unexplained (no warning worked out) because working out their "
    "selectors on every device took longer than the budget, by kind.",
    ["kind"],
    registry=CONTROLLER,
)
ADMISSION_SECONDS = Histogram(
    "dra_gpu_admission_duration_seconds",
    "Time to answer one admission review, by kind (the handler's own time).",
    ["kind"],
    buckets=_LATENCY_BUCKETS,
    registry=CONTROLLER,
)
GC_PAUSES = Histogram(
    "dra_gpu_gc_pause_seconds",
    "Time the event loop stood still for each run of Python's cyclic garbage collector, by "
    "generation (2: a full collection; serving.collector keeps those short).",
    ["generation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=CONTROLLER,
)
LEADER = Gauge(
    "dra_gpu_controller_leader",
    "1 on the controller replica that holds the lease.",
    registry=CONTROLLER,
)
RECONCILES = Counter(
    "dra_gpu_controller_reconciles_total",
    "Passes of the controller over its view of the cluster.",
    registry=CONTROLLER,
)

for _state in ("pending", "allocated", "reserved"):
    CLAIMS.labels(_state)
for _kind in ("resourceclaims", "resourceclaimtemplates", "deviceclasses"):
    # Every replica's page has the admission series, webhook or not: zero until it reviews.
    ADMISSION_WARNINGS.labels(_kind)
    ADMISSION_UNEXPLAINED.labels(_kind)
    ADMISSION_SECONDS.labels(_kind)
    for _result in ADMISSION_RESULTS:
        ADMISSION_REQUESTS.labels(_kind, _result)
for _change in ("create", "delete"):
    TAINT_RULE_WRITES.labels(_change)

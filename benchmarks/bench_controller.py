"""The controller at GPU-cluster scale: the cost of a pass, and of one change, as the cluster grows.

Two ways, both printing numbers and ``BENCH <name> <value> <unit>`` lines; neither asserts.

``inprocess`` (the default): the real ``Controller`` (view, metrics, explanations, class and pool
checks, status repair), fed the synthetic watch events of a GPU cluster in its own process, with
a stub in place of the API server (Events and patches are counted, not sent). The cluster:
nodes with 8 GPUs each of a few products (one ResourceSlice per node, as the agent publishes),
DeviceClasses with selectors on driver, memory, product and compute capability, claims from
templates — allocated ones with their bound, running pods, and a queue of pending ones whose pods
wait — and many other pods that use no claim. Measured:

- filling the view (every object's ADDED event, as Kopf's initial listing delivers them) and
  the first pass: "metrics complete" when its metrics are set, "everything explained" when
  every pending claim's explanation is posted (making up the objects is not timed);
- a pass with nothing changed;
- a stream of changes, each followed by one pass: claims allocated and released, waiting pods
  created and deleted, other pods created and deleted, a slice republished, a class edited, a
  node going NotReady and back; the time from the event to updated metrics, to the end of the
  pass (every explanation it touched worked out), to its Events posted (the controller posts
  them from a task of its own), and to the new waiting pod's Event; and the Events each kind of
  change made the controller write (an explanation is posted again only when its meaning
  changes: an allocation should cost at most the allocated claim's own Event);
- a burst of claim changes (half allocated, half new waiting pods) absorbed by one pass;
- resident memory of the process.

Shapes: ``--shape small|medium|classes`` are the three rows of issue 12's table (measured
before the incremental controller), ``--shape full`` is its full size (5,000 nodes x 8 GPUs, 30
classes, 150,000 pods of which 30,000 use claims, 3,000 pending claims with waiting pods).

``apiserver``: the ``dra-gpu controller`` process against the real API server (the local
control plane): slices, classes, claims and pods created first, then the controller started.
Measured, in seconds after the process started: its start-up lists done (its log), the complete
view (its metrics show every device and claim), the first explanation posted and every waiting
claim explained (the Events' times; the waiting claims are those that can never fit), a waiting
pod made from a template while Kopf still lists the Pods -> its claim's Event, and Kopf having
handed over every Pod (its log: caught up); then how many claims explained during start-up were
posted again, and with another meaning (``resource.dra-gpu.io/explanation-meaning``). From then
on: claim change -> metric lag, new waiting pod -> Event, the Events written per allocation
while claims are allocated as the scheduler does (``status.allocation`` and ``reservedFor``
written, the pod bound), how long ``/metrics`` takes to answer meanwhile, resident memory, and
a SIGTERM: how long until the process exits, and its exit code. ``--api-qps`` sets the
controller's client rate limit (default: the chart's, 50/s). Default size 1,000 nodes x 8, 10
classes, 5,700 claims (1,700 pending, 1,020 of which never fit), 20,000 pods.

Without a mode (``make bench``): every in-process shape, then ``apiserver`` at ``MAKE_BENCH``'s
size (300 nodes x 8, 10 classes, 1,800 claims of which 300 pending, 11,800 pods: about two
minutes to create, a few to measure, on the 2-core machine).

Run: ``.venv/bin/python benchmarks/bench_controller.py [inprocess --shape full | apiserver]``
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import functools
import gc
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from stats import percentile

from dra_gpu import kube

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.example.com"
Body = dict[str, Any]

# --- the synthetic cluster ------------------------------------------------------------------------

PRODUCTS = (  # name, memory, compute capability, architecture
    ("NVIDIA H100 80GB HBM3", "80Gi", "9.0.0", "Hopper"),
    ("NVIDIA A100-SXM4-80GB", "80Gi", "8.0.0", "Ampere"),
    ("NVIDIA A100-SXM4-40GB", "40Gi", "8.0.0", "Ampere"),
    ("NVIDIA L40S", "48Gi", "8.9.0", "Ada Lovelace"),
    ("NVIDIA L4", "24Gi", "8.9.0", "Ada Lovelace"),
    ("NVIDIA T4", "16Gi", "7.5.0", "Turing"),
)
MEMORY_TIERS = ("16Gi", "24Gi", "40Gi", "48Gi", "80Gi")


@dataclasses.dataclass(frozen=True)
class Shape:
    nodes: int
    gpus: int
    classes: int
    claims: int
    """Claims in all: allocated ones (each with a bound pod) and ``pending`` ones."""
    pending: int
    """Pending claims, each with a waiting pod."""
    other_pods: int
    """Pods that use no claim."""
    leader: bool = True


SHAPES = {
    # issue 12's table, measured before the incremental controller
    "small": Shape(100, 8, 2, 500, 50, 1_000),
    "medium": Shape(1_000, 8, 2, 5_000, 100, 20_000),
    "classes": Shape(1_000, 8, 10, 5_000, 0, 20_000, leader=False),
    # issue 12's full size: 150,000 pods of which 30,000 use claims
    "full": Shape(5_000, 8, 30, 30_000, 3_000, 120_000),
}


def _stamp(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_750_000_000 + second))


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def node_body(i: int, *, ready: bool = True) -> Body:
    name = node_name(i)
    product = PRODUCTS[i % len(PRODUCTS)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-uid-{i}",
            "resourceVersion": str(i + 1),
            "creationTimestamp": _stamp(0),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
                "node.kubernetes.io/instance-type": "gpu-8x",
                "gpu.example.com/product": product[0].replace(" ", "-"),
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": f"10.{i // 256}.{i % 256}.0/24",
            "taints": [{"key": "gpu.example.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "96", "memory": "1056Gi", "pods": "110"},
            "allocatable": {"cpu": "95", "memory": "1050Gi", "pods": "110"},
            "conditions": [
                {"type": t, "status": "False", "reason": f"Kubelet{t}"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ]
            + [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2"},
        },
    }


def slice_body(i: int, gpus: int, generation: int = 1) -> Body:
    node = node_name(i)
    product, memory, compute, architecture = PRODUCTS[i % len(PRODUCTS)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{DRIVER}-x7k2p",
            "uid": f"slice-uid-{i}",
            "resourceVersion": str(generation),
            "labels": {"app.kubernetes.io/managed-by": "dra-gpu"},
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{d}",
                    "attributes": {
                        "index": {"int": d},
                        "uuid": {"string": f"GPU-{i:08x}-{d:04x}-0000-0000-000000000000"},
                        "productName": {"string": product},
                        "brand": {"string": "Nvidia"},
                        "architecture": {"string": architecture},
                        "cudaComputeCapability": {"version": compute},
                        "driverVersion": {"version": "550.54.15"},
                        "migCapable": {"bool": False},
                        "resource.kubernetes.io/pciBusID": {"string": f"0000:{d + 16:02x}:00.0"},
                    },
                    "capacity": {"memory": {"value": memory}},
                }
                for d in range(gpus)
            ],
        },
    }


def class_selectors(k: int) -> list[str]:
    """Class ``k``'s selectors: the driver, then one of product, memory, compute capability,
    architecture, or a pair of them."""
    driver = f'device.driver == "{DRIVER}"'
    product = PRODUCTS[k % len(PRODUCTS)]
    tier = MEMORY_TIERS[k % len(MEMORY_TIERS)]
    kind = k % 5
    if kind == 0:
        rest = f'device.attributes["{DRIVER}"].productName == "{product[0]}"'
    elif kind == 1:
        rest = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{tier}")) >= 0'
    elif kind == 2:
        rest = f'device.attributes["{DRIVER}"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))'
    elif kind == 3:
        rest = f'device.attributes["{DRIVER}"].architecture == "{product[3]}"'
    else:
        rest = (
            f'device.attributes["{DRIVER}"].brand == "Nvidia" && '
            f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{tier}")) >= 0'
        )
    return [driver, rest]


def class_body(k: int, selectors: list[str] | None = None) -> Body:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"gpu-class-{k:02d}", "uid": f"class-uid-{k}"},
        "spec": {
            "selectors": [{"cel": {"expression": e}} for e in selectors or class_selectors(k)]
        },
    }


def claim_name(j: int) -> str:
    return f"job-{j:06d}-gpu-q8r4t"


def pod_name(j: int) -> str:
    return f"job-{j:06d}"


def claim_body(j: int, classes: int, allocation: tuple[str, int] | None = None) -> Body:
    """The claim a template generates for job ``j``; ``allocation``: (node, gpu).

    Pending ones mostly cannot be allocated: half ask for a whole node (8 GPUs), a tenth for
    more memory than any GPU has; the rest fit somewhere (the scheduler's move)."""
    request: Body = {"deviceClassName": f"gpu-class-{j % classes:02d}", "count": 1}
    if allocation is None and j % 2 == 0:
        request["count"] = 8
    if allocation is None and j % 10 == 1:
        request["selectors"] = [
            {
                "cel": {
                    "expression": f'device.capacity["{DRIVER}"].memory'
                    '.compareTo(quantity("160Gi")) >= 0'
                }
            }
        ]
    elif j % 4 == 0:
        request["selectors"] = [
            {
                "cel": {
                    "expression": f'device.capacity["{DRIVER}"].memory'
                    '\n  .compareTo(quantity("24Gi")) >= 0'
                }
            }
        ]
    body: Body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(j),
            "namespace": f"team-{j % 10}",
            "uid": f"claim-uid-{j}",
            "resourceVersion": "1",
            "creationTimestamp": _stamp(j),
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod_name(j), "uid": f"pod-uid-{j}"}
            ],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        "status": {},
    }
    if allocation is not None:
        allocate(body, j, *allocation)
    return body


def allocate(claim: Body, j: int, node: str, gpu: int) -> None:
    claim["metadata"]["resourceVersion"] = str(int(claim["metadata"]["resourceVersion"]) + 1)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{gpu}"}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": pod_name(j), "uid": f"pod-uid-{j}"}],
    }


def _container(name: str) -> Body:
    return {
        "name": name,
        "image": f"registry.example.com/ml/{name}:2025.06.1",
        "command": ["python", "-m", f"{name}.serve"],
        "env": [
            {"name": "MODEL", "value": "llama-3-8b"},
            {"name": "BATCH", "value": "16"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "resources": {"requests": {"cpu": "4", "memory": "32Gi"}},
        "volumeMounts": [
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io",
                "readOnly": True,
            }
        ],
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
    }


def pod_body(j: int, *, claim: bool, node: str | None, namespace: str | None = None) -> Body:
    """Job ``j``'s pod (``claim``: it uses its template claim) or another pod."""
    spec: Body = {
        "containers": [_container("worker" if claim else "web")],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        ],
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
            }
        ],
    }
    status: Body = {"phase": "Running" if node else "Pending", "qosClass": "Burstable"}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-tmpl"}]
        spec["tolerations"].append({"key": "gpu.example.com/gpu", "operator": "Exists"})
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name(j)}]
    if node:
        spec["nodeName"] = node
        status["conditions"] = [
            {"type": t, "status": "True", "lastTransitionTime": _stamp(j)}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        status["podIP"] = f"10.{j % 256}.{j // 256 % 256}.7"
        status["containerStatuses"] = [
            {
                "name": spec["containers"][0]["name"],
                "ready": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": _stamp(j + 5)}},
            }
        ]
    else:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5000 nodes are available: cannot allocate all claims.",
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(j) if claim else f"web-{j:07d}",
            "namespace": namespace or f"team-{j % 10}",
            "uid": f"pod-uid-{j}" if claim else f"other-pod-uid-{j}",
            "resourceVersion": "1",
            "creationTimestamp": _stamp(j),
            "labels": {"app": "worker" if claim else "web", "job": str(j)},
        },
        "spec": spec,
        "status": status,
    }


class Cluster:
    """The synthetic cluster and the watch events that build it and change it."""

    def __init__(self, shape: Shape, seed: int = 12) -> None:
        self.shape = shape
        self.random = random.Random(seed)
        self.devices = shape.nodes * shape.gpus
        allocated = shape.claims - shape.pending
        if allocated > self.devices:
            raise SystemExit(f"{allocated} allocated claims do not fit {self.devices} devices")
        # Device d of the cluster is gpu (d % gpus) of node (d // gpus); claims take every
        # other device first, so free and taken devices mix on every node.
        order = list(range(0, self.devices, 2)) + list(range(1, self.devices, 2))
        self.taken: dict[int, int] = {}  # job -> device
        for j in range(allocated):
            self.taken[j] = order[j]
        self.free = order[allocated:]
        self.random.shuffle(self.free)
        self.jobs = shape.claims
        self.claims: dict[int, Body] = {}
        self.slice_generation: dict[int, int] = {}
        self.class_edits = 0

    def where(self, device: int) -> tuple[str, int]:
        return node_name(device // self.shape.gpus), device % self.shape.gpus

    def initial(self) -> Iterator[tuple[str, str, Body]]:
        s = self.shape
        for k in range(s.classes):
            yield "DeviceClass", "ADDED", class_body(k)
        for i in range(s.nodes):
            yield "Node", "ADDED", node_body(i)
            yield "ResourceSlice", "ADDED", slice_body(i, s.gpus)
        for j in range(s.claims):
            device = self.taken.get(j)
            where = self.where(device) if device is not None else None
            claim = claim_body(j, s.classes, where)
            self.claims[j] = claim
            yield "ResourceClaim", "ADDED", copy.deepcopy(claim)
            yield "Pod", "ADDED", pod_body(j, claim=True, node=where[0] if where else None)
        for j in range(s.other_pods):
            yield "Pod", "ADDED", pod_body(j, claim=False, node=node_name(j % s.nodes))

    # Changes: each a list of watch events that belong together.

    def allocate_one(self) -> list[tuple[str, str, Body]]:
        pending = [j for j, c in self.claims.items() if not c["status"].get("allocation")]
        if not pending or not self.free:
            return self.new_waiting_pod()
        j = self.random.choice(pending)
        device = self.free.pop()
        self.taken[j] = device
        node, gpu = self.where(device)
        allocate(self.claims[j], j, node, gpu)
        return [
            ("ResourceClaim", "MODIFIED", copy.deepcopy(self.claims[j])),
            ("Pod", "MODIFIED", pod_body(j, claim=True, node=node)),
        ]

    def release_one(self) -> list[tuple[str, str, Body]]:
        allocated = [j for j in self.claims if j in self.taken]
        j = self.random.choice(allocated)
        self.free.append(self.taken.pop(j))
        node = self.claims[j]["status"]["allocation"]["devices"]["results"][0]["pool"]
        claim = self.claims.pop(j)
        return [
            ("Pod", "DELETED", pod_body(j, claim=True, node=node)),
            ("ResourceClaim", "DELETED", claim),
        ]

    def new_waiting_pod(self) -> list[tuple[str, str, Body]]:
        j = self.jobs
        self.jobs += 1
        self.claims[j] = claim_body(j, self.shape.classes)
        return [
            ("ResourceClaim", "ADDED", copy.deepcopy(self.claims[j])),
            ("Pod", "ADDED", pod_body(j, claim=True, node=None)),
        ]

    def delete_waiting_pod(self) -> list[tuple[str, str, Body]]:
        pending = [j for j, c in self.claims.items() if not c["status"].get("allocation")]
        if not pending:
            return self.new_waiting_pod()
        j = self.random.choice(pending)
        claim = self.claims.pop(j)
        return [
            ("Pod", "DELETED", pod_body(j, claim=True, node=None)),
            ("ResourceClaim", "DELETED", claim),
        ]

    def other_pod(self) -> list[tuple[str, str, Body]]:
        j = self.random.randrange(self.shape.other_pods or 1)
        kind = "ADDED" if self.random.random() < 0.5 else "DELETED"
        return [("Pod", kind, pod_body(j, claim=False, node=node_name(j % self.shape.nodes)))]

    def republish_slice(self) -> list[tuple[str, str, Body]]:
        i = self.random.randrange(self.shape.nodes)
        generation = self.slice_generation.get(i, 1) + 1
        self.slice_generation[i] = generation
        return [("ResourceSlice", "MODIFIED", slice_body(i, self.shape.gpus, generation))]

    def edit_class(self) -> list[tuple[str, str, Body]]:
        k = self.random.randrange(self.shape.classes)
        self.class_edits += 1
        selectors = class_selectors(k)
        tier = MEMORY_TIERS[self.class_edits % len(MEMORY_TIERS)]
        selectors.append(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{tier}")) >= 0')
        return [("DeviceClass", "MODIFIED", class_body(k, selectors))]

    def node_flaps(self) -> list[tuple[str, str, Body]]:
        i = self.random.randrange(self.shape.nodes)
        return [("Node", "MODIFIED", node_body(i, ready=False)), ("Node", "MODIFIED", node_body(i))]

    def changes(self) -> list[tuple[str, Callable[[], list[tuple[str, str, Body]]]]]:
        return [
            ("claim_allocated", self.allocate_one),
            ("claim_released", self.release_one),
            ("waiting_pod_created", self.new_waiting_pod),
            ("waiting_pod_deleted", self.delete_waiting_pod),
            ("other_pod", self.other_pod),
            ("claim_allocated", self.allocate_one),
            ("waiting_pod_created", self.new_waiting_pod),
            ("other_pod", self.other_pod),
            ("slice_republished", self.republish_slice),
            ("class_edited", self.edit_class),
            ("node_flapped", self.node_flaps),
        ]


# --- in-process ---------------------------------------------------------------------------------


class StubApi:
    """Stands in for the API server: answers every read with nothing, counts every write."""

    def __init__(self) -> None:
        self.writes: dict[str, int] = {}
        self.posted: dict[str, float] = {}
        """Name of an Event's object -> when the last Event about it was posted."""

    def _count(self, verb: str, path: str) -> None:
        kind = path.rstrip("/").split("/")[-1] if verb == "create" else verb
        self.writes[kind] = self.writes.get(kind, 0) + 1

    async def get(self, path: str, **query: Any) -> Body:
        return {"items": [], "metadata": {}}

    async def create(self, path: str, body: Body, **query: Any) -> Body:
        self._count("create", path)
        regarding = body.get("regarding") or body.get("involvedObject")
        if regarding:
            self.posted[regarding["name"]] = time.perf_counter()
        return body

    async def replace(self, path: str, body: Body) -> Body:
        self._count("replace", path)
        return body

    async def patch(self, path: str, body: Body, **query: Any) -> Body:
        self._count("patch", path)
        return body

    async def delete(self, path: str, **query: Any) -> Body:
        self._count("delete", path)
        return {}


def rss_mib(pid: int | str = "self") -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match[1]) / 1024 if match else float("nan")


async def run_inprocess(name: str, shape: Shape, changes: int, burst: int) -> None:
    from dra_gpu.config import ControllerSettings
    from dra_gpu.controller.main import Controller

    print(
        f"in-process controller, shape {name}: {shape.nodes} nodes x {shape.gpus} GPUs, "
        f"{shape.classes} classes, {shape.claims} claims ({shape.pending} pending with waiting "
        f"pods), {shape.claims + shape.other_pods} pods, "
        f"{'leader' if shape.leader else 'standby (metrics only)'}"
    )
    gc.collect()
    base = rss_mib()
    cluster = Cluster(shape)
    api = StubApi()
    controller = Controller(ControllerSettings(identity="bench"), api)  # type: ignore[arg-type]
    controller.leader.is_leader = shape.leader
    metrics_done = _watch_metrics(controller)

    async def post() -> None:
        """Post what the pass queued (the controller's own task does this as it comes)."""
        if hasattr(controller, "explainer"):
            await controller.explainer.post_due()

    def feed(events: list[tuple[str, str, Body]]) -> None:
        for kind, event_type, body in events:
            controller.view.apply(kind, event_type, body)

    # Only the controller's own work counts: making up the objects is not timed.
    count, filled = 0, 0.0
    for kind, event_type, body in cluster.initial():
        t = time.perf_counter()
        controller.view.apply(kind, event_type, body)
        filled += time.perf_counter() - t
        count += 1
    t = time.perf_counter()
    await controller.reconcile_once()
    await post()
    first = time.perf_counter() - t
    complete = filled + first
    metrics_complete = filled + metrics_done[-1] - t
    explained = api.writes.get("events", 0)
    t = time.perf_counter()
    await controller.reconcile_once()
    await post()
    idle = time.perf_counter() - t
    memory = rss_mib()

    passes: dict[str, list[float]] = {}
    metric_lags: list[float] = []
    posts: list[float] = []
    event_lags: list[float] = []
    event_writes: dict[str, list[int]] = {}  # kind of change -> Events written, per change
    menu = cluster.changes()
    for n in range(changes):
        what, make = menu[n % len(menu)]
        events = make()
        written = api.writes.get("events", 0)
        t = time.perf_counter()
        feed(events)
        await controller.reconcile_once()
        passes.setdefault(what, []).append(time.perf_counter() - t)
        await post()
        posts.append(time.perf_counter() - t)
        event_writes.setdefault(what, []).append(api.writes.get("events", 0) - written)
        metric_lags.append(metrics_done[-1] - t)
        if what == "waiting_pod_created":
            posted = api.posted.get(events[0][2]["metadata"]["name"])
            if posted is not None and posted >= t:
                event_lags.append(posted - t)
    every = [x for values in passes.values() for x in values]

    burst_time = float("nan")
    if burst:
        events = []
        for n in range(burst):
            events += cluster.allocate_one() if n % 2 else cluster.new_waiting_pod()
        t = time.perf_counter()
        feed(events)
        await controller.reconcile_once()
        await post()
        burst_time = time.perf_counter() - t
    memory = max(memory, rss_mib())

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:8.1f} ms" if values else "       - ms"

    print(f"  {count} watch events applied          {filled:8.2f} s")
    print(f"  first pass                          {first:8.2f} s  ({explained} Events posted)")
    print(f"  metrics complete after start        {metrics_complete:8.2f} s  (goal <= 30 s)")
    print(f"  everything explained after start    {complete:8.2f} s")
    print(f"  pass with nothing changed           {idle * 1000:8.1f} ms")
    for what, values in passes.items():
        print(
            f"  change -> pass done, {what:<20} p50 {ms(values, 50)}  max {ms(values, 100)}"
            f"  ({len(values)})"
        )
    if every:
        print(f"  change -> pass done, all             p50 {ms(every, 50)}  p99 {ms(every, 99)}")
        print(f"  change -> its Events posted          p50 {ms(posts, 50)}  p99 {ms(posts, 99)}")
        print(
            f"  change -> metrics updated            p50 {ms(metric_lags, 50)}  p99 "
            f"{ms(metric_lags, 99)}  (goal p99 <= 1 s)"
        )
    if event_lags:
        print(
            f"  new waiting pod -> its Event         p50 {ms(event_lags, 50)}  p99 "
            f"{ms(event_lags, 99)}  (goal p99 <= 2 s)"
        )
    for what, counts in event_writes.items():
        print(
            f"  Events written per change, {what:<20} {sum(counts) / len(counts):8.2f}"
            f"  max {max(counts)}  ({len(counts)})"
        )
    if burst:
        print(f"  burst of {burst} claim changes, one pass {burst_time:8.2f} s  (goal <= 5 s)")
    print(f"  resident memory                     {memory:8.1f} MiB ({memory - base:.1f} MiB view)")
    print(f"BENCH controller_{name}_fill {filled:.3f} s")
    print(f"BENCH controller_{name}_first_pass {first:.3f} s")
    print(f"BENCH controller_{name}_metrics_complete {metrics_complete:.3f} s")
    print(f"BENCH controller_{name}_complete_view {complete:.3f} s")
    print(f"BENCH controller_{name}_idle_pass {idle * 1000:.1f} ms")
    if every:
        print(f"BENCH controller_{name}_change_p50 {percentile(every, 50) * 1000:.1f} ms")
        print(f"BENCH controller_{name}_change_p99 {percentile(every, 99) * 1000:.1f} ms")
        print(f"BENCH controller_{name}_posted_p99 {percentile(posts, 99) * 1000:.1f} ms")
        print(f"BENCH controller_{name}_metric_lag_p99 {percentile(metric_lags, 99) * 1000:.1f} ms")
        for what, values in passes.items():
            print(f"BENCH controller_{name}_{what}_max {max(values) * 1000:.1f} ms")
    if event_lags:
        print(
            f"BENCH controller_{name}_new_pod_event_p99 {percentile(event_lags, 99) * 1000:.1f} ms"
        )
    allocations = event_writes.get("claim_allocated")
    if allocations:  # goal: <= 1, the allocated claim's own
        per_allocation = sum(allocations) / len(allocations)
        print(f"BENCH controller_{name}_event_writes_per_allocation {per_allocation:.2f} events")
    if burst:
        print(f"BENCH controller_{name}_burst_{burst} {burst_time:.3f} s")
    print(f"BENCH controller_{name}_rss {memory:.1f} MiB")


def _watch_metrics(controller: Any) -> list[float]:
    """When the controller last finished updating its metrics (the incremental one's
    ``Tally.update``, or the full recompute of the controller before it)."""
    done: list[float] = [time.perf_counter()]
    owner, attribute = (
        (controller.tally, "update")
        if hasattr(controller, "tally")
        else (controller, "_update_metrics")
    )
    update = getattr(owner, attribute)

    def timed(*args: Any, **kwargs: Any) -> Any:
        result = update(*args, **kwargs)
        done.append(time.perf_counter())
        return result

    setattr(owner, attribute, timed)
    return done


# --- against the real API server ------------------------------------------------------------------


def series(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )


def _api_body(body: Body) -> Body:
    """An object as a client creates it: no uid, resourceVersion or status."""
    out = copy.deepcopy(body)
    meta = out["metadata"]
    for field in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences"):
        meta.pop(field, None)
    out.pop("status", None)
    return out


def _api_pod(body: Body) -> Body:
    """A pod as a client creates it; one that uses a claim names it (it exists already)."""
    pod = _api_body(body)
    pod["spec"]["volumes"] = []
    pod["spec"]["containers"][0]["volumeMounts"] = []
    if pod["spec"].get("resourceClaims"):
        claim = body["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


async def new_waiting_pod(api: kube.Kube, shape: Shape, j: int) -> Coroutine[Any, Any, float]:
    """Job ``j``'s claim (one no node can satisfy) and then its waiting pod, created; returns
    what waits for the claim's Event and says how long after the pod it came."""
    claim, pod = claim_body(j, shape.classes), pod_body(j, claim=True, node=None)
    namespace = claim["metadata"]["namespace"]
    await api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", _api_body(claim))
    t = time.perf_counter()
    await api.create(f"/api/v1/namespaces/{namespace}/pods", _api_pod(pod))

    return _explained_after(api, namespace, claim, t, 300, "the new waiting pod's claim")


async def _explained_after(
    api: kube.Kube, namespace: str, claim: Body, t: float, within: float, what: str
) -> float:
    """Seconds from ``t`` (``perf_counter``) until ``claim`` has an Event of the controller."""
    from dra_gpu.testing import eventually

    await eventually(
        functools.partial(explained, api, namespace, claim["metadata"]["name"]),
        timeout=within,
        interval=0.05,
        what=f"{what} explained",
    )
    return time.perf_counter() - t


async def all_explained(api: kube.Kube, claims: set[str]) -> bool:
    """Whether every claim of ``claims`` (names) has an Event of the controller."""
    from dra_gpu.controller.posting import COMPONENT

    listing = await api.get(
        "/api/v1/events",
        fieldSelector=f"reportingComponent={COMPONENT},involvedObject.kind=ResourceClaim",
    )
    return claims <= {e["involvedObject"]["name"] for e in listing.get("items", [])}


async def explained(api: kube.Kube, namespace: str, claim: str) -> bool:
    from dra_gpu.controller.posting import COMPONENT

    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={claim}"
    )
    return any(e.get("reportingComponent") == COMPONENT for e in listing.get("items", []))


async def populate(api: kube.Kube, cluster: Cluster) -> None:
    sem = asyncio.Semaphore(16)
    namespaces = {f"team-{n}" for n in range(10)}
    for namespace in sorted(namespaces):
        await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})

    async def create(kind: str, body: Body) -> None:
        meta = body["metadata"]
        async with sem:
            if kind == "DeviceClass":
                await api.create(f"{RESOURCE}/deviceclasses", _api_body(body))
            elif kind == "ResourceSlice":
                await api.create(f"{RESOURCE}/resourceslices", _api_body(body))
            elif kind == "Node":
                await api.create("/api/v1/nodes", _api_body(body))
                status = {"status": body["status"]}
                await api.patch(f"/api/v1/nodes/{meta['name']}/status", status)
            elif kind == "ResourceClaim":
                path = f"{RESOURCE}/namespaces/{meta['namespace']}/resourceclaims"
                created = await api.create(path, _api_body(body))
                if body["status"].get("allocation"):
                    created["status"] = body["status"]
                    await api.replace(f"{path}/{meta['name']}/status", created)
            elif kind == "Pod":
                pod = _api_pod(body)
                await api.create(f"/api/v1/namespaces/{meta['namespace']}/pods", pod)

    events = list(cluster.initial())
    for kinds in (("DeviceClass", "Node", "ResourceSlice"), ("ResourceClaim",), ("Pod",)):
        await asyncio.gather(*(create(k, b) for k, _, b in events if k in kinds))


async def heartbeat_forever(api: kube.Kube, nodes: list[str]) -> None:
    """Renew each node's Lease in kube-node-lease every 10 s, as its kubelet would: no kubelet
    runs here, and without it the node lifecycle controller would mark every node and pod
    NotReady — a storm of updates a healthy cluster does not see."""
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    sem = asyncio.Semaphore(8)

    async def renew(node: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}
        async with sem:
            try:
                await api.patch(f"{leases}/{node}", {"spec": spec})
            except kube.ApiError as exc:
                if not exc.not_found:
                    raise
                await api.create(leases, {"metadata": {"name": node}, "spec": spec})

    while True:
        started = time.monotonic()
        await asyncio.gather(*(renew(n) for n in nodes), return_exceptions=True)
        await asyncio.sleep(max(0.0, 10 - (time.monotonic() - started)))


async def template_waiting_pod(api: kube.Kube, shape: Shape, j: int) -> Coroutine[Any, Any, float]:
    """Job ``j``'s waiting pod as a Deployment's would be, its claim made from a template: the
    pod first (naming the template), then the claim the resourceclaim controller would make
    (owned by the pod, named after it), then the pod's status naming the claim. Returns what
    waits for the claim's Event and says how long after the pod it came."""
    claim, pod = claim_body(j, shape.classes), pod_body(j, claim=True, node=None)
    namespace = claim["metadata"]["namespace"]
    body = _api_body(pod)
    body["spec"]["volumes"] = []
    body["spec"]["containers"][0]["volumeMounts"] = []
    t = time.perf_counter()
    created = await api.create(f"/api/v1/namespaces/{namespace}/pods", body)
    owned = _api_body(claim)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": created["metadata"]["name"],
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    await api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", owned)
    status = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name(j)}]}
    await api.patch(
        f"/api/v1/namespaces/{namespace}/pods/{created['metadata']['name']}/status",
        {"status": status},
    )

    return _explained_after(api, namespace, claim, t, 600, "the waiting pod's template claim")


async def our_events(api: kube.Kube) -> list[Body]:
    """Every Event of the controller (core/v1 shape), every page."""
    from dra_gpu.controller.posting import COMPONENT

    found: list[Body] = []
    async for page in api.pages("/api/v1/events", fieldSelector=f"reportingComponent={COMPONENT}"):
        found += page.get("items") or []
    return found


def event_time(event: Body) -> float:
    """An Event's ``eventTime`` (or ``lastTimestamp``) as seconds since the epoch."""
    import datetime

    text = event.get("eventTime") or event.get("lastTimestamp") or ""
    for form in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            parsed = datetime.datetime.strptime(text, form)
        except ValueError:
            continue
        return parsed.replace(tzinfo=datetime.UTC).timestamp()
    return float("nan")


@dataclasses.dataclass
class Churn:
    """What the controller's Events on claims say about its start-up."""

    explained: int
    """Claims with an explanation."""
    posted_again: int
    """Of those, claims with more than one Event of it."""
    meaning_changed: int
    """Of those, claims whose later Event meant something else (its annotation)."""
    first: float
    """Seconds from ``since`` to the first explanation."""
    last_first: dict[str, float]
    """Claim name -> seconds from ``since`` to its first explanation."""


def churn(events: list[Body], since: float) -> Churn:
    from dra_gpu.controller import meanings

    by_claim: dict[str, list[Body]] = {}
    for event in events:
        regarding = event.get("involvedObject") or {}
        if regarding.get("kind") == "ResourceClaim":
            by_claim.setdefault(regarding.get("uid", ""), []).append(event)
    again = changed = 0
    firsts: dict[str, float] = {}
    for said in by_claim.values():
        said.sort(key=event_time)
        firsts[said[0]["involvedObject"]["name"]] = event_time(said[0]) - since
        if len(said) > 1:
            again += 1
            digests = {
                ((e.get("metadata") or {}).get("annotations") or {}).get(meanings.ANNOTATION)
                for e in said
            }
            changed += len(digests) > 1
    first = min(firsts.values(), default=float("nan"))
    return Churn(len(by_claim), again, changed, first, firsts)


class LogWatch:
    """When lines matching patterns first appeared in a process's log (polled every 50 ms)."""

    def __init__(self, path: Path, patterns: dict[str, str]) -> None:
        self.path, self.patterns = path, {k: re.compile(v) for k, v in patterns.items()}
        self.seen: dict[str, float] = {}
        self.lines: dict[str, str] = {}
        self._offset = 0

    async def run_forever(self) -> None:
        while True:
            if self.path.exists():
                with self.path.open("rb") as log:
                    log.seek(self._offset)
                    text = log.read()
                cut = text.rfind(b"\n") + 1
                self._offset += cut
                for line in text[:cut].decode(errors="replace").splitlines():
                    for name, pattern in self.patterns.items():
                        if name not in self.seen and pattern.search(line):
                            self.seen[name] = time.perf_counter()
                            self.lines[name] = line
            await asyncio.sleep(0.05)

    async def wait(self, name: str, within: float) -> float:
        from dra_gpu.testing import eventually

        await eventually(lambda: name in self.seen, timeout=within, interval=0.05, what=name)
        return self.seen[name]


def admits(k: int, node: int) -> bool:
    """Whether class ``k`` (``class_selectors``) admits the GPUs of node ``node``."""
    product, memory, compute, architecture = PRODUCTS[node % len(PRODUCTS)]
    gib = int(memory.removesuffix("Gi"))
    tier = int(MEMORY_TIERS[k % len(MEMORY_TIERS)].removesuffix("Gi"))
    kind = k % 5
    if kind == 0:
        return product == PRODUCTS[k % len(PRODUCTS)][0]
    if kind in (1, 4):
        return gib >= tier
    if kind == 2:
        return tuple(map(int, compute.split("."))) > (8, 0, 0)
    return architecture == PRODUCTS[k % len(PRODUCTS)][3]


async def allocate_as_scheduler(api: kube.Kube, cluster: Cluster, j: int) -> bool:
    """Job ``j``'s claim (one GPU, no selector of its own) and its waiting pod, created for a
    scheduler of the benchmark's own (``schedulerName``: kube-scheduler leaves the pod alone),
    which then does what kube-scheduler does: allocates the claim a free device its class
    admits, reserves it for the pod, and binds the pod to the device's node. False when no such
    device is free."""
    k = j % cluster.shape.classes
    found = next((d for d in cluster.free if admits(k, d // cluster.shape.gpus)), None)
    if found is None:
        return False
    cluster.free.remove(found)
    node, gpu = cluster.where(found)
    claim = claim_body(j, cluster.shape.classes)
    namespace, name = claim["metadata"]["namespace"], claim_name(j)
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    created = await api.create(path, _api_body(claim))
    pod = _api_pod(pod_body(j, claim=True, node=None))
    pod["spec"]["schedulerName"] = "dra-gpu-bench"
    pod["spec"]["containers"][0].pop("resources", None)  # the other pods took the CPUs
    waiting = await api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    await asyncio.sleep(0.5)  # waiting, as a pod in a scheduler's queue
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{gpu}"}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [
            {"resource": "pods", "name": pod_name(j), "uid": waiting["metadata"]["uid"]}
        ],
    }
    await api.replace(f"{path}/{name}/status", created)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod_name(j), "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await api.create(f"/api/v1/namespaces/{namespace}/pods/{pod_name(j)}/binding", binding)
    return True


async def run_apiserver(
    shape: Shape,
    changes: int,
    allocations: int,
    keep_log: Path | None,
    api_qps: float | None,
) -> None:
    from dra_gpu.testing import ControllerProcess, ControlPlane, eventually

    cluster = Cluster(shape)
    env = {} if api_qps is None else {"DRA_GPU_API_QPS": f"{api_qps:g}"}
    if api_qps:
        env["DRA_GPU_API_BURST"] = str(max(100, int(2 * api_qps)))
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp, ControlPlane() as cp:
        async with await kube.Kube.connect(cp.kubeconfig) as api:
            nodes = [node_name(i) for i in range(shape.nodes)]
            heartbeats = asyncio.create_task(heartbeat_forever(api, nodes), name="heartbeats")
            t0 = time.perf_counter()
            await populate(api, cluster)
            populated = time.perf_counter() - t0
            print(f"populated in {populated:.1f}s")
            controller = ControllerProcess(
                "bench", cp.kubeconfig, Path(tmp), resync_seconds=30, env=env
            )
            answers: list[float] = []  # how long each full /metrics read took
            watch_log = LogWatch(
                controller.log_file,
                {
                    "lists": r"start-up lists done in",
                    "kopf_pods": KOPF_CAUGHT_UP,
                },
            )

            def scrape(*names: str) -> str:
                """The probes read the metrics they look at only (``name[]``): a full scrape
                of a cluster this size costs the controller tens of milliseconds, and a probe
                every 10 ms would measure its own load."""
                try:
                    return controller.metrics(*names)
                except OSError:  # not listening yet, or no answer within 5 s
                    return ""

            async def prometheus_forever() -> None:
                """A full scrape every second (a Prometheus at a short interval): how long the
                controller takes to answer it while it works."""
                while True:
                    t = time.perf_counter()
                    if await asyncio.to_thread(scrape):
                        answers.append(time.perf_counter() - t)
                    await asyncio.sleep(1.0)

            # Claims that fit are allocated by the scheduler during populate and get no
            # Event: those that never fit (a whole node of 8, or more memory than any GPU
            # has) are the claims that wait, each explained at start.
            never_fit = {
                c["metadata"]["name"]
                for j, c in cluster.claims.items()
                if (j % 2 == 0 or j % 10 == 1) and not c["status"].get("allocation")
            }
            started_wall = time.time()
            started = time.perf_counter()
            controller.spawn()
            prometheus = asyncio.create_task(prometheus_forever(), name="prometheus")
            logs = asyncio.create_task(watch_log.run_forever(), name="log")
            devices = shape.nodes * shape.gpus
            try:
                while True:
                    text = scrape("dra_gpu_devices", "dra_gpu_claims")
                    published = sum(
                        float(v)
                        for v in re.findall(
                            r'dra_gpu_devices\{node="[^"]+",state="published"\} (\S+)', text
                        )
                    )
                    if published == devices and series(text, "dra_gpu_claims") == shape.claims:
                        break
                    await asyncio.sleep(0.05)
                complete = time.perf_counter() - started
                lists = await watch_log.wait("lists", 600) - started
                # One waiting pod now, its claim from a template, while Kopf still hands the
                # controller its initial listings (every Pod of the cluster).
                first = await template_waiting_pod(api, shape, 30_000_000)
                first_lag = await first
                # Each look lists ~2,000 Events; the figure comes from the Events' own times,
                # so looking seldom loses nothing and leaves the 2 cores to the controller.
                await eventually(
                    lambda: all_explained(api, never_fit),
                    timeout=600,
                    interval=2.0,
                    what="the pending claims that never fit explained",
                )
                all_seen = time.perf_counter() - started
                kopf_pods = await watch_log.wait("kopf_pods", KOPF_CAUGHT_UP_WITHIN) - started
                await asyncio.sleep(10)  # the passes after Kopf's last listed objects
                start_up = churn(await our_events(api), started_wall)
                explained_all = max(
                    (start_up.last_first.get(n, float("nan")) for n in never_fit),
                    default=float("nan"),
                )
                lags = []

                def counted_beyond(before: float) -> bool:
                    return series(scrape("dra_gpu_claims"), "dra_gpu_claims") > before

                for i in range(changes):
                    before = series(scrape("dra_gpu_claims"), "dra_gpu_claims")
                    t = time.perf_counter()
                    await api.create(
                        f"{RESOURCE}/namespaces/team-0/resourceclaims",
                        _api_body(claim_body(10_000_000 + 10 * i, shape.classes)),
                    )
                    await eventually(
                        functools.partial(counted_beyond, before),
                        timeout=120,
                        interval=0.01,
                        what="the new claim counted",
                    )
                    lags.append(time.perf_counter() - t)
                explain_lags = [
                    await (await new_waiting_pod(api, shape, 20_000_000 + 10 * i))
                    for i in range(changes)
                ]
                # Allocations at steady state, written as the scheduler writes them: a claim
                # that fits and its waiting pod, then status.allocation (a free device its class
                # admits) and reservedFor, and the pod bound (``allocate_as_scheduler``).
                # Counted: the Events the controller wrote meanwhile (each allocation moves the
                # counts in every other waiting claim's message, not its meaning).
                await asyncio.sleep(5)
                taken = set()  # what kube-scheduler allocated meanwhile is not free
                async for page in api.pages(f"{RESOURCE}/resourceclaims"):
                    for item in page.get("items") or []:
                        for result in (
                            ((item.get("status") or {}).get("allocation") or {}).get("devices")
                            or {}
                        ).get("results") or []:
                            taken.add((result["pool"], int(result["device"].split("-")[-1])))
                cluster.free = [d for d in cluster.free if cluster.where(d) not in taken]
                events_before = len(await our_events(api))
                allocated = 0
                for i in range(allocations):
                    j = 40_000_000 + 10 * i + 3  # one GPU, no selector of its own: fits
                    if await allocate_as_scheduler(api, cluster, j):
                        allocated += 1
                await asyncio.sleep(10)  # the passes and posts those allocations caused
                allocation_events = len(await our_events(api)) - events_before
                memory = rss_mib(controller.pid or 0)
                t = time.perf_counter()
                exit_code = controller.stop(30)
                stopped = time.perf_counter() - t
            finally:
                heartbeats.cancel()
                prometheus.cancel()
                logs.cancel()
                controller.stop()
                if keep_log is not None:
                    shutil.copyfile(controller.log_file, keep_log)
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    e50, e99 = percentile(explain_lags, 50), percentile(explain_lags, 99)
    a99, slowest = percentile(answers, 99), max(answers)
    per_allocation = allocation_events / allocated if allocated else float("nan")
    print(
        f"\ncontroller process on the real API server: {shape.nodes} nodes x {shape.gpus}, "
        f"{shape.classes} classes, {shape.claims} claims ({shape.pending} pending, "
        f"{len(never_fit)} of which never fit), {shape.claims + shape.other_pods} pods"
        + (f", client rate limit {api_qps:g}/s" if api_qps is not None else "")
    )
    print("  start-up (seconds after the process started):")
    print(f"  start-up lists done         {lists:7.2f} s  ({watch_log.lines.get('lists', '')})")
    print(f"  complete view (metrics)     {complete:7.2f} s")
    print(f"  first explanation posted    {start_up.first:7.2f} s")
    print(
        f"  every waiting claim explained {explained_all:5.2f} s  ({len(never_fit)} claims; "
        f"seen by the benchmark at {all_seen:.2f} s; goal <= 30 s)"
    )
    print(f"  a template waiting pod then -> Event {first_lag:5.2f} s  (Kopf still listing)")
    print(f"  Kopf handed over every Pod  {kopf_pods:7.2f} s  (caught up)")
    print(
        f"  explained claims {start_up.explained}: posted again {start_up.posted_again}, "
        f"meaning changed {start_up.meaning_changed} (goal: 0)"
    )
    print("  from then on:")
    print(f"  claim change -> metric lag  p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms")
    print(f"  new waiting pod -> Event    p50 {e50 * 1000:7.1f} ms  p99 {e99 * 1000:7.1f} ms")
    print(f"    each, in order (ms): {' '.join(str(round(x * 1000)) for x in explain_lags)}")
    print(
        f"  Event writes per allocation {per_allocation:7.2f}  ({allocation_events} Events, "
        f"{allocated} claims allocated as the scheduler does; goal <= 1)"
    )
    print(f"  /metrics answered within    p99 {a99 * 1000:7.1f} ms  max {slowest * 1000:7.1f} ms")
    print(f"  resident memory             {memory:7.1f} MiB")
    print(f"  SIGTERM -> exited           {stopped:7.2f} s  (exit code {exit_code})")
    print(f"BENCH controller_apiserver_populate {populated:.1f} s")
    print(f"BENCH controller_apiserver_startup_lists {lists:.3f} s")
    print(f"BENCH controller_apiserver_complete_view {complete:.3f} s")
    print(f"BENCH controller_apiserver_first_explanation {start_up.first:.3f} s")
    print(f"BENCH controller_apiserver_every_waiting_claim_explained {explained_all:.3f} s")
    print(f"BENCH controller_apiserver_first_waiting_pod_explained {first_lag:.3f} s")
    print(f"BENCH controller_apiserver_caught_up {kopf_pods:.3f} s")
    print(f"BENCH controller_apiserver_startup_posted_again {start_up.posted_again} claims")
    print(f"BENCH controller_apiserver_startup_meaning_changed {start_up.meaning_changed} claims")
    print(f"BENCH controller_apiserver_lag_p50 {p50 * 1000:.1f} ms")
    print(f"BENCH controller_apiserver_lag_p99 {p99 * 1000:.1f} ms")
    print(f"BENCH controller_apiserver_explain_lag_p50 {e50 * 1000:.1f} ms")
    print(f"BENCH controller_apiserver_explain_lag_p99 {e99 * 1000:.1f} ms")
    print(f"BENCH controller_apiserver_event_writes_per_allocation {per_allocation:.2f} events")
    print(f"BENCH controller_apiserver_metrics_answer_max {slowest * 1000:.1f} ms")
    print(f"BENCH controller_apiserver_rss {memory:.1f} MiB")
    print(f"BENCH controller_apiserver_sigterm_exit {stopped:.3f} s")


KOPF_CAUGHT_UP = r"Kopf has handed over its Pod listing"
"""The controller's log line once Kopf has handed over its initial Pod listing (caught up)."""
KOPF_CAUGHT_UP_WITHIN = 1200.0
"""Seconds to wait for Kopf to hand over its Pod listing (558 s at 2,000 x 8 / 40,000 pods)."""
MAKE_BENCH = ("--nodes=300", "--claims=1800", "--pending=300", "--other-pods=10000")
"""The ``apiserver`` run of ``make bench`` (flags of that mode)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode")
    inprocess = modes.add_parser("inprocess", help="the Controller in this process (default)")
    inprocess.add_argument("--shape", choices=sorted(SHAPES), action="append")
    inprocess.add_argument("--changes", type=int, default=110)
    inprocess.add_argument("--burst", type=int, default=1000)
    apiserver = modes.add_parser("apiserver", help="the controller process, real API server")
    apiserver.add_argument("--nodes", type=int, default=1_000)
    apiserver.add_argument("--classes", type=int, default=10)
    apiserver.add_argument("--claims", type=int, default=5_700)
    apiserver.add_argument("--pending", type=int, default=1_700)
    apiserver.add_argument("--other-pods", type=int, default=14_300)
    apiserver.add_argument("--changes", type=int, default=50)
    apiserver.add_argument("--allocations", type=int, default=30)
    apiserver.add_argument("--keep-log", type=Path, help="copy the controller's log here")
    apiserver.add_argument(
        "--api-qps", type=float, help="the controller's client rate limit (default: the chart's)"
    )
    args = parser.parse_args()
    if args.mode == "apiserver":
        shape = Shape(args.nodes, 8, args.classes, args.claims, args.pending, args.other_pods)
        run = run_apiserver(shape, args.changes, args.allocations, args.keep_log, args.api_qps)
        asyncio.run(run)
        return 0
    shapes = getattr(args, "shape", None) or ["small", "medium", "classes", "full"]
    changes, burst = getattr(args, "changes", 110), getattr(args, "burst", 1000)
    if len(shapes) == 1:
        asyncio.run(run_inprocess(shapes[0], SHAPES[shapes[0]], changes, burst))
        return 0
    for name in shapes:  # one process each, so that each resident memory is its own
        command = [sys.executable, __file__, "inprocess", "--shape", name]
        subprocess.run([*command, f"--changes={changes}", f"--burst={burst}"], check=True)
    if args.mode is None:  # make bench: the real API server too
        subprocess.run([sys.executable, __file__, "apiserver", *MAKE_BENCH], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rolling update of the agents with no prepare outage, measured on real nodes.

The chart is installed with ``helm install`` (its agent pods really run, from the image ``make
images`` built), three nodes with simulated GPUs. Then pods that claim a GPU start every 2 s on
each of the three nodes while ``helm upgrade`` changes a pod annotation, which rolls every
agent pod: on each node the new pod registers beside the old one (sockets of its own), the
kubelet calls the newer, and the old one finishes what it has and goes. Measured and printed:
the pods started during the rollout, the kubelet's failed prepares and the pods' restarts
(both must be 0), and per node the longest time with no registration socket of the driver in
the kubelet's registry directory (polled every 100 ms): the gap in which the kubelet had no
plugin to call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import RealNode, eventually
from tests.e2e import helpers

CHART = helpers.REPO / "charts" / "dra-gpu"
RESOURCE = "/apis/resource.k8s.io/v1"
GPUS_PER_NODE = 16
"""More than the load's pods on a node at once (``Load.KEEP`` and those not deleted yet)."""
START_EVERY = 2.0


class Release:
    def __init__(self, suffix: str) -> None:
        self.name, self.namespace = f"roll{suffix}", f"roll-{suffix}"
        self.driver, self.device_class = f"roll-{suffix}.example.com", f"gpu-roll-{suffix}"
        self.daemonset = (
            f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{self.name}-dra-gpu-agent"
        )


@pytest_asyncio.fixture
async def release(
    helm: helpers.Helm, api: kube.Kube, nodes: list[RealNode], tmp_path: Path
) -> AsyncIterator[Release]:
    installed = Release(secrets.token_hex(3))
    values = tmp_path / "values.json"
    profile = {
        "nodes": {n.name: {"devices": [{"count": GPUS_PER_NODE, "memory": "8Gi"}]} for n in nodes}
    }
    values.write_text(
        json.dumps(
            {
                "driverName": installed.driver,
                "deviceClasses": {"default": {"name": installed.device_class}},
                "controller": {"replicas": 1},
                "agent": {"profile": profile, "resyncSeconds": 10},
            }
        )
    )
    await helm(
        *("install", installed.name, str(CHART), "--namespace", installed.namespace),
        *("--create-namespace", "--values", str(values), "--wait", "--timeout=180s"),
    )
    try:
        await eventually(lambda: rolled_out(api, installed, len(nodes)), timeout=120, what="agents")
        yield installed
    finally:
        await helm.run("uninstall", installed.name, "-n", installed.namespace, "--wait")
        with contextlib.suppress(kube.ApiError):
            await api.delete(f"/api/v1/namespaces/{installed.namespace}")


async def rolled_out(api: kube.Kube, release: Release, count: int) -> bool:
    """Every node runs one agent pod of the current template, ready, and no other."""
    ds = await api.get(release.daemonset)
    status = ds.get("status", {})
    return bool(
        status.get("observedGeneration", 0) >= ds["metadata"]["generation"]
        and status.get("updatedNumberScheduled") == count
        and status.get("numberReady") == count
        and status.get("numberAvailable") == count
        and status.get("currentNumberScheduled") == count
        and not status.get("numberUnavailable")
        and await agent_pods(api, release) == count
    )


async def agent_pods(api: kube.Kube, release: Release) -> int:
    return len(await agent_uids(api, release))


class RegistrationWatch:
    """Per node, the longest time with no registration socket of ``driver`` in the kubelet's
    registry directory, polled every 100 ms while it runs."""

    def __init__(self, nodes: list[RealNode], driver: str) -> None:
        self.nodes, self.driver = nodes, driver
        self.longest = {n.name: 0.0 for n in nodes}
        self.most = {n.name: 0 for n in nodes}
        self._since: dict[str, float | None] = {n.name: None for n in nodes}

    def look(self) -> None:
        now = time.monotonic()
        for node in self.nodes:
            registry = node.kubelet_dir / "plugins_registry"
            found = len(list(registry.glob(f"{self.driver}-*reg.sock")))
            self.most[node.name] = max(self.most[node.name], found)
            since = self._since[node.name]
            if found == 0 and since is None:
                self._since[node.name] = now
            elif found and since is not None:
                self.longest[node.name] = max(self.longest[node.name], now - since)
                self._since[node.name] = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.look)
            await asyncio.sleep(0.1)
        self.look()
        now = time.monotonic()
        for name, since in self._since.items():
            if since is not None:
                self.longest[name] = max(self.longest[name], now - since)


class Load:
    """A pod claiming one GPU on each node every ``START_EVERY`` seconds; each pod is deleted
    (its claim unprepared) once it ran and ``KEEP`` newer ones exist on its node."""

    KEEP = 4

    def __init__(self, api: kube.Kube, namespace: str, nodes: list[RealNode]) -> None:
        self.api, self.namespace = api, namespace
        self.nodes = [n.name for n in nodes]
        self.started: dict[str, list[str]] = {n: [] for n in self.nodes}
        self.ran: list[str] = []
        self.never_ran: list[str] = []
        self.restarts = 0
        self.stop = asyncio.Event()

    @property
    def count(self) -> int:
        return sum(len(names) for names in self.started.values())

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            for node in self.nodes:
                tasks.create_task(self._start(node))
                tasks.create_task(self._reap(node))

    async def _start(self, node: str) -> None:
        n = 0
        while not self.stop.is_set():
            name = f"{node}-{n}"
            await self.api.create(
                f"/api/v1/namespaces/{self.namespace}/pods",
                {
                    "metadata": {"name": name, "labels": {"app": "load"}},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "terminationGracePeriodSeconds": 1,
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                        "containers": [helpers.workload("main", claims=["gpu"])],
                    },
                },
            )
            self.started[node].append(name)
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), START_EVERY)

    async def _reap(self, node: str) -> None:
        done = 0
        while not (self.stop.is_set() and done == len(self.started[node])):
            names = self.started[node]
            if done == len(names) or (not self.stop.is_set() and len(names) - done <= self.KEEP):
                await asyncio.sleep(0.5)
                continue
            name = names[done]
            path = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
            try:
                pod = await eventually(
                    functools.partial(self._running, path), timeout=120, what=f"{name} running"
                )
            except TimeoutError:
                self.never_ran.append(name)
            else:
                self.ran.append(name)
                self.restarts += sum(
                    c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", [])
                )
            await self.api.delete(path)
            done += 1

    async def _running(self, path: str) -> kube.Body | None:
        pod = await self.api.get(path)
        return pod if pod["status"].get("phase") == "Running" else None


async def agent_uids(api: kube.Kube, release: Release) -> set[str]:
    listing = await api.get(
        f"/api/v1/namespaces/{release.namespace}/pods",
        labelSelector=f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=agent",
    )
    return {p["metadata"]["uid"] for p in listing["items"]}


async def test_helm_upgrade_rolls_the_agents_with_no_failed_prepare_and_no_gap(
    api: kube.Kube,
    helm: helpers.Helm,
    nodes: list[RealNode],
    release: Release,
    namespace: str,  # after the release: its pods go while the agents can unprepare
) -> None:
    await api.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
        {
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": release.device_class}}
                        ]
                    }
                }
            },
        },
    )

    async def published() -> bool:
        listing = await api.get(
            f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={release.driver}"
        )
        return len({s["spec"]["nodeName"] for s in listing["items"]}) == len(nodes)

    await eventually(published, timeout=120, what="every node's pool published")
    ds = await api.get(release.daemonset)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    before = await agent_uids(api, release)

    stop_watch = asyncio.Event()
    watch = RegistrationWatch(nodes, release.driver)
    load = Load(api, namespace, nodes)
    watching = asyncio.create_task(watch.run(stop_watch))
    loading = asyncio.create_task(load.run())
    try:
        await eventually(lambda: load.ran, timeout=60, what="the load's first pod running")
        rollout_started = time.monotonic()
        in_rollout_from = load.count
        await helm(
            *("upgrade", release.name, str(CHART), "--namespace", release.namespace),
            *("--reuse-values", "--set", f"agent.podAnnotations.rollout=r{secrets.token_hex(2)}"),
        )
        await eventually(
            lambda: rolled_out(api, release, len(nodes)), timeout=240, what="the rollout done"
        )
        rollout_seconds = time.monotonic() - rollout_started
        in_rollout = load.count - in_rollout_from
        after = len(load.ran)
        # A few more pods after it, through the new agents only.
        await eventually(lambda: len(load.ran) >= after + 6, timeout=120, what="pods after it")
    finally:
        load.stop.set()
        await loading
        stop_watch.set()
        await watching

    assert not (await agent_uids(api, release)) & before, "every agent pod was replaced"
    events = await helpers.events_of(api, namespace)
    failed_prepares = [e for e in events if e.get("reason") == "FailedPrepareDynamicResources"]
    print(
        f"\nrollout of {len(nodes)} agents: {rollout_seconds:.1f} s; pods started: {load.count} "
        f"({in_rollout} while the rollout ran), ran: {len(load.ran)}, never ran: "
        f"{len(load.never_ran)}; failed prepares: {len(failed_prepares)}; restarts: "
        f"{load.restarts}; longest time without a registration socket, per node: "
        + ", ".join(f"{n} {s:.1f} s" for n, s in sorted(watch.longest.items()))
        + "; most registration sockets at once: "
        + ", ".join(f"{n} {c}" for n, c in sorted(watch.most.items()))
    )
    assert [e.get("message") for e in failed_prepares] == []
    assert load.never_ran == []
    assert load.restarts == 0
    assert all(count == 2 for count in watch.most.values()), watch.most  # side by side
    assert all(gap == 0.0 for gap in watch.longest.values()), watch.longest

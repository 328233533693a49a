"""What the rollout tests share: a release of the chart with its own driver name, a load of pods
that claim a GPU on every node, and a watch on the kubelet's registration sockets."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from dra_gpu import kube
from dra_gpu.testing import RealNode, eventually
from tests.e2e import helpers

RESOURCE = "/apis/resource.k8s.io/v1"
GPUS_PER_NODE = 16
"""More than the load's pods on a node at once (``Load.KEEP`` and those not deleted yet)."""
START_EVERY = 2.0
OUTAGE_SECONDS = 120.0
"""How long the load waits out an API server that does not answer (a restart, etcd timing out)."""
OUTAGE: tuple[type[Exception], ...] = (kube.ApiError, kube.Unreachable, *kube.CONNECTION_ERRORS)
T = TypeVar("T")


async def answered(call: Callable[[], Awaitable[T]]) -> T:
    """``call``'s result once the API server answers it: no answer, a 5xx or a 429 is tried
    again every second for ``OUTAGE_SECONDS``; any other error is raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OUTAGE_SECONDS
    while True:
        try:
            return await call()
        except OUTAGE as exc:
            outage = not isinstance(exc, kube.ApiError) or exc.status >= 500 or exc.status == 429
            if not outage or loop.time() > deadline:
                raise
        await asyncio.sleep(1.0)


class Release:
    def __init__(self, suffix: str) -> None:
        self.name, self.namespace = f"roll{suffix}", f"roll-{suffix}"
        self.driver, self.device_class = f"roll-{suffix}.example.com", f"gpu-roll-{suffix}"
        self.daemonset = (
            f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{self.name}-dra-gpu-agent"
        )


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
        self.changes: dict[str, list[tuple[float, list[str]]]] = {n.name: [] for n in nodes}
        """Per node, when (seconds since the watch started) the sockets there changed, and to
        which: what a failed assertion shows."""
        self._since: dict[str, float | None] = {n.name: None for n in nodes}
        self._start = time.monotonic()

    def look(self) -> None:
        now = time.monotonic()
        for node in self.nodes:
            registry = node.kubelet_dir / "plugins_registry"
            names = sorted(p.name for p in registry.glob(f"{self.driver}-*reg.sock"))
            found = len(names)
            changes = self.changes[node.name]
            if not changes or changes[-1][1] != names:
                changes.append((round(now - self._start, 1), names))
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
            await answered(functools.partial(self._create, name, node))
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
                self.restarts += restarts(pod)
            await answered(functools.partial(self._delete, path))
            done += 1

    async def _create(self, name: str, node: str) -> None:
        try:
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
        except kube.ApiError as exc:
            if not exc.conflict:  # 409: an earlier try that got no answer did create it
                raise

    async def _delete(self, path: str) -> None:
        try:
            await self.api.delete(path)
        except kube.ApiError as exc:
            if not exc.not_found:  # an earlier try that got no answer did delete it
                raise

    async def _running(self, path: str) -> kube.Body | None:
        pod = await answered(functools.partial(self.api.get, path))
        return pod if pod["status"].get("phase") == "Running" else None


async def agent_uids(api: kube.Kube, release: Release) -> set[str]:
    return {p["metadata"]["uid"] for p in await _agents(api, release)}


async def agent_restarts(api: kube.Kube, release: Release) -> int:
    """The container restarts of the release's agent pods there are now (those of pods a
    rollout replaced are gone with them)."""
    return sum(restarts(pod) for pod in await _agents(api, release))


def restarts(pod: kube.Body) -> int:
    """How often ``pod``'s containers restarted."""
    return sum(c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", []))


async def _agents(api: kube.Kube, release: Release) -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{release.namespace}/pods",
        labelSelector=f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=agent",
    )
    return list(listing["items"])


async def one_gpu_template(api: kube.Kube, namespace: str, device_class: str) -> None:
    await api.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
        {
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                    }
                }
            },
        },
    )


async def published(api: kube.Kube, release: Release, count: int) -> bool:
    listing = await api.get(
        f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={release.driver}"
    )
    return len({s["spec"]["nodeName"] for s in listing["items"]}) == count


class Phase:
    """One rollout (a ``helm upgrade`` or ``rollback``) under the load: what it measured."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seconds = 0.0
        self.started = 0  # pods started while it ran
        self.failed_prepares: list[str] = []
        self.longest_gap: dict[str, float] = {}
        self.most_sockets: dict[str, int] = {}
        self.socket_changes: dict[str, list[tuple[float, list[str]]]] = {}
        self.agent_restarts = 0

    def __str__(self) -> str:
        return (
            f"{self.what}: {self.seconds:.1f} s, {self.started} pods started meanwhile, "
            f"{len(self.failed_prepares)} failed prepares; longest time without a registration "
            "socket, per node: "
            + ", ".join(f"{n} {s:.1f} s" for n, s in sorted(self.longest_gap.items()))
            + "; most registration sockets at once: "
            + ", ".join(f"{n} {c}" for n, c in sorted(self.most_sockets.items()))
        )

    def __repr__(self) -> str:  # what a failed assertion prints
        changes = "; ".join(
            f"{n}: " + " ".join(f"{t} s {names}" for t, names in seen)
            for n, seen in sorted(self.socket_changes.items())
        )
        return (
            f"{self}; agent restarts: {self.agent_restarts}; failed prepares: "
            f"{self.failed_prepares}; registration sockets: {changes}"
        )


async def roll(
    api: kube.Kube,
    nodes: list[RealNode],
    release: Release,
    load: Load,
    namespace: str,
    what: str,
    command: Callable[[], Awaitable[object]],
) -> Phase:
    """Run ``command`` (it changes the agents' DaemonSet) while the load runs, until the
    rollout is done and six more pods ran; the registration sockets watched meanwhile."""
    phase = Phase(what)
    before = await failed_prepares(api, namespace)
    stop_watch = asyncio.Event()
    watch = RegistrationWatch(nodes, release.driver)
    watching = asyncio.create_task(watch.run(stop_watch))
    try:
        started, count_from = time.monotonic(), load.count
        await command()
        await eventually(
            lambda: rolled_out(api, release, len(nodes)), timeout=240, what=f"{what} done"
        )
        phase.seconds = time.monotonic() - started
        phase.started = load.count - count_from
        after = len(load.ran)
        await eventually(lambda: len(load.ran) >= after + 6, timeout=120, what="pods after it")
    finally:
        stop_watch.set()
        await watching
    phase.longest_gap, phase.most_sockets = watch.longest, watch.most
    phase.socket_changes = watch.changes
    phase.agent_restarts = await agent_restarts(api, release)
    phase.failed_prepares = [
        message
        for uid, (count, message) in (await failed_prepares(api, namespace)).items()
        for _ in range(count - before.get(uid, (0, ""))[0])
    ]
    return phase


async def failed_prepares(api: kube.Kube, namespace: str) -> dict[str, tuple[int, str]]:
    """The kubelet's ``FailedPrepareDynamicResources`` Events in ``namespace``: by UID, how
    often each was reported (a repeat raises its count) and its message."""
    return {
        e["metadata"]["uid"]: (e.get("count", 1), str(e.get("message")))
        for e in await helpers.events_of(api, namespace)
        if e.get("reason") == "FailedPrepareDynamicResources"
    }


def chart_values(release: Release, nodes: list[RealNode]) -> dict[str, object]:
    """The values the rollout tests install with: the release's driver and class, one
    controller, ``GPUS_PER_NODE`` simulated GPUs on each node."""
    profile = {
        "nodes": {n.name: {"devices": [{"count": GPUS_PER_NODE, "memory": "8Gi"}]} for n in nodes}
    }
    return {
        "driverName": release.driver,
        "deviceClasses": {"default": {"name": release.device_class}},
        "controller": {"replicas": 1},
        "agent": {"profile": profile, "resyncSeconds": 10},
    }


@contextlib.asynccontextmanager
async def installed(
    helm: helpers.Helm,
    api: kube.Kube,
    nodes: list[RealNode],
    release: Release,
    chart: Path,
    values: dict[str, object],
    values_file: Path,
) -> AsyncIterator[Release]:
    """``release`` installed from ``chart`` with ``values``, its agents rolled out on every
    node; uninstalled, its namespace deleted, afterwards."""
    await asyncio.to_thread(values_file.write_text, json.dumps(values))
    await helm(
        *("install", release.name, str(chart), "--namespace", release.namespace),
        *("--create-namespace", "--values", str(values_file), "--wait", "--timeout=180s"),
    )
    try:
        await eventually(lambda: rolled_out(api, release, len(nodes)), timeout=120, what="agents")
        yield release
    finally:
        await helm.run("uninstall", release.name, "-n", release.namespace, "--wait")
        with contextlib.suppress(kube.ApiError):
            await api.delete(f"/api/v1/namespaces/{release.namespace}")

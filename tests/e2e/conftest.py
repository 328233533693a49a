"""Fixtures for tests against the real control plane and real nodes (``dra_gpu.testing``).

One control plane and three real nodes (node-01..03: the upstream kubelet on containerd, each
in namespaces of its own, ``RealNode``) per session; one namespace per test. Tests that need
nodes of their own (a pool of GPUs, a node to reboot) start more with ``helpers.gpu_nodes``.
A failed test prints the pods, claims, slices and events it saw, so a red CI run says why.

The node binaries and images come from the repository's build scripts (cached under
``~/.cache/dra-gpu``; quick when nothing changed): ``hack/build-containerd.sh`` and
``hack/build-images.sh``, or the directories named by ``DRA_GPU_CONTAINERD_DIR`` and
``DRA_GPU_IMAGES_DIR``.

Every test here is marked ``cluster`` (``tests/conftest.py``); the fixtures that start the
control plane and the nodes refuse any other (``tests.support.lanes``). The check of what the
whole suite left behind runs last: ``test_objects_left_alone.py`` (``session_end``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from pathlib import Path

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import (
    AgentProcess,
    ControllerProcess,
    ControlPlane,
    NodeRuntime,
    RealNode,
    eventually,
    start_nodes,
)
from tests.e2e import helpers
from tests.e2e.helpers import Kubectl
from tests.support import binaries, lanes

NODES = ("node-01", "node-02", "node-03")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    lanes.require("the control plane", lanes.CLUSTER)
    # Logs stay under pytest's temp dir (the last runs are kept) for post-mortems.
    with ControlPlane(workdir=tmp_path_factory.mktemp("control-plane")) as cp:
        yield cp


@pytest.fixture(scope="session")
def node_runtime(control_plane: ControlPlane, short_root: Path) -> NodeRuntime:
    containerd = binaries.built("build-containerd.sh", "DRA_GPU_CONTAINERD_DIR")
    images = binaries.built("build-images.sh", "DRA_GPU_IMAGES_DIR")
    runtime = NodeRuntime.from_builds(control_plane.bin_dir, containerd, images)
    # The session's own links: a rebuild meanwhile (code edited while tests run) prunes the cache.
    return runtime.pinned(short_root / "images")


@pytest.fixture(scope="session")
def short_root() -> Iterator[Path]:
    """Where nodes keep their state: a short path, since the agent's sockets in a node's
    kubelet directory must fit a unix socket's 107 bytes (pytest's temp paths are longer).
    Removed at the end of the session."""
    root = Path(tempfile.mkdtemp(prefix="dra-gpu-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def short_path(short_root: Path) -> Path:
    """A fresh directory of one test under ``short_root``."""
    return Path(tempfile.mkdtemp(prefix="t", dir=short_root))


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """Prometheus and promtool (``hack/build-prometheus.sh``, or ``DRA_GPU_PROMETHEUS_DIR``)."""
    return binaries.prometheus_bin()


@pytest.fixture(scope="session")
def nodes(
    control_plane: ControlPlane, node_runtime: NodeRuntime, short_root: Path
) -> Iterator[list[RealNode]]:
    started = [
        RealNode(control_plane, name, index, short_root / name, node_runtime)
        for index, name in enumerate(NODES, start=1)
    ]
    start_nodes(started)
    try:
        yield started
    finally:
        for node in reversed(started):
            node.stop()


@pytest.fixture(scope="session")
def node_named(nodes: list[RealNode]) -> dict[str, RealNode]:
    return {node.name: node for node in nodes}


@pytest_asyncio.fixture(scope="session")
async def api(control_plane: ControlPlane) -> AsyncIterator[kube.Kube]:
    async with await kube.Kube.connect(control_plane.kubeconfig) as client:
        yield client


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(control_plane.binary("kubectl"), control_plane.kubeconfig)


@pytest_asyncio.fixture(scope="session")
async def helm(control_plane: ControlPlane) -> helpers.Helm:
    return helpers.Helm(control_plane)


@pytest_asyncio.fixture
async def namespace(
    request: pytest.FixtureRequest, api: kube.Kube, kubectl: Kubectl, nodes: list[RealNode]
) -> AsyncIterator[str]:
    async with helpers.isolated_namespace(request, api, kubectl) as name:
        yield name


@pytest_asyncio.fixture
async def agent_with(
    control_plane: ControlPlane,
    node_named: dict[str, RealNode],
    api: kube.Kube,
    namespace: str,
    tmp_path: Path,
) -> AsyncIterator[helpers.AgentStarter]:
    """See ``helpers.AgentStarter``."""

    @contextlib.asynccontextmanager
    async def start(
        profile: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        pods_gone_within: float = 120,
    ) -> AsyncIterator[AgentProcess]:
        if isinstance(profile, str):
            (path := tmp_path / "profile.yaml").write_text(profile)
            profile = path
        started = AgentProcess.on(
            node_named["node-01"],
            control_plane.kubeconfig,
            tmp_path / "agent",
            profile=profile,
            env=dict(env or {}),
        )
        async with helpers.agent_on(api, started, namespace, pods_gone_within=pods_gone_within):
            yield started

    yield start


@pytest_asyncio.fixture(scope="session")
async def controller(
    control_plane: ControlPlane, nodes: list[RealNode], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ControllerProcess]:
    """One controller replica for the whole session (as the chart's Deployment runs it)."""
    process = ControllerProcess(
        "controller-a",
        control_plane.kubeconfig,
        tmp_path_factory.mktemp("controller"),
        lease_seconds=4,
        resync_seconds=2,
    )
    await process.astart()
    await eventually(process.leads, what="controller-a holds the lease")
    yield process
    process.stop()

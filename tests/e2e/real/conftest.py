"""Fixtures for tests on real nodes: a control plane of their own and three real nodes (the
upstream kubelet on containerd, ``dra_gpu.testing.RealNode``), into which the driver is
installed with ``helm install`` of the chart, from images built without a registry.

The binaries and images come from the repository's build scripts (cached under
``~/.cache/dra-gpu``; quick when nothing changed): ``hack/build-containerd.sh`` and
``hack/build-images.sh``, or the directories named by ``DRA_GPU_CONTAINERD_DIR`` and
``DRA_GPU_IMAGES_DIR``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import ControlPlane, NodeRuntime, RealNode
from tests.e2e import helpers
from tests.e2e.helpers import REPO, Kubectl

NODES = ("node-01", "node-02", "node-03")


def _built(script: str, variable: str) -> Path:
    if explicit := os.environ.get(variable):
        return Path(explicit)
    result = subprocess.run(
        [str(REPO / "hack" / script)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/{script} failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def node_runtime(control_plane: ControlPlane) -> NodeRuntime:
    containerd = _built("build-containerd.sh", "DRA_GPU_CONTAINERD_DIR")
    images = _built("build-images.sh", "DRA_GPU_IMAGES_DIR")
    return NodeRuntime.from_builds(control_plane.bin_dir, containerd, images)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(workdir=tmp_path_factory.mktemp("real-control-plane")) as cp:
        yield cp


@pytest.fixture(scope="session")
def nodes(
    control_plane: ControlPlane, node_runtime: NodeRuntime, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[RealNode]]:
    root = tmp_path_factory.mktemp("real-nodes")
    started: list[RealNode] = []
    try:
        for index, name in enumerate(NODES, start=1):
            node = RealNode(control_plane, name, index, root / name, node_runtime)
            node.start()
            started.append(node)
        yield started
    finally:
        for node in reversed(started):
            node.stop()


@pytest_asyncio.fixture(scope="session")
async def api(control_plane: ControlPlane) -> AsyncIterator[kube.Kube]:
    async with await kube.Kube.connect(control_plane.kubeconfig) as client:
        yield client


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(control_plane.binary("kubectl"), control_plane.kubeconfig)


@pytest_asyncio.fixture
async def namespace(
    request: pytest.FixtureRequest, api: kube.Kube, kubectl: Kubectl, nodes: list[RealNode]
) -> AsyncIterator[str]:
    async with helpers.isolated_namespace(request, api, kubectl) as name:
        yield name

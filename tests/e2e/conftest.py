"""Fixtures for tests against the real control plane (``dra_gpu.testing``).

One control plane and one kubelet stand-in (nodes node-01..03) per session; one namespace per
test. A failed test prints the pods, claims, slices and events it saw, so a red CI run says why.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from dra_gpu import kube
from dra_gpu.testing import (
    ControllerProcess,
    ControlPlane,
    DraSettings,
    KubeletStandIn,
    eventually,
)
from tests.e2e import helpers
from tests.e2e.helpers import Kubectl

NODES = ("node-01", "node-02", "node-03")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    # Logs stay under pytest's temp dir (the last runs are kept) for post-mortems.
    with ControlPlane(workdir=tmp_path_factory.mktemp("control-plane")) as cp:
        yield cp


@pytest_asyncio.fixture(scope="session")
async def api(control_plane: ControlPlane) -> AsyncIterator[kube.Kube]:
    async with await kube.Kube.connect(control_plane.kubeconfig) as client:
        yield client


@pytest_asyncio.fixture(scope="session")
async def kubelet(
    api: kube.Kube, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[KubeletStandIn]:
    # The kubelet's DRA behaviour, with shorter retries than the real one so tests stay quick.
    dra = DraSettings(retry_seconds=1.0, wipe_delay_seconds=30.0)
    async with KubeletStandIn(api, NODES, tmp_path_factory.mktemp("kubelet"), dra=dra) as standin:
        yield standin


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(control_plane.binary("kubectl"), control_plane.kubeconfig)


@pytest_asyncio.fixture
async def namespace(
    request: pytest.FixtureRequest, api: kube.Kube, kubectl: Kubectl
) -> AsyncIterator[str]:
    async with helpers.isolated_namespace(request, api, kubectl) as name:
        yield name


@pytest_asyncio.fixture(scope="session")
async def controller(
    control_plane: ControlPlane, kubelet: KubeletStandIn, tmp_path_factory: pytest.TempPathFactory
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

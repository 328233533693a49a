"""Fixtures for tests against the real control plane (``dra_gpu.testing``).

One control plane and one kubelet stand-in (nodes node-01..03) per session; one namespace per
test. A failed test prints the pods, claims, slices and events it saw, so a red CI run says why.
"""

from __future__ import annotations

import secrets
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
    name = f"t-{secrets.token_hex(3)}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # Pods are rejected until the controller-manager created the default ServiceAccount.
    await eventually(
        lambda: helpers.exists(api, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        what=f"ServiceAccount {name}/default",
    )
    yield name
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        print(f"\n===== diagnostics for namespace {name} =====")
        for args in (
            ("get", "pods,resourceclaims,resourceclaimtemplates", "-n", name, "-o", "wide"),
            ("get", "deviceclasses,resourceslices", "-o", "wide"),
            ("get", "events", "-n", name, "--sort-by=.lastTimestamp"),
            ("get", "resourceclaims", "-n", name, "-o", "yaml"),
        ):
            try:
                print(f"$ kubectl {' '.join(args)}\n{await kubectl(*args)}")
            except AssertionError as exc:
                print(exc)
    await api.delete(f"/api/v1/namespaces/{name}")
    # Wait until it is gone: its claims hold devices that the next test may need.
    await eventually(
        lambda: _gone(api, f"/api/v1/namespaces/{name}"), timeout=120, what=f"namespace {name} gone"
    )


async def _gone(api: kube.Kube, path: str) -> bool:
    return not await helpers.exists(api, path)


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

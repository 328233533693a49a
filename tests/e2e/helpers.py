"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from dra_gpu import kube, slices
from dra_gpu.testing import AgentProcess, ControlPlane, DraSettings, KubeletStandIn, eventually

RESOURCE = "/apis/resource.k8s.io/v1"

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "crds-examples"


class Kubectl:
    """The built kubectl against the test cluster, as the tutorial's reader runs it."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = str(binary)
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    async def __call__(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {err.decode()}")
        return out.decode()


async def exists(api: kube.Kube, path: str) -> bool:
    try:
        await api.get(path)
    except kube.ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


async def events_of(api: kube.Kube, namespace: str, kind: str = "Pod") -> list[kube.Body]:
    listing = await api.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.kind={kind}"
    )
    items: list[kube.Body] = listing.get("items", [])
    return items


def started_env(
    kubelet: KubeletStandIn, namespace: str, pod: str, container: str
) -> dict[str, str] | None:
    """The env the container got from CDI, or None while the stand-in has not started it."""
    try:
        return kubelet.dra.container_env(namespace, pod, container)
    except KeyError:
        return None


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1)[:4000]


@contextlib.asynccontextmanager
async def gpu_nodes(
    api: kube.Kube,
    control_plane: ControlPlane,
    root: Path,
    names: Sequence[str],
    *,
    gpus: int,
    device_class: str,
    agent_env: dict[str, str] | None = None,
) -> AsyncIterator[tuple[KubeletStandIn, list[AgentProcess]]]:
    """Stand-in nodes of their own (labelled ``dra-gpu.io/pool=<device_class>``), each with an
    agent and ``gpus`` simulated GPUs, and a DeviceClass for them; all removed afterwards."""
    profile = root / "profile.yaml"
    profile.write_text(
        "nodes:\n"
        + "".join(f"  {n}:\n    devices:\n    - count: {gpus}\n      memory: 16Gi\n" for n in names)
    )
    selectors = [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]
    await api.create(
        f"{RESOURCE}/deviceclasses",
        {"metadata": {"name": device_class}, "spec": {"selectors": selectors}},
    )
    try:
        async with KubeletStandIn(api, names, root / "k", dra=DraSettings(retry_seconds=1)) as kl:
            for name in names:
                await api.patch(
                    f"/api/v1/nodes/{name}",
                    {"metadata": {"labels": {"dra-gpu.io/pool": device_class}}},
                )
            agents = [
                AgentProcess(
                    n,
                    control_plane.kubeconfig,
                    kl.kubelet_dir(n),
                    kl.kubelet_dir(n),
                    profile=profile,
                    env=dict(agent_env or {}),
                )
                for n in names
            ]
            try:
                await asyncio.gather(*(a.astart(120) for a in agents))
                yield kl, agents
            finally:
                for agent in agents:
                    agent.stop()
    finally:
        for name in names:  # the other tests count three nodes
            with contextlib.suppress(kube.ApiError):
                await api.delete(f"/api/v1/nodes/{name}")
        listing = await api.get(
            f"{RESOURCE}/resourceslices",
            labelSelector=f"{slices.MANAGED_BY_LABEL}={slices.MANAGED_BY_VALUE}",
        )
        for item in listing["items"]:
            if item["spec"].get("nodeName") in names:
                await api.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")
        await api.delete(f"{RESOURCE}/deviceclasses/{device_class}")


@contextlib.asynccontextmanager
async def isolated_namespace(
    request: pytest.FixtureRequest, api: kube.Kube, kubectl: Kubectl
) -> AsyncIterator[str]:
    """A namespace of one test; a failed test prints the pods, claims, slices and events it
    saw, so a red CI run says why. Gone (with its claims) before the next test starts."""
    name = f"t-{secrets.token_hex(3)}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # Pods are rejected until the controller-manager created the default ServiceAccount.
    await eventually(
        lambda: exists(api, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
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

    async def gone() -> bool:
        return not await exists(api, f"/api/v1/namespaces/{name}")

    # Wait until it is gone: its claims hold devices that the next test may need.
    await eventually(gone, timeout=120, what=f"namespace {name} gone")


class Helm:
    def __init__(self, control_plane: ControlPlane) -> None:
        self.binary = str(control_plane.binary("helm"))
        self.env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}

    async def run(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def __call__(self, *args: str) -> str:
        code, out, err = await self.run(*args)
        assert code == 0, f"helm {' '.join(args)} failed: {err}"
        return out

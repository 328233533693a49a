"""The agent's lean import of kubernetes-asyncio (``agent.lean``), in a fresh interpreter: the
agent's modules load without the client's generated classes, ``dra_gpu.kube`` still works, and
code that asks for a generated class gets the real package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHECK = textwrap.dedent(
    """
    import asyncio, sys
    import dra_gpu.agent.runner
    from dra_gpu import kube

    loaded = sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio"))
    assert "kubernetes_asyncio.client.api" not in loaded, loaded
    assert not any(m.startswith("kubernetes_asyncio.client.models.") for m in loaded), loaded
    assert len(loaded) < 20, loaded

    async def connect():
        async with await kube.Kube.connect(sys.argv[1]) as api:
            return api.server
    assert asyncio.run(connect()) == "https://127.0.0.1:6443"

    import kubernetes_asyncio
    pod = kubernetes_asyncio.client.V1Pod(metadata=kubernetes_asyncio.client.V1ObjectMeta())
    from kubernetes_asyncio.client import CoreV1Api
    assert type(pod).__module__ == "kubernetes_asyncio.client.models.v1_pod"
    assert sys.modules["kubernetes_asyncio"].__version__
    print("ok")
    """
)

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_agent_loads_the_client_without_its_generated_classes_which_still_load_on_demand(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "ok", done.stderr

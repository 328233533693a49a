"""What the node agent's process loads, in a fresh interpreter: neither aiohttp nor
kubernetes-asyncio (with its generated classes, about 35 MiB more on every GPU node), nor
grpcio (its core library, 10 MiB). The agent speaks HTTP through ``dra_gpu.kube.transport``, serves
it through ``dra_gpu.serving.httpserver`` and serves gRPC with grpclib (``agent.server``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHECK = textwrap.dedent(
    """
    import sys
    import dra_gpu.agent.runner

    heavy = ("aiohttp", "kubernetes_asyncio", "grpc")
    print(sorted(m for m in sys.modules if m.partition(".")[0] in heavy))
    """
)


def test_the_agent_loads_neither_aiohttp_nor_kubernetes_asyncio_nor_grpcio() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
    assert done.stderr == ""

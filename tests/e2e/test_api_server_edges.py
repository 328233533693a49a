"""The API server at the edges, against the real control plane: a controller started before
its API server answers waits (one log line per attempt, not ready meanwhile) and then works; a
kubeconfig whose credentials the API server rejects ends ``explain`` and the controller with one
line and exit code 5 (``dra_gpu.exits``), since waiting cannot fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from dra_gpu import kube
from dra_gpu.exits import ExitCode
from dra_gpu.testing import ControllerProcess, ControlPlane, eventually

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "waits.example.com"


def kubeconfig_like(control_plane: ControlPlane, path: Path, **changes: str) -> Path:
    """The admin kubeconfig with another ``server`` (same CA: its certificate names 127.0.0.1)
    or ``token``."""
    config = json.loads(control_plane.kubeconfig.read_text())
    if "server" in changes:
        config["clusters"][0]["cluster"]["server"] = changes["server"]
    if "token" in changes:
        config["users"][0]["user"]["token"] = changes["token"]
    path.write_text(json.dumps(config))
    return path


def slice_body(name: str, node: str) -> kube.Body:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def published(controller: ControllerProcess, node: str) -> bool:
    line = f'dra_gpu_devices{{node="{node}",state="published"}} 1.0'
    return line in controller.metrics().splitlines()


@contextlib.asynccontextmanager
async def forwarding(port: int, target: int) -> AsyncIterator[None]:
    """127.0.0.1:``port`` forwards to 127.0.0.1:``target``, byte for byte: the API server
    appears at an address where nothing answered before."""
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        for task in (pipe(reader, up_writer), pipe(up_reader, writer)):
            pipes.add(asyncio.create_task(task))

    server = await asyncio.start_server(connected, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await server.wait_closed()


async def test_controller_started_before_its_api_server_waits_then_leads(
    control_plane: ControlPlane, api: kube.Kube, namespace: str, tmp_path: Path
) -> None:
    # Bound, never listening: connections are refused, and no other process takes the port.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    server = f"https://127.0.0.1:{port}"
    config = kubeconfig_like(control_plane, tmp_path / "kubeconfig", server=server)
    lease = slice_name = node = f"waits-{secrets.token_hex(3)}"
    controller = ControllerProcess(
        "waiting-0",
        config,
        tmp_path / "controller",
        namespace=namespace,
        driver=DRIVER,  # its own: nothing of the session's controller is touched
        lease_seconds=4,
        resync_seconds=2,
        extra_args=(f"--lease-name={lease}",),
    )
    controller.spawn()
    try:

        def attempts() -> list[str]:
            text = controller.log_file.read_text()
            return [line for line in text.splitlines() if "does not answer" in line]

        await eventually(lambda: len(attempts()) >= 2, what="two attempts logged")
        assert f"the API server at {server} (kubeconfig {config}, context local)" in attempts()[0]
        assert "connection refused; attempt 1, next in 1 s" in attempts()[0]
        assert "connection refused; attempt 2, next in 2 s" in attempts()[1]
        assert await asyncio.to_thread(controller.probe, "/readyz") == 503
        assert await asyncio.to_thread(controller.probe, "/healthz") == 200
        assert not controller.exited

        holder.close()
        async with forwarding(port, control_plane.ports.apiserver):

            async def ready() -> bool:
                return await asyncio.to_thread(controller.probe, "/readyz") == 200

            await eventually(ready, timeout=120, what="ready once its API server answers")
            await eventually(
                lambda: asyncio.to_thread(controller.leads), what=f"{controller} holds the lease"
            )
            path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
            assert (await api.get(path))["spec"]["holderIdentity"] == "waiting-0"
            # Kopf's watches work too (they log in on their own): a slice reaches the metrics.
            await api.create(f"{RESOURCE}/resourceslices", slice_body(slice_name, node))
            await eventually(
                lambda: asyncio.to_thread(published, controller, node),
                what=f"{controller} counts the device of {slice_name}",
            )
            assert f"the API server at {server} answers" in controller.log_file.read_text()
            # In a thread: the loop that forwards its last requests (lease release) must run.
            assert await asyncio.to_thread(controller.stop) == ExitCode.OK
    finally:
        holder.close()
        controller.kill()
        await api.delete(f"{RESOURCE}/resourceslices/{slice_name}")
    assert "Traceback" not in controller.log_file.read_text()


async def run(*argv: str) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dra_gpu", *argv, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, err.decode().splitlines()


async def test_explain_with_rejected_credentials_says_whose_and_exits_5(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    config = kubeconfig_like(control_plane, tmp_path / "kubeconfig", token="not-the-token")
    code, lines = await run("explain", "pod/x", f"--kubeconfig={config}")
    assert code == ExitCode.REFUSED
    assert lines == [
        f"dra-gpu explain: the API server at {control_plane.server} rejected the credentials "
        f"of kubeconfig {config}, context local (401 Unauthorized): the token or client "
        "certificate is wrong or expired; fix the user of that context, or use another kubeconfig"
    ]


async def test_controller_with_rejected_credentials_stops_instead_of_waiting(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    config = kubeconfig_like(control_plane, tmp_path / "kubeconfig", token="not-the-token")
    code, lines = await run(
        "controller",
        f"--kubeconfig={config}",
        "--bind-address=127.0.0.1",
        "--health-port=0",
        "--metrics-port=0",
    )
    assert code == ExitCode.REFUSED
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"dra-gpu controller: the API server at {control_plane.server} rejected the credentials"
    )

"""Every entry point runs as the image's user: uid 65532, no passwd entry, no ``HOME``, ``USER``
or ``LOGNAME`` — as the chart's containers run it. Kopf's own identity detection asked the
passwd database and the controller crash-looped (``getpwuid(): uid not found: 65532``).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gpu.testing import AgentProcess, ControllerProcess, ControlPlane, as_user, eventually
from tests.e2e.helpers import TUTORIAL_PROFILE

IMAGE_UID = 65532


@pytest.fixture
def foreign_home(control_plane: ControlPlane) -> Iterator[Path]:
    """A directory the image's user owns, with a copy of the admin kubeconfig (pytest's temp
    directories are closed to other users)."""
    with pytest.raises(KeyError):
        pwd.getpwuid(IMAGE_UID)  # the point of the test: no passwd entry
    home = Path(tempfile.mkdtemp(prefix="dra-gpu-uid-"))
    shutil.copy(control_plane.kubeconfig, home / "kubeconfig")
    for path in (home, home / "kubeconfig"):
        os.chown(path, IMAGE_UID, IMAGE_UID)
    yield home
    shutil.rmtree(home)


async def test_controller_starts_and_leads_as_the_image_user(
    foreign_home: Path, namespace: str
) -> None:
    process = ControllerProcess(
        "controller-uid",
        foreign_home / "kubeconfig",
        foreign_home / "state",
        namespace=namespace,
        lease_seconds=4,
        resync_seconds=2,
        extra_args=("--lease-name=uid-test",),
        run_as=IMAGE_UID,
    )
    try:
        await process.astart()  # ready: a complete pass over the cluster
        await eventually(process.leads, what="the controller run as uid 65532 holds its lease")
        assert process.pid is not None
        assert os.stat(f"/proc/{process.pid}").st_uid == IMAGE_UID
    finally:
        assert process.stop() == 0, process.log_file.read_text()
    assert "getpwuid" not in process.log_file.read_text()


async def test_agent_starts_as_the_image_user(foreign_home: Path) -> None:
    """The chart runs the agent as root; nothing in it may depend on that for starting."""
    kubelet_dir = foreign_home / "kubelet"
    for sub in ("plugins", "plugins_registry"):
        (kubelet_dir / sub).mkdir(parents=True)
        os.chown(kubelet_dir / sub, IMAGE_UID, IMAGE_UID)
    os.chown(kubelet_dir, IMAGE_UID, IMAGE_UID)
    process = AgentProcess(
        node="uid-test-node",
        kubeconfig=foreign_home / "kubeconfig",
        kubelet_dir=kubelet_dir,
        state_dir=foreign_home / "state",
        profile=TUTORIAL_PROFILE,
        run_as=IMAGE_UID,
    )
    process.state_dir.mkdir()
    os.chown(process.state_dir, IMAGE_UID, IMAGE_UID)
    process.spawn()
    try:
        # Not ready until a kubelet registers it (none watches this directory): alive and
        # serving both gRPC servers is what it can show.
        await eventually(lambda: process.probe("/healthz") == 200, what="agent healthy")
        assert any((kubelet_dir / "plugins_registry").iterdir()), "no registration socket"
        await asyncio.sleep(1)
        assert not process.exited, process.log_file.read_text()
    finally:
        assert process.stop() == 0, process.log_file.read_text()


def test_explain_runs_as_the_image_user(foreign_home: Path, namespace: str) -> None:
    result = subprocess.run(
        as_user(
            IMAGE_UID,
            [
                *(sys.executable, "-m", "dra_gpu", "explain", "pod/absent", "-n", namespace),
                f"--kubeconfig={foreign_home / 'kubeconfig'}",
            ],
        ),
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("HOME", "USER", "LOGNAME")},
        timeout=60,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert "absent" in result.stderr

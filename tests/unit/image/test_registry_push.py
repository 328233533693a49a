"""The images `make images` writes load into a registry the way docs/install.md says.

`make images` builds OCI archives (no Docker); a cluster with a registry pushes them with a common
tool. Here crane (go-containerregistry, built by hack/build-crane.sh) pushes the driver's archive
to a real registry on loopback (`crane registry serve`), and what the registry then serves is
the image that was built: the same manifest digest, the entry point of the chart's containers.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import binaries
from tests.support.ports import free_port

pytestmark = pytest.mark.binaries


@contextlib.contextmanager
def registry(crane: Path) -> Iterator[str]:
    """A registry on 127.0.0.1 (crane's in-memory one), gone when the block ends."""
    address = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [str(crane), "registry", "serve", "--address", address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(100):  # listening within a few seconds
            done = subprocess.run(
                [str(crane), "catalog", address], capture_output=True, check=False
            )
            if done.returncode == 0:
                break
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_drivers_archive_pushes_to_a_registry_as_the_image_built(tmp_path: Path) -> None:
    crane = binaries.built("build-crane.sh")
    images = binaries.built("build-images.sh", "DRA_GPU_IMAGES_DIR")
    names = json.loads((images / "images.json").read_text())
    assert names["dra-gpu.tar"] == "ghcr.io/dra-gpu/dra-gpu:0.1.0"  # the chart's default image
    layout = tmp_path / "layout"
    with tarfile.open(images / "dra-gpu.tar") as archive:  # docs/install.md: untar, then push
        archive.extractall(layout, filter="data")
    (built,) = json.loads((layout / "index.json").read_text())["manifests"]
    with registry(crane) as address:
        target = f"{address}/dra-gpu/dra-gpu:0.1.0"
        pushed = subprocess.run(
            [str(crane), "push", str(layout), target], capture_output=True, text=True, check=False
        )
        assert pushed.returncode == 0, pushed.stderr
        digest = subprocess.run(
            [str(crane), "digest", target], capture_output=True, text=True, check=True
        ).stdout.strip()
        config = json.loads(
            subprocess.run(
                [str(crane), "config", target], capture_output=True, text=True, check=True
            ).stdout
        )
    assert digest == built["digest"]
    assert config["config"]["Entrypoint"] == ["dra-gpu"]

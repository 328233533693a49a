"""The built tools tests run, each from where the repository builds it, for marked tests only.

helm and the control plane binaries: ``make kubebins`` (``dra_gpu.testing.default_bin_dir``);
another Kubernetes version's: ``kubebins`` (the same script, told the version).
promtool (and prometheus): Debian's package, unpacked by ``hack/build-prometheus.sh``. The
oracles (celref, nvmlref) and the node's containerd and images: their ``hack/build-*.sh``,
which build into the cache, or find the build there, and print its path on the last line.

Owns: locating a tool (an explicit directory from the environment first, else its build
script) and asking ``lanes.require`` before handing it out.
Must not: decide which tests may run (``lanes``), or run the tools.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dra_gpu.testing import default_bin_dir
from tests.support import lanes

ROOT = Path(__file__).resolve().parents[2]


def built(
    script: str,
    variable: str | None = None,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """What ``hack/<script>`` builds (or finds in the cache): the path on its last line, or the
    directory the environment variable ``variable`` names. ``env`` is added to the script's
    environment (which version to build)."""
    lanes.require(f"the build of hack/{script}")
    if variable and (explicit := os.environ.get(variable)):
        return Path(explicit)
    result = subprocess.run(
        [str(ROOT / "hack" / script)],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/{script} failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def kubebins(version: str) -> Path:
    """The directory of Kubernetes ``version``'s binaries (``v1.36.3``: the kubelet, kubectl,
    the control plane's), which ``hack/build-kubebins.sh`` builds into its per-version cache or
    finds there: another version than the session's (``default_bin_dir``), e.g. an older
    kubelet to upgrade from. Cold, the build takes about 13 minutes on 2 cores."""
    cache = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    directory = cache / "bin" / version
    return built(
        "build-kubebins.sh", env={"K8S_VERSION": version, "DRA_GPU_BIN_DIR": str(directory)}
    )


def previous_release(commit: str) -> Path:
    """The directory of an earlier release of the project (``hack/build-previous-release.py``):
    its tree (``tree/``, its chart at ``tree/charts/dra-gpu``) and its image renamed
    (``dra-gpu.tar``, the name in ``images.json``), built from ``commit`` of this repository's
    history into the cache or found there (cold: about a minute, most of it the image's
    dependencies)."""
    lanes.require("the build of hack/build-previous-release.py")
    result = subprocess.run(
        [str(ROOT / "hack" / "build-previous-release.py"), commit],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/build-previous-release.py failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def pinned_kubernetes(minor: int) -> str | None:
    """The Kubernetes version of ``minor`` (36: ``v1.36.3``) that the repository pins (a
    committed wrapper module, ``hack/kubebins/<version>``), or None if it pins none."""
    pinned = [path.name for path in (ROOT / "hack" / "kubebins").glob(f"v1.{minor}.*")]
    return max(pinned, key=lambda v: int(v.rsplit(".", 1)[1]), default=None)


def prometheus_bin() -> Path:
    """The directory of prometheus and promtool (``hack/build-prometheus.sh``, or
    ``DRA_GPU_PROMETHEUS_DIR``)."""
    return built("build-prometheus.sh", "DRA_GPU_PROMETHEUS_DIR") / "bin"


def helm() -> Path:
    """The helm that ``make kubebins`` builds for the pinned Kubernetes version."""
    lanes.require("helm")
    path = default_bin_dir() / "helm"
    assert path.exists(), f"{path} is missing: build it with `make kubebins`"
    return path

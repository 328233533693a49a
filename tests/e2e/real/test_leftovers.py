"""Real nodes leave nothing on the host: not after ``cluster_down`` (``make cluster-down``), and
not after a killed run — mounts, processes, network interfaces and cgroups compared with what
was there before. A killed run's cgroups are empty directories the kernel cannot remove by
itself; the next start of a node removes them (``RealNode.start``)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from dra_gpu.testing import ControlPlane, NodeRuntime, cluster_down, cluster_up, eventually
from dra_gpu.testing._node import _hierarchies, _remove_orphaned_cgroups


def mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def interfaces() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def cgroups_of(pid: int) -> list[Path]:
    return [p for h in _hierarchies() for p in h.glob(f"dra-gpu.{pid}.*")]


def in_pid_namespace(namespace: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def node_namespaces(state: Path) -> list[str]:
    """The PID namespaces of the cluster's nodes, read from their first processes."""
    found = []
    for unshare in Path("/proc").iterdir():
        if not unshare.name.isdigit():
            continue
        try:
            cmdline = (unshare / "cmdline").read_bytes()
            if b"_node_init.py" in cmdline and str(state).encode() in cmdline:
                found.append(os.readlink(unshare / "ns" / "pid"))
        except OSError:
            continue
    return sorted(set(found) - {os.readlink("/proc/self/ns/pid")})


def start(state: Path, control_plane: ControlPlane, runtime: NodeRuntime) -> int:
    cluster_up(state, control_plane.bin_dir, ["node-01", "node-02"], runtime=runtime)
    return int((state / "supervisor.pid").read_text())


async def test_cluster_down_leaves_nothing(
    control_plane: ControlPlane, node_runtime: NodeRuntime, tmp_path: Path
) -> None:
    before_mounts, before_links = mounts(), interfaces()
    state = tmp_path / "cluster"
    supervisor = start(state, control_plane, node_runtime)
    namespaces = node_namespaces(state)
    assert len(namespaces) == 2, "a PID namespace per node"
    assert cgroups_of(supervisor)
    assert cluster_down(state)
    assert all(in_pid_namespace(ns) == [] for ns in namespaces)
    assert cgroups_of(supervisor) == []
    assert mounts() == before_mounts
    assert interfaces() == before_links


async def test_a_killed_run_leaves_only_cgroups_that_the_next_start_removes(
    control_plane: ControlPlane, node_runtime: NodeRuntime, tmp_path: Path
) -> None:
    before_mounts, before_links = mounts(), interfaces()
    state = tmp_path / "cluster"
    supervisor = start(state, control_plane, node_runtime)
    namespaces = node_namespaces(state)
    os.kill(supervisor, signal.SIGKILL)
    # Its nodes die with it (parent-death signal, then the PID namespace goes with its init).
    await eventually(
        lambda: all(in_pid_namespace(ns) == [] for ns in namespaces),
        timeout=60,
        what="every process of the nodes gone",
    )
    assert mounts() == before_mounts
    assert interfaces() == before_links
    assert cgroups_of(supervisor), "a killed run cannot remove its cgroups"
    _remove_orphaned_cgroups()  # what the next RealNode.start does first
    assert cgroups_of(supervisor) == []
    assert not cluster_down(state)

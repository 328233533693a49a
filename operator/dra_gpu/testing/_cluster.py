"""A local cluster in the background, for people and scripts (``make cluster-up``/``-down``).

``cluster_up`` starts a detached supervisor process (``python -m dra_gpu.testing serve``) that
runs the control plane and real nodes (``RealNode``) until it gets SIGTERM, and returns once the
supervisor wrote ``env.sh``. A second ``cluster_up`` finds the live supervisor and reuses it.
``cluster_down`` signals the supervisor, which stops the nodes and then every control plane
process it started; they also die with the supervisor if it is killed.

``main`` is that CLI. Like ``dra-gpu``'s, it ends a failure at the edges with one line that
says what to do and an exit code of ``dra_gpu.exits`` (missing binaries 3, a cluster that does
not answer 4); the traceback only with ``--log-level DEBUG``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from dra_gpu import kube
from dra_gpu.exits import ExitCode, OneLineParser
from dra_gpu.testing._control_plane import ControlPlane, ControlPlaneError
from dra_gpu.testing._node import NodeRuntime, RealNode, start_nodes
from dra_gpu.testing._prometheus import Prometheus

DEFAULT_NODES = ("node-01", "node-02", "node-03")
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
"""What ``ControlPlane.start`` needs; checked before a supervisor is started for nothing."""
PROG = "python -m dra_gpu.testing"
log = logging.getLogger("dra_gpu.testing")


class MissingBinaries(ControlPlaneError):
    """A control plane binary is not in the bin directory: build it, or point elsewhere."""


@dataclasses.dataclass(frozen=True)
class ClusterEnv:
    """What a shell or a script needs to use a running local cluster."""

    kubeconfig: Path
    nodes_dir: Path
    """One directory per node: its state (``<node>/root`` is its view of ``/run``,
    ``/var/lib``, ``/var/log``)."""
    bin_dir: Path

    def exports(self) -> str:
        return (
            f"export KUBECONFIG={self.kubeconfig}\n"
            f"export DRA_GPU_NODES_DIR={self.nodes_dir}\n"
            f'export PATH={self.bin_dir}:"$PATH"\n'
        )

    @classmethod
    def parse(cls, text: str) -> ClusterEnv:
        values: dict[str, str] = {}
        for line in text.splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            values[key] = value
        return cls(
            Path(values["KUBECONFIG"]),
            Path(values["DRA_GPU_NODES_DIR"]),
            Path(values["PATH"].split(":", 1)[0]),
        )


def _alive(pid_file: Path) -> int | None:
    """The supervisor's PID if it runs (a zombie, killed but not yet reaped, does not)."""
    try:
        pid = int(pid_file.read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return None if stat.rsplit(")", 1)[1].split()[0] == "Z" else pid


def cluster_up(
    state_dir: Path,
    bin_dir: Path,
    nodes: Sequence[str] = DEFAULT_NODES,
    timeout: float = 300,
    *,
    runtime: NodeRuntime | None,
    prometheus_bin: Path | None = None,
) -> ClusterEnv:
    """The running cluster of ``state_dir``, or a new one whose nodes run ``runtime``; with
    ``prometheus_bin``, a Prometheus beside it (``prometheus_of``)."""
    state_dir = state_dir.resolve()
    env_file, pid_file = state_dir / "env.sh", state_dir / "supervisor.pid"
    if _alive(pid_file) and env_file.exists():
        return ClusterEnv.parse(env_file.read_text())
    for name in CONTROL_PLANE_BINARIES:
        if not os.access(bin_dir / name, os.X_OK):
            raise MissingBinaries(
                f"{bin_dir / name} is missing: build the control plane with `make kubebins`, "
                "or point --bin-dir (or DRA_GPU_BIN_DIR) at a directory that has it"
            )
    if runtime is None:
        raise MissingBinaries(
            "real nodes need containerd and the images: build them with `make nodebins images` "
            "and pass --containerd-dir and --images-dir (make cluster-up does)"
        )
    runtime.check()
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    log_file = state_dir / "supervisor.log"
    with log_file.open("wb") as supervisor_log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_gpu.testing",
                "serve",
                "--state-dir",
                str(state_dir),
                "--bin-dir",
                str(bin_dir),
                "--nodes",
                ",".join(nodes),
                "--runtime",
                runtime.to_json(),
                *(("--prometheus-bin", str(prometheus_bin)) if prometheus_bin else ()),
            ],
            stdout=supervisor_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not env_file.exists():
        if proc.poll() is not None:
            # The supervisor's last line is its one-line reason (``main``).
            lines = log_file.read_text(errors="replace").split("\n")
            last = next((line for line in reversed(lines) if line.strip()), "(empty log)")
            raise ControlPlaneError(
                f"local cluster failed to start: {last.removeprefix(PROG + ' serve: ')}; "
                f"full log: {log_file}"
            )
        if time.monotonic() > deadline:
            cluster_down(state_dir)
            raise ControlPlaneError(f"local cluster not ready after {timeout:.0f}s; see {log_file}")
        time.sleep(0.3)
    return ClusterEnv.parse(env_file.read_text())


def cluster_down(state_dir: Path, timeout: float = 60) -> bool:
    """Stop the supervisor of ``state_dir`` (and with it the cluster); True if one was
    running."""
    pid = _alive(state_dir / "supervisor.pid")
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(state_dir / "supervisor.pid") and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(state_dir / "supervisor.pid"):
            # Its control plane children get SIGKILL with it (parent-death signal).
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(state_dir, ignore_errors=True)
    return pid is not None


def prometheus_of(state_dir: Path) -> Prometheus | None:
    """The running cluster's Prometheus (scraping what ``set_targets`` names), if it has one."""
    url_file = state_dir / "prometheus" / "url"
    if not url_file.exists():
        return None
    port = int(url_file.read_text().rsplit(":", 1)[1])
    return Prometheus(state_dir / "prometheus", Path(), port=port)


def serve(
    state_dir: Path,
    bin_dir: Path,
    nodes: Sequence[str],
    runtime: NodeRuntime,
    prometheus_bin: Path | None = None,
) -> None:
    """The supervisor: control plane, nodes (and Prometheus) until SIGTERM or SIGINT."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    cp = ControlPlane(bin_dir, state_dir / "control-plane")
    print(f"starting control plane from {bin_dir}", flush=True)
    started: list[RealNode] = []
    prometheus: Prometheus | None = None
    try:
        # From this (main) thread, whose exit the processes' parent-death signal watches.
        cp.start()
        print(f"control plane ready at {cp.server}", flush=True)
        started = [
            RealNode(cp, name, index, state_dir / "nodes" / name, runtime)
            for index, name in enumerate(nodes, start=1)
        ]
        start_nodes(started)
        print(f"nodes {', '.join(nodes)} ready", flush=True)
        if prometheus_bin is not None:
            prometheus = Prometheus(state_dir / "prometheus", prometheus_bin, interval=5.0)
            prometheus.start()
            (state_dir / "prometheus" / "url").write_text(prometheus.url)
            print(f"prometheus ready at {prometheus.url}", flush=True)
        _write_env(state_dir, ClusterEnv(cp.kubeconfig, state_dir / "nodes", cp.bin_dir))
        stopping.wait()
    finally:
        if prometheus is not None:
            prometheus.stop()
        for node in reversed(started):
            node.stop()
        cp.stop()
        print("stopped", flush=True)


def _write_env(state_dir: Path, env: ClusterEnv) -> None:
    tmp = state_dir / "env.sh.tmp"
    tmp.write_text(env.exports())
    tmp.rename(state_dir / "env.sh")


def main(argv: Sequence[str] | None = None) -> int:
    from dra_gpu.testing._control_plane import default_bin_dir

    parser = OneLineParser(
        prog=PROG, description="A local cluster in the background (make cluster-up/-down)."
    )
    parser.add_argument("command", choices=["up", "down", "serve"])
    parser.add_argument("--state-dir", type=Path, default=Path(".run/cluster"))
    parser.add_argument(
        "--bin-dir", type=Path, default=None, help="control plane binaries [env DRA_GPU_BIN_DIR]"
    )
    parser.add_argument("--nodes", default=",".join(DEFAULT_NODES))
    parser.add_argument(
        "--containerd-dir", type=Path, help="real nodes: hack/build-containerd.sh's output"
    )
    parser.add_argument("--images-dir", type=Path, help="real nodes: hack/build-images.sh's output")
    parser.add_argument(
        "--prometheus-bin", type=Path, help="a Prometheus beside the cluster (its bin directory)"
    )
    parser.add_argument("--runtime", help=argparse.SUPPRESS)  # up -> serve
    parser.add_log_level()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    bin_dir = (args.bin_dir or default_bin_dir()).resolve()
    nodes = [n for n in args.nodes.split(",") if n]
    try:
        if args.command == "serve":
            if not args.runtime:
                parser.error("serve is started by up")
            runtime = NodeRuntime.from_json(args.runtime)
            serve(args.state_dir, bin_dir, nodes, runtime, args.prometheus_bin)
        elif args.command == "up":
            runtime = None
            if args.containerd_dir or args.images_dir:
                if not (args.containerd_dir and args.images_dir):
                    parser.error("--containerd-dir and --images-dir go together (real nodes)")
                runtime = NodeRuntime.from_builds(bin_dir, args.containerd_dir, args.images_dir)
            env = cluster_up(
                args.state_dir, bin_dir, nodes, runtime=runtime, prometheus_bin=args.prometheus_bin
            )
            asyncio.run(_answers(env, args.state_dir))
            print(env.exports(), end="")
        else:
            print("stopped" if cluster_down(args.state_dir) else "no local cluster was running")
    except (ControlPlaneError, kube.ConfigError, kube.Unreachable, kube.Refused) as exc:
        log.debug("the failure in full:", exc_info=exc)
        print(f"{PROG} {args.command}: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        if isinstance(exc, MissingBinaries | kube.ConfigError):
            return ExitCode.CONFIG
        if isinstance(exc, kube.Unreachable):
            return ExitCode.UNREACHABLE
        return ExitCode.REFUSED if isinstance(exc, kube.Refused) else ExitCode.FAILED
    return ExitCode.OK


async def _answers(env: ClusterEnv, state_dir: Path) -> None:
    """A reused cluster whose API server is gone (killed control plane, reboot) is refused in
    words, rather than handed out; a fresh one answers at once."""
    async with await kube.Kube.connect(env.kubeconfig, source=f"{state_dir}/env.sh") as api:
        try:
            await api.probe()
        except kube.Unreachable as exc:
            raise kube.Unreachable(
                exc.server,
                f"the local cluster of {state_dir}",
                f"{exc.reason}; stop it with `{PROG} down --state-dir {state_dir}` "
                "(make cluster-down) and start it again",
            ) from exc

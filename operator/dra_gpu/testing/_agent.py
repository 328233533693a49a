"""dra-gpu's processes as real processes, for tests and ``make run``.

Runs ``dra-gpu agent`` and ``dra-gpu controller`` exactly as the chart does (same flags), the
agent registered with a real node's kubelet (``AgentProcess.on``) and writing its CDI specs
where that node's containerd reads them, so tests can kill them with SIGKILL, restart them, and
look at the files they left.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from dra_gpu import DEFAULT_DRIVER_NAME
from dra_gpu.testing._control_plane import _tail, dying_with_parent, free_port
from dra_gpu.testing._node import RealNode

PORT_ATTEMPTS = 3


class _Stateful:
    state_dir: Path
    """Where the process keeps its log: a (positional) field of each subclass."""


@dataclasses.dataclass(kw_only=True)
class DraGpuProcess(_Stateful):
    """A ``dra-gpu`` process; ``start()``/``astart()`` return once it answers ``/readyz``."""

    health_port: int = 0
    metrics_port: int = 0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Added to this process's environment (``DRA_GPU_FAILPOINTS`` for crash tests)."""
    run_as: int | None = None
    """Run under this uid and gid, without supplementary groups and without ``HOME``, ``USER``
    and ``LOGNAME`` (an image's user that has no passwd entry); default: ours."""
    _popen: subprocess.Popen[bytes] | None = None
    _picked_ports: bool = False
    _log_start: int = 0

    name = "dra-gpu"
    """Names the log file in ``state_dir``."""

    def args(self) -> list[str]:
        raise NotImplementedError

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen and self._popen.poll() is None else None

    @property
    def exited(self) -> bool:
        """Started and gone since (killed, crashed or stopped)."""
        return self._popen is not None and self._popen.poll() is not None

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait, blocking; from async code use ``astart``."""
        for attempt in range(PORT_ATTEMPTS):
            self.spawn()
            try:
                return self.wait_ready(timeout)
            except RuntimeError:
                if not self._lost_port_race(attempt):
                    raise

    async def astart(self, ready_within: float = 60.0) -> None:
        for attempt in range(PORT_ATTEMPTS):
            self.spawn()
            try:
                return await asyncio.to_thread(self.wait_ready, ready_within)
            except RuntimeError:
                if not self._lost_port_race(attempt):
                    raise

    def _lost_port_race(self, attempt: int) -> bool:
        """A port we picked was taken before the process bound it (many processes start at
        once, and outgoing connections use the same range): pick others and try again."""
        if not self._picked_ports or attempt + 1 == PORT_ATTEMPTS:
            return False
        with self.log_file.open("rb") as log:
            log.seek(self._log_start)
            if b"address already in use" not in log.read():
                return False
        self.health_port = self.metrics_port = 0
        return True

    def spawn(self) -> None:
        if not self.health_port and not self.metrics_port:
            self._picked_ports = True
        if not self.health_port:
            self.health_port = free_port()
        if not self.metrics_port:
            self.metrics_port = free_port()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        with self.log_file.open("ab") as log:
            command = [
                *self.args(),
                f"--health-port={self.health_port}",
                f"--metrics-port={self.metrics_port}",
                *self.extra_args,
            ]
            env = {**os.environ, **self.env}
            command = dying_with_parent(command)
            if self.run_as is not None:
                command = as_user(self.run_as, command)
                for variable in ("HOME", "USER", "LOGNAME"):
                    env.pop(variable, None)
            self._popen = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._popen is None or self._popen.poll() is not None:
                raise RuntimeError(f"{self} exited; log:\n{_tail(self.log_file, 40)}")
            if self.probe("/readyz") == 200:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self} not ready; log:\n{_tail(self.log_file, 40)}")

    def probe(self, path: str) -> int | None:
        try:
            url = f"http://127.0.0.1:{self.health_port}{path}"
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def metrics(self, *names: str) -> str:
        """The ``/metrics`` text; with ``names``, of those metrics only (``name[]=``)."""
        query = urllib.parse.urlencode([("name[]", name) for name in names])
        url = f"http://127.0.0.1:{self.metrics_port}/metrics" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read()).decode()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait, as the kubelet stops a container; returns the exit code."""
        if self._popen is None or self._popen.poll() is not None:
            return None if self._popen is None else self._popen.returncode
        self._popen.send_signal(signal.SIGTERM)
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            return self._popen.wait()

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as in a crash or an OOM kill."""
        if self._popen is not None and self._popen.poll() is None:
            self._popen.kill()
            self._popen.wait()

    def restart(self, timeout: float = 60.0) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        self.start(timeout)


@dataclasses.dataclass
class AgentProcess(DraGpuProcess):
    """One node agent, run as the chart's DaemonSet runs it (same flags)."""

    node: str
    kubeconfig: Path
    kubelet_dir: Path
    state_dir: Path
    """Holds ``cdi/``, ``checkpoint/`` and ``agent.log``."""
    profile: Path | None = None
    backend: str = "simulated"
    driver: str = DEFAULT_DRIVER_NAME
    resync_seconds: float = 30.0
    cdi: Path | None = None
    """Where the CDI specs go (the node's ``/var/run/cdi``, where containerd reads them);
    ``state_dir / "cdi"`` when not given."""
    pod_uid: str = ""
    """As the chart's pod passes its UID (``--pod-uid``): sockets of its own, beside another
    agent's, as in a rolling update. Empty: the driver's fixed socket names."""
    name = "agent"

    @classmethod
    def on(cls, node: RealNode, kubeconfig: Path, state_dir: Path, **options: Any) -> AgentProcess:
        """The agent of a real node, as its DaemonSet pod would run there: registered with the
        node's kubelet, its CDI specs where the node's containerd reads them."""
        return cls(node.name, kubeconfig, node.kubelet_dir, state_dir, cdi=node.cdi_dir, **options)

    def __str__(self) -> str:
        return f"agent of {self.node}"

    @property
    def cdi_dir(self) -> Path:
        return self.cdi if self.cdi is not None else self.state_dir / "cdi"

    @property
    def checkpoint_dir(self) -> Path:
        return self.state_dir / "checkpoint"

    @property
    def checkpoint_file(self) -> Path:
        return self.checkpoint_dir / "checkpoint.json"

    def args(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "dra_gpu",
            "agent",
            f"--node-name={self.node}",
            f"--driver-name={self.driver}",
            f"--backend={self.backend}",
            f"--kubelet-dir={self.kubelet_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--checkpoint-dir={self.checkpoint_dir}",
            f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--resync-seconds={self.resync_seconds}",
        ]
        if self.pod_uid:
            args.append(f"--pod-uid={self.pod_uid}")
        return [*args, f"--profile={self.profile}"] if self.profile is not None else args


@dataclasses.dataclass
class ControllerProcess(DraGpuProcess):
    """One controller replica, run as the chart's Deployment runs it (same flags)."""

    identity: str
    kubeconfig: Path
    state_dir: Path
    namespace: str = "default"
    lease_seconds: int = 15
    resync_seconds: float = 30.0
    driver: str = DEFAULT_DRIVER_NAME
    webhook_port: int = 0
    """The admission webhook's port (0: none); its certificate is self-issued into the
    Secret ``dra-gpu-webhook-tls`` of ``namespace``."""
    name = "controller"

    def __str__(self) -> str:
        return f"controller {self.identity}"

    def metric_value(self, name: str) -> float:
        """The value of an unlabelled metric (0 until it appears)."""
        for line in self.metrics().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        return 0.0

    def leads(self) -> bool:
        return self.metric_value("dra_gpu_controller_leader") == 1.0

    def reconciles(self) -> float:
        return self.metric_value("dra_gpu_controller_reconciles_total")

    def args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dra_gpu",
            "controller",
            f"--identity={self.identity}",
            f"--driver-name={self.driver}",
            f"--namespace={self.namespace}",
            f"--lease-seconds={self.lease_seconds}",
            f"--resync-seconds={self.resync_seconds}",
            f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
        ]


def as_user(uid: int, argv: list[str]) -> list[str]:
    """``argv`` run as ``uid`` (gid the same, no supplementary groups), as a container's user.
    It keeps one capability, reading any file: the test's interpreter may live in root's
    closed home. The uid switch comes first: it would clear a parent-death signal set before."""
    return [
        *("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
        *("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"),
        *argv,
    ]

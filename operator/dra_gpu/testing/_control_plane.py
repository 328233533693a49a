"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler, built from the upstream Go modules by ``hack/build-kubebins.sh``.

The handle owns a temporary directory (PKI, tokens, kubeconfig, data, logs) and every process
it starts. Processes are started from the calling thread with a parent-death signal, so they
die with the test run even when it is killed; ``stop()`` terminates exactly those PIDs, in
reverse start order. Nothing here listens on anything but 127.0.0.1 and unix sockets in the
workdir.

The API server reaches the cluster (kubelets, and pods: webhooks and aggregated APIs behind
Services, ``services/proxy``, ``pods/proxy``) as a real one does through Konnectivity: its
``cluster`` egress is an HTTP CONNECT proxy (``_egress.py``, on ``egress_socket``) that routes by
the table the nodes add themselves to (``route_to_node``) into the nodes' network namespaces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from dra_gpu.testing import _egress
from dra_gpu.testing._lifecycle import StartStop

DEFAULT_K8S_VERSION = "v1.37.2"
# Addresses of the cluster's own namespaces only (RFC 2544's benchmarking range: neither private
# nor public); they never leave this machine's loopback and the nodes' namespaces.
SERVICE_CIDR = "198.18.0.0/24"
FIRST_SERVICE_IP = "198.18.0.1"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


def default_bin_dir(version: str = DEFAULT_K8S_VERSION) -> Path:
    """Where ``hack/build-kubebins.sh`` caches the binaries of one Kubernetes version."""
    if explicit := os.environ.get("DRA_GPU_BIN_DIR"):
        return Path(explicit)
    cache = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    return cache / "bin" / os.environ.get("K8S_VERSION", version)


def free_port() -> int:
    """A port free on 127.0.0.1 now, below the kernel's range for outgoing connections: a port
    the kernel hands out (bind to 0) is one an outgoing connection may take before the process
    it is meant for binds it (seen: kube-scheduler's, between picking and starting)."""
    low = _ephemeral_low()
    for _ in range(1000):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneError(f"no free port below {low} on 127.0.0.1")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` wrapped so the process gets SIGKILL when this one exits (``_pdeathsig.py``):
    a killed test run or ``make cluster-up`` supervisor never leaves a process behind."""
    launcher = str(Path(__file__).with_name("_pdeathsig.py"))
    return [sys.executable, launcher, str(os.getpid()), *argv]


def spawn_logged(argv: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """``argv`` started dying with this process, its output appended to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            dying_with_parent(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclasses.dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())


class ControlPlane(StartStop):
    """Start with ``with ControlPlane() as cp:`` (or ``start()``/``stop()``).

    ``cp.kubeconfig`` is an admin kubeconfig (static token in ``system:masters``);
    ``cp.logs_dir`` holds one log file per component.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        *,
        ready_timeout: float = 120.0,
    ) -> None:
        self.bin_dir = bin_dir or default_bin_dir()
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="dra-gpu-cp-"))
        self.ready_timeout = ready_timeout
        self.ports = Ports.pick()
        self.token = secrets.token_hex(16)
        self._processes: list[_Process] = []
        self._node_gateway: subprocess.Popen[bytes] | None = None
        self._routes_lock = threading.Lock()

    # ---- paths ---------------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def egress_socket(self) -> Path:
        """The API server's ``cluster`` egress: the HTTP CONNECT proxy into the nodes."""
        return self.workdir / "egress.sock"

    @property
    def egress_routes(self) -> Path:
        """The proxy's routing table (``_egress.write_routes``), re-read per connection."""
        return self.workdir / "egress-routes.json"

    @property
    def node_gateway(self) -> Path:
        """A unix socket that reaches the API server: nodes live in network namespaces of
        their own, where this machine's loopback is not; their forwarders connect here."""
        return self.workdir / "apiserver.sock"

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(
                f"{path} is missing: build the control plane with hack/build-kubebins.sh "
                f"(or `make kubebins`), or point DRA_GPU_BIN_DIR at a directory that has it"
            )
        return path

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            self.binary(name)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._write_pki()
            self._write_kubeconfig()
            self._start_etcd()
            self._start_egress()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
            self.wait_for_service_account("default")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate every process this handle started, newest first; remove an own workdir."""
        if self._node_gateway is not None:
            _terminate(self._node_gateway)
            self._node_gateway = None
        for proc in reversed(self._processes):
            _terminate(proc.popen)
        self._processes.clear()
        if self._own_workdir and not os.environ.get("DRA_GPU_KEEP_WORKDIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_component(self, name: str) -> None:
        """Stop one component (e.g. ``kube-apiserver``) to test how clients survive it."""
        for proc in self._processes:
            if proc.name == name:
                _terminate(proc.popen)
        self._processes = [p for p in self._processes if p.name != name]

    def restart_apiserver(self) -> None:
        self.stop_component("kube-apiserver")
        self._start_apiserver()

    def route_to_node(self, name: str, address: str, pod_subnet: str, socket: Path) -> None:
        """Route the API server's dials to ``name`` or ``address`` (the node's kubelet, its
        host ports) and to ``pod_subnet`` (its pods) through the node's forwarder at
        ``socket`` (``_egress.py node``); replaces an earlier route of the same node."""
        entry = _egress.NodeRoute(name, address, pod_subnet, str(socket.absolute()))
        with self._routes_lock:
            routes = _egress.read_routes(self.egress_routes)
            _egress.write_routes(self.egress_routes, _egress.with_node(routes, entry))

    def open_node_gateway(self) -> Path:
        """Start (once) the forwarder from ``node_gateway`` to the API server."""
        if self._node_gateway is None or self._node_gateway.poll() is not None:
            self.node_gateway.unlink(missing_ok=True)
            self._node_gateway = spawn_logged(
                [
                    _tool("socat"),
                    # Relative: a unix socket's path has at most 107 bytes.
                    f"UNIX-LISTEN:{self.node_gateway.name},fork,mode=600",
                    f"TCP:127.0.0.1:{self.ports.apiserver}",
                ],
                self.logs_dir / "node-gateway.log",
                cwd=self.workdir,
            )
            deadline = time.monotonic() + 10
            while not self.node_gateway.exists():
                if time.monotonic() > deadline or self._node_gateway.poll() is not None:
                    raise ControlPlaneError(f"socat did not open {self.node_gateway}")
                time.sleep(0.05)
        return self.node_gateway

    def issue_certificate(self, name: str, subject: str) -> tuple[Path, Path]:
        """A client certificate signed by the cluster CA (``/CN=user/O=group``)."""
        key, csr, crt = (self.pki_dir / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        _openssl(self.pki_dir, "genrsa", "-out", key.name, "2048")
        _openssl(self.pki_dir, "req", "-new", "-key", key.name, "-subj", subject, "-out", csr.name)
        _openssl(
            self.pki_dir,
            *("x509", "-req", "-in", csr.name, "-CA", "ca.crt", "-CAkey", "ca.key"),
            *("-CAcreateserial", "-days", "30", "-out", crt.name),
        )
        return crt, key

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._processes if p.popen.poll() is None}

    # ---- components ----------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> _Process:
        return self._spawn_argv(name, [str(self.binary(name)), *args])

    def _spawn_argv(self, name: str, argv: list[str]) -> _Process:
        log = self.logs_dir / f"{name}.log"
        popen = spawn_logged(argv, log, cwd=self.workdir)
        proc = _Process(name, popen, log)
        self._processes.append(proc)
        return proc

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        proc = self._spawn(
            "etcd",
            [
                "--name=node0",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=node0={peer}",
                "--unsafe-no-fsync",
                "--auto-compaction-retention=1",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_http(proc, f"{client}/health", lambda body: b'"health":"true"' in body)

    def _start_egress(self) -> None:
        """The proxy behind the API server's ``cluster`` egress (see ``egress_socket``)."""
        self.egress_socket.unlink(missing_ok=True)
        proc = self._spawn_argv(
            "egress",
            [
                sys.executable,
                str(Path(_egress.__file__)),
                "host",
                # Relative (the cwd is the workdir): a unix socket's path has at most 107 bytes.
                f"--listen={self.egress_socket.name}",
                f"--routes={self.egress_routes}",
            ],
        )
        deadline = time.monotonic() + self.ready_timeout
        while not self.egress_socket.exists():
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"the egress proxy did not open {self.egress_socket}; "
                    f"last lines of {proc.log}:\n{_tail(proc.log)}"
                )
            time.sleep(0.05)

    def _write_egress_config(self) -> Path:
        """``cluster`` (kubelets, Services' endpoints, proxy subresources) through the egress
        proxy; ``controlplane`` (webhooks by URL) and ``etcd`` stay direct."""
        config = self.workdir / "egress-selector.json"
        selection = {
            "name": "cluster",
            "connection": {
                "proxyProtocol": "HTTPConnect",
                # Relative to the API server's cwd, the workdir (107 bytes at most).
                "transport": {"uds": {"udsName": self.egress_socket.name}},
            },
        }
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "apiserver.k8s.io/v1beta1",
                    "kind": "EgressSelectorConfiguration",
                    "egressSelections": [selection],
                },
                indent=2,
            )
        )
        return config

    def _start_apiserver(self) -> None:
        pki = self.pki_dir
        egress_config = self._write_egress_config()
        proc = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                # A loopback advertise address is only valid without the endpoint reconciler.
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.ca_file}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                # Webhooks (and aggregated APIs) behind a Service dial a ready endpoint's pod
                # IP, as services/proxy does: the nodes have no kube-proxy for ClusterIPs.
                "--enable-aggregator-routing=true",
                f"--egress-selector-config-file={egress_config}",
                "--v=1",
            ],
        )
        self._wait_http(proc, f"{self.server}/readyz", lambda body: body.strip() == b"ok")

    def _start_controller_manager(self) -> None:
        pki = self.pki_dir
        proc = self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.controller_manager}",
                f"--cert-dir={pki / 'kcm'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                # All controllers, node lifecycle included (the nodes' kubelets renew their
                # leases: not-ready taint removed, loss detected).
                "--controllers=*",
                "--v=1",
            ],
        )
        self._wait_http(
            proc,
            f"https://127.0.0.1:{self.ports.controller_manager}/healthz",
            lambda body: body.strip() == b"ok",
        )

    def _start_scheduler(self) -> None:
        config = self.workdir / "scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        proc = self._spawn(
            "kube-scheduler",
            [
                f"--config={config}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.scheduler}",
                f"--cert-dir={self.pki_dir / 'scheduler'}",
                "--v=1",
            ],
        )
        self._wait_http(
            proc,
            f"https://127.0.0.1:{self.ports.scheduler}/healthz",
            lambda body: body.strip() == b"ok",
        )

    # ---- readiness -----------------------------------------------------------------------

    def _wait_http(self, proc: _Process, url: str, ok: object) -> None:
        deadline = time.monotonic() + self.ready_timeout
        last = ""
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with code {proc.popen.returncode} while starting; "
                    f"last lines of {proc.log}:\n{_tail(proc.log)}"
                )
            try:
                body = self._get(url)
                if callable(ok) and ok(body):
                    return
                last = body.decode(errors="replace")[-300:]
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{proc.name} not ready at {url} after {self.ready_timeout:.0f}s ({last}); "
            f"last lines of {proc.log}:\n{_tail(proc.log)}"
        )

    def _get(self, url: str) -> bytes:
        ctx = None
        headers = {}
        if url.startswith("https://"):
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            if not url.startswith(self.server):
                # Controller-manager and scheduler serve self-signed certificates.
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            return bytes(exc.read())

    def api_get(self, path: str) -> dict[str, object]:
        """GET an API path as admin and decode the JSON (small checks and waits)."""
        body = self._get(f"{self.server}{path}")
        result: dict[str, object] = json.loads(body)
        return result

    def apiserver_metrics(self) -> str:
        """The API server's ``/metrics`` page, read as admin (benchmarks: over 2 MB of text, and
        its counters start at 0 again with each ``restart_apiserver``)."""
        return self._get(f"{self.server}/metrics").decode()

    def wait_for_service_account(self, name: str, namespace: str = "default") -> None:
        """Pods are rejected until the controller-manager created the namespace's SA."""
        deadline = time.monotonic() + self.ready_timeout
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        while time.monotonic() < deadline:
            if self.api_get(path).get("kind") == "ServiceAccount":
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"ServiceAccount {namespace}/{name} did not appear")

    # ---- credentials ---------------------------------------------------------------------

    def _write_pki(self) -> None:
        pki = self.pki_dir
        pki.mkdir(parents=True, exist_ok=True)

        def openssl(*args: str) -> None:
            _openssl(pki, *args)

        openssl("genrsa", "-out", "ca.key", "2048")
        openssl(
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=dra-gpu-test-ca",
            "-days",
            "30",
            "-out",
            "ca.crt",
        )
        (pki / "apiserver.ext").write_text(
            "subjectAltName=IP:127.0.0.1,IP:"
            + FIRST_SERVICE_IP
            + ",DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            "extendedKeyUsage=serverAuth\n"
        )
        openssl("genrsa", "-out", "apiserver.key", "2048")
        openssl(
            "req",
            "-new",
            "-key",
            "apiserver.key",
            "-subj",
            "/CN=kube-apiserver",
            "-out",
            "apiserver.csr",
        )
        openssl(
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            "apiserver.ext",
            "-out",
            "apiserver.crt",
        )
        openssl("genrsa", "-out", "sa.key", "2048")
        openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.issue_certificate(
            "apiserver-kubelet-client", "/CN=kube-apiserver-kubelet-client/O=system:masters"
        )
        (pki / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')

    def _write_kubeconfig(self) -> None:
        write_kubeconfig(self.kubeconfig, self.server, self.ca_file, "admin", {"token": self.token})


def write_kubeconfig(
    path: Path, server: str, ca_file: Path, user: str, credentials: dict[str, str]
) -> None:
    """A kubeconfig of one cluster and one user, readable by its owner only."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


def _terminate(popen: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if popen.poll() is not None:
        return
    popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise ControlPlaneError(f"{name} is missing: install it (Debian package: {name})")
    return path


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"

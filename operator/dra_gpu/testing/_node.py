"""Real nodes: the upstream kubelet on containerd (CDI on), Debian's runc and CNI plugins.

Each node lives in PID, mount and network namespaces of its own (``unshare``), under a state
directory this handle owns; ``_node_init.py`` is its first process. Nothing on the host
changes: the node's ``/run``, ``/var/lib`` and ``/var/log`` and the sysctl files the kubelet
writes are bind mounts of the state directory inside its mount namespace; its addresses
(``192.0.2.N`` for the node, the ``kubernetes`` Service address for pods) are on the loopback
of its own network namespace; its cgroups sit under one parent of ours, removed at ``stop()``.

How the node and the API server reach each other, both ways through unix sockets (the node's
namespace has no route to this machine's loopback, and the API server no route to the node):

- node -> API server: forwarders in the node listen on ``127.0.0.1:6443`` (the kubelet) and on
  the ``kubernetes`` Service address ``:443`` (pods), and connect to the control plane's
  ``node_gateway`` socket, whose forwarder connects to the API server;
- API server -> node (kubelet: logs, exec, port-forward; pods: webhooks and aggregated APIs
  behind Services, ``services/proxy``, ``pods/proxy``): the API server's ``cluster`` egress is
  the control plane's CONNECT proxy (``_egress.py``), which routes the node's name and address
  and its pod subnet (``ControlPlane.route_to_node``, at ``start()``) to the node's
  ``egress.sock``, where the node's forwarder (``_egress.py node``) dials inside the node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dra_gpu.testing import _egress, _kubelet_checkpoint
from dra_gpu.testing._control_plane import (
    FIRST_SERVICE_IP,
    ControlPlane,
    ControlPlaneError,
    _tail,
    _tool,
    spawn_logged,
    write_kubeconfig,
)
from dra_gpu.testing._kubelet_checkpoint import KubeletClaim
from dra_gpu.testing._lifecycle import StartStop

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What the kubelet writes at start (protectKernelDefaults off): files of ours in the node.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
API_PORT_IN_NODE = 6443
CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")
"""In the node's own /run: a unix socket's path has at most 107 bytes, and a test's state
directory can be longer (the sockets the host reaches are named relative to theirs)."""
EGRESS_SOCKET = "egress.sock"
"""In the node's state directory: the node's end of the API server's egress listens on it
(``_egress.py node``, in the node's network namespace); the control plane's proxy connects."""
KUBELET_PORT = 10250
"""The kubelet's port, in the node's own network namespace (the same on every node)."""


@dataclasses.dataclass(frozen=True)
class NodeRuntime:
    """The binaries and images a node runs: the kubelet (same build as the control plane),
    containerd's directory (``containerd``, ``ctr``, ``containerd-shim-runc-v2``) and the OCI
    archives every node imports at start (no registry: pods use what is imported)."""

    kubelet: Path
    containerd_bin: Path
    images: tuple[Path, ...]
    runc: str = "/usr/sbin/runc"
    cni_bin: str = "/usr/lib/cni"

    @classmethod
    def from_builds(cls, bin_dir: Path, containerd_dir: Path, images_dir: Path) -> NodeRuntime:
        """The kubelet of ``bin_dir`` (``hack/build-kubebins.sh``), containerd of
        ``hack/build-containerd.sh`` and every archive ``hack/build-images.sh`` lists in
        ``images.json``."""
        listed = json.loads((images_dir / "images.json").read_text())
        return cls(
            kubelet=bin_dir / "kubelet",
            containerd_bin=containerd_dir / "bin",
            images=tuple(images_dir / archive for archive in sorted(listed)),
        )

    def pinned(self, directory: Path) -> NodeRuntime:
        """The same runtime with its image archives linked (or copied) into ``directory``: a
        later build of the images prunes old ones from the cache, and the nodes a running test
        session starts still import these."""
        directory.mkdir(parents=True, exist_ok=True)
        kept = []
        for image in self.images:
            copy = directory / image.name
            if not copy.exists():
                try:
                    os.link(image, copy)
                except OSError:  # another filesystem
                    shutil.copyfile(image, copy)
            kept.append(copy)
        return dataclasses.replace(self, images=tuple(kept))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> NodeRuntime:
        fields = json.loads(text)
        return cls(
            kubelet=Path(fields["kubelet"]),
            containerd_bin=Path(fields["containerd_bin"]),
            images=tuple(Path(image) for image in fields["images"]),
            runc=fields["runc"],
            cni_bin=fields["cni_bin"],
        )

    def check(self) -> None:
        wanted = [
            self.kubelet,
            self.containerd_bin / "containerd",
            self.containerd_bin / "ctr",
            self.containerd_bin / "containerd-shim-runc-v2",
            Path(self.runc),
            Path(self.cni_bin) / "bridge",
        ]
        for path in wanted:
            if not os.access(path, os.X_OK):
                raise ControlPlaneError(
                    f"{path} is missing: build the node runtime with `make nodebins` "
                    "(containerd; installs Debian's runc and containernetworking-plugins)"
                )
        for image in self.images:
            if not image.is_file():
                raise ControlPlaneError(f"{image} is missing: build the images with `make images`")
        for tool in ("socat", "unshare", "ip", "mount"):
            _tool(tool)


def _remove_orphaned_cgroups() -> None:
    """Parents named as ``RealNode.cgroup_parent`` whose process is gone: a killed run's."""
    for hierarchy in _hierarchies():
        for parent in hierarchy.glob("dra-gpu.*.*"):
            pid = parent.name.split(".")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                _remove_tree(parent)


def _hierarchies() -> list[Path]:
    """Every cgroup hierarchy mounted here (v1 controllers, named, and a v2 one)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        mount_point = Path(fields[4])
        if fstype in ("cgroup", "cgroup2") and mount_point.is_relative_to(CGROUP_ROOT):
            found.append(mount_point)
    return found


def _remove_tree(top: Path, timeout: float = 20.0) -> None:
    """Bottom-up; a cgroup whose last task is still dying refuses for a moment."""
    deadline = time.monotonic() + timeout
    directories = [p for p in [top, *top.rglob("*")] if p.is_dir()]
    for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class RealNode(StartStop):
    """One real node; ``start()`` returns once the Node is Ready, ``stop()`` leaves nothing."""

    def __init__(
        self,
        control_plane: ControlPlane,
        name: str,
        index: int,
        state_dir: Path,
        runtime: NodeRuntime,
        *,
        ready_timeout: float = 120.0,
    ) -> None:
        self.cp = control_plane
        self.name = name
        self.index = index
        self.state = state_dir
        self.runtime = runtime
        self.cgroup_parent = f"dra-gpu.{os.getpid()}.nodes"
        """Of every node this process starts: the PID in the name lets a later run remove
        what a killed one left (``_remove_orphaned_cgroups``)."""
        self.ready_timeout = ready_timeout
        self.kubelet_port = KUBELET_PORT
        self._unshare: subprocess.Popen[bytes] | None = None

    def __str__(self) -> str:
        return f"node {self.name}"

    # ---- paths -----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"192.0.2.{self.index}"

    @property
    def pod_subnet(self) -> str:
        return f"198.19.{self.index}.0/24"

    @property
    def cgroup_root(self) -> str:
        return f"/{self.cgroup_parent}/{self.name}"

    @property
    def logs_dir(self) -> Path:
        return self.state / "logs"

    @property
    def root(self) -> Path:
        """What the node sees as ``/`` for the bind-mounted paths (``root / "var/lib"`` is
        the node's ``/var/lib``)."""
        return self.state / "root"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "var/lib/kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "run/cdi"

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> None:
        """Start the node; with ``wait``, return once it is Ready (else call ``wait_ready``)."""
        self.runtime.check()
        try:
            self._write_files()
            self._make_cgroups()
            gateway = self.cp.open_node_gateway()
            self._write_spec(gateway)
            self.cp.route_to_node(
                self.name, self.address, self.pod_subnet, self.state / EGRESS_SOCKET
            )
            self._spawn()
            if wait:
                self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the node's first process (kubelet, then containerd stop; the kernel ends
        everything else in the namespace), wait, then remove the node's cgroups."""
        if self._unshare is not None:
            first = _only_child(self._unshare.pid)
            if first is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(first, signal.SIGTERM)
            try:
                self._unshare.wait(grace)
            except subprocess.TimeoutExpired:
                self._unshare.kill()  # --kill-child: its first process gets SIGKILL
                self._unshare.wait()
            self._unshare = None
        self._remove_cgroups()

    def reboot(self) -> None:
        """Power-cycle: every process and container of the node ends, its ``/run`` (a tmpfs
        on real machines: the CDI specs, containerd's state) starts empty, ``/var/lib`` (the
        kubelet's pods and DRA checkpoint, containerd's images) stays."""
        self.stop()
        shutil.rmtree(self.root / "run")
        shutil.rmtree(self.state / "containerd" / "state", ignore_errors=True)
        self.start()

    def prepared_claims(self) -> dict[str, KubeletClaim]:
        """What the kubelet recorded as prepared (its DRA checkpoint), by claim UID."""
        return _kubelet_checkpoint.read(self.kubelet_dir)

    def restart_kubelet(self) -> None:
        """Stop and start the kubelet (containers keep running), as ``systemctl restart``."""
        first = _only_child(self._unshare.pid) if self._unshare else None
        if first is None:
            raise ControlPlaneError(f"{self} is not running")
        os.kill(first, signal.SIGHUP)

    def upgrade_kubelet(self, kubelet: Path) -> None:
        """Swap the node's kubelet binary for ``kubelet`` and restart it, as an in-place kubelet
        upgrade (or downgrade) does: containerd and the pods keep running, the kubelet's
        directory (its DRA checkpoint, the plugins' registration sockets) stays. Returns once
        the restart is asked for: the old kubelet's Node may still say Ready, so wait for
        ``status.nodeInfo.kubeletVersion``. Later starts of this node (``reboot``) run it too."""
        if not os.access(kubelet, os.X_OK):
            raise ControlPlaneError(f"{kubelet} is not an executable kubelet")
        if not self.running:
            raise ControlPlaneError(f"{self} is not running")
        self.runtime = dataclasses.replace(self.runtime, kubelet=kubelet)
        # The node's first process reads the kubelet's argv again when told to restart it.
        spec_file = self.state / "node.json"
        spec = json.loads(spec_file.read_text())
        spec["kubelet"][0] = str(kubelet)
        self._write_json(spec_file, spec)
        self.restart_kubelet()

    def import_image(self, archive: Path) -> None:
        """Import the OCI ``archive`` into the running node's containerd (``k8s.io``), as the
        node's start does for the runtime's images: for an image only some tests need."""
        first = _only_child(self._unshare.pid) if self._unshare else None
        if first is None:
            raise ControlPlaneError(f"{self} is not running")
        ctr = self.runtime.containerd_bin / "ctr"
        done = subprocess.run(  # in the node's mount namespace, where its /run is
            [
                *(_tool("nsenter"), f"--target={first}", "--mount", "--"),
                *(str(ctr), "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io"),
                *("images", "import", str(archive)),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise ControlPlaneError(f"{self}: importing {archive} failed: {done.stderr.strip()}")

    @property
    def running(self) -> bool:
        return self._unshare is not None and self._unshare.poll() is None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ControlPlaneError(f"{self} stopped while starting:\n{self.diagnostics()}")
            node = self.cp.api_get(f"/api/v1/nodes/{self.name}")
            status = node.get("status") if node.get("kind") == "Node" else None
            conditions = status.get("conditions", []) if isinstance(status, dict) else []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return
            time.sleep(0.3)
        raise ControlPlaneError(
            f"{self} not Ready after {self.ready_timeout:.0f}s:\n{self.diagnostics()}"
        )

    def diagnostics(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- {log}\n{_tail(log, lines)}" for log in sorted(self.logs_dir.glob("*.log"))
        )

    # ---- set-up ----------------------------------------------------------------------------

    def _write_files(self) -> None:
        for directory in (
            *(self.root / seen for seen in ("run", "var/lib", "var/log")),
            *(self.state / own for own in ("sysctl", "cni", "logs")),
        ):
            directory.mkdir(parents=True, exist_ok=True)
        for tunable in KERNEL_TUNABLES:
            copy = self.state / "sysctl" / tunable.replace("/", ".")
            if not copy.exists():
                copy.write_text(Path("/proc/sys", tunable).read_text())
        crt, key = self.cp.issue_certificate(
            f"node-{self.name}", f"/CN=system:node:{self.name}/O=system:nodes"
        )
        write_kubeconfig(
            self.state / "kubeconfig",
            f"https://127.0.0.1:{API_PORT_IN_NODE}",
            self.cp.ca_file,
            self.name,
            {"client-certificate": str(crt), "client-key": str(key)},
        )
        self._write_json(self.state / "kubelet.yaml", self._kubelet_config())
        (self.state / "containerd.toml").write_text(self._containerd_config())
        self._write_json(
            self.state / "cni" / "10-dra-gpu.conflist",
            {
                "cniVersion": "1.0.0",
                "name": "dra-gpu-nodes",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "cni0",
                        "isGateway": True,
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": self.pod_subnet}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    }
                ],
            },
        )

    @staticmethod
    def _write_json(path: Path, body: object) -> None:
        path.write_text(json.dumps(body, indent=2))

    def _kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine has cgroup v1: 1.35+ refuses it unless told (still supported).
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cp.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "failSwapOn": False,
            "resolvConf": "",
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False,
            # No registry: nothing imported may be collected, and disk pressure on a shared
            # machine must not evict the test's pods.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "syncFrequency": "10s",
        }

    def _containerd_config(self) -> str:
        state = self.state / "containerd"
        cri = "plugins.'io.containerd.cri.v1.runtime'"
        return "\n".join(
            [
                "version = 3",
                f"root = '{state / 'root'}'",
                f"state = '{state / 'state'}'",
                "[grpc]",
                f"  address = '{CONTAINERD_SOCKET}'",  # the node's /run: its own
                "[plugins.'io.containerd.internal.v1.opt']",  # default: /opt/containerd
                f"  path = '{state / 'opt'}'",
                "[plugins.'io.containerd.cri.v1.images']",
                "  snapshotter = 'overlayfs'",
                "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
                f"  sandbox = '{SANDBOX_IMAGE}'",
                f"[{cri}]",
                "  enable_cdi = true",
                "  cdi_spec_dirs = ['/var/run/cdi']",
                # No CAP_SYS_RESOURCE here: the sandbox's -998 would fail every pod.
                "  restrict_oom_score_adj = true",
                f"[{cri}.containerd]",
                "  default_runtime_name = 'runc'",
                f"[{cri}.containerd.runtimes.runc]",
                "  runtime_type = 'io.containerd.runc.v2'",
                f"[{cri}.containerd.runtimes.runc.options]",
                f"  BinaryName = '{self.runtime.runc}'",
                f"[{cri}.cni]",
                f"  bin_dirs = ['{self.runtime.cni_bin}']",
                f"  conf_dir = '{self.state / 'cni'}'",
                "[plugins.'io.containerd.grpc.v1.cri']",
                "  stream_server_address = '127.0.0.1'",
                "",
            ]
        )

    def _write_spec(self, gateway: Path) -> None:
        binds = [
            (str(self.root / "run"), "/run"),
            (str(self.root / "var/lib"), "/var/lib"),
            (str(self.root / "var/log"), "/var/log"),
        ] + [
            (str(self.state / "sysctl" / t.replace("/", ".")), f"/proc/sys/{t}")
            for t in KERNEL_TUNABLES
        ]
        containerd = self.runtime.containerd_bin
        self._write_json(
            self.state / "node.json",
            {
                "logs": str(self.logs_dir),
                "binds": binds,
                "addresses": [f"{self.address}/32", f"{FIRST_SERVICE_IP}/32"],
                "env": {"PATH": f"{containerd}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
                # (listen, connect, directory): unix socket paths are relative to it.
                "forwards": [
                    (
                        f"TCP-LISTEN:{API_PORT_IN_NODE},bind=127.0.0.1,fork,reuseaddr",
                        f"UNIX-CONNECT:{gateway.name}",
                        str(gateway.parent),
                    ),
                    (
                        f"TCP-LISTEN:443,bind={FIRST_SERVICE_IP},fork,reuseaddr",
                        f"UNIX-CONNECT:{gateway.name}",
                        str(gateway.parent),
                    ),
                ],
                # The node's end of the API server's egress (argv, directory).
                "egress": (
                    [
                        sys.executable,
                        str(Path(_egress.__file__)),
                        "node",
                        f"--listen={EGRESS_SOCKET}",
                    ],
                    str(self.state),
                ),
                "containerd": {
                    "argv": [
                        str(containerd / "containerd"),
                        f"--config={self.state / 'containerd.toml'}",
                    ],
                    "socket": str(CONTAINERD_SOCKET),
                    "ctr": str(containerd / "ctr"),
                    "images": [str(image) for image in self.runtime.images],
                },
                "kubelet": [
                    str(self.runtime.kubelet),
                    f"--config={self.state / 'kubelet.yaml'}",
                    f"--kubeconfig={self.state / 'kubeconfig'}",
                    f"--hostname-override={self.name}",
                    f"--node-ip={self.address}",
                    "--v=1",
                ],
            },
        )

    def _spawn(self) -> None:
        init = str(Path(__file__).with_name("_node_init.py"))
        argv = [
            *(_tool("unshare"), "--pid", "--fork", "--kill-child", "--mount-proc"),
            *("--mount", "--propagation", "private", "--net", "--"),
            *(sys.executable, init, str(self.state / "node.json")),
        ]
        self._unshare = spawn_logged(argv, self.logs_dir / "node.log")

    # ---- cgroups ---------------------------------------------------------------------------

    def _make_cgroups(self) -> None:
        _remove_orphaned_cgroups()
        for hierarchy in _hierarchies():
            path = hierarchy / self.cgroup_root.lstrip("/")
            for level in (path.parent, path):
                if level.exists():
                    continue
                level.mkdir()
                for inherited in ("cpuset.cpus", "cpuset.mems"):  # empty would refuse tasks
                    if (level / inherited).exists():
                        (level / inherited).write_text((level.parent / inherited).read_text())

    def _remove_cgroups(self) -> None:
        for hierarchy in _hierarchies():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if top.exists():
                _remove_tree(top)
            with contextlib.suppress(OSError):
                top.parent.rmdir()  # the parent, once its last node is gone


def start_nodes(nodes: Sequence[RealNode]) -> None:
    """Start ``nodes`` together (they come up side by side); all stopped if one fails."""
    try:
        for node in nodes:
            node.start(wait=False)
        for node in nodes:
            node.wait_ready()
    except BaseException:
        for node in reversed(nodes):
            node.stop()
        raise


def _only_child(pid: int) -> int | None:
    """``unshare --fork``'s child: the node's first process, seen from here."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None

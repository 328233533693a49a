"""Typed settings for dra-gpu's processes: one object each, read once in ``cli.py``.

Every field has a flag and a twin environment variable (``--cdi-dir`` / ``DRA_GPU_CDI_DIR``); the
chart maps its values onto the environment. Logic receives the settings object and never reads
the environment itself. Pure: no I/O here.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_gpu import DEFAULT_DRIVER_NAME
from dra_gpu.devices import health, sharing

STANDIN_MPS_CONTROL = (sys.executable, "-m", "dra_gpu.agent.mps_standin")
"""The simulated backend's stand-in for ``nvidia-cuda-mps-control`` (``agent.mps_standin``)."""

ENV_PREFIX = "DRA_GPU_"
MAX_SOCKET_PATH = 107
"""sun_path holds 108 bytes including the terminating NUL."""


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """The node agent: one per node, the kubelet's DRA plugin for ``driver_name``."""

    node_name: str
    """The Node this agent serves (downward API ``spec.nodeName`` in the chart)."""
    driver_name: str = DEFAULT_DRIVER_NAME
    """DRA driver name: ``spec.driver`` of our slices, the kubelet plugin name, CDI vendor."""
    backend: str = "simulated"
    """``nvml`` (real NVIDIA GPUs through pynvml) or ``simulated`` (a YAML profile)."""
    profile: Path | None = None
    """The simulated backend's profile (nodes to devices); required with ``simulated``."""
    kubelet_dir: Path = Path("/var/lib/kubelet")
    """Holds ``plugins_registry/`` (registration socket) and ``plugins/<driver>/`` (DRA socket)."""
    cdi_dir: Path = Path("/var/run/cdi")
    """Per-claim CDI specs. tmpfs on most nodes: gone after a reboot, re-created on demand."""
    checkpoint_dir: Path = Path("/var/lib/dra-gpu")
    """The checkpoint of prepared claims; must survive reboots (not tmpfs)."""
    pod_uid: str = ""
    """This agent's pod UID (downward API ``metadata.uid`` in the chart). Set: the sockets are
    this pod's own (``plugins_registry/<driver>-<uid>-reg.sock``,
    ``plugins/<driver>/dra-<uid>.sock``, as upstream's kubelet plugin helper names them for
    rolling updates), so a new pod registers beside the old one (kubelet 1.33+) and the kubelet
    calls the newer. Empty: one fixed pair per driver (``<driver>-reg.sock``, ``dra.sock``),
    which a second agent takes over."""
    metrics_port: int = 9402
    """Prometheus ``/metrics`` on 0.0.0.0 (0 disables)."""
    health_port: int = 9403
    """``/healthz`` (fails while the gRPC servers do not answer) and ``/readyz`` (0 disables)."""
    bind_address: str = "0.0.0.0"
    """Address of the metrics and health listeners (tests use 127.0.0.1)."""
    resync_seconds: float = 30.0
    """How often the inventory is re-read and our slices checked against it."""
    kubeconfig: Path | None = None
    """Kubeconfig file; unset means ``$KUBECONFIG`` or the in-cluster service account."""
    api_qps: float = 50.0
    """Client-side rate limit: API requests a second once a burst is spent (watches are not
    counted); 0: no limit. The kubelet's own defaults (kubeAPIQPS 50, burst 100): a pod start
    costs the kubelet and the agent about as many requests, and a burst of pods (a node full
    of claims at once: a GET per prepare the claim cache cannot answer, a status write each)
    must not queue behind a lower limit; steady state is far lower."""
    api_burst: int = 100
    """Requests sent at once before ``api_qps`` applies (the kubelet's kubeAPIBurst)."""
    claim_reads: str = "watch"
    """How prepare reads a claim: ``watch`` (the copy read as the claim's pod was bound to this
    node, seen by one watch of the node's pods, when it may be used, else a GET) or ``get`` (a
    GET every time, no watch)."""
    faults_file: Path | None = None
    """The simulated backend's faults file: the faults its GPUs have now (format in docs/agent.md);
    a missing file means none."""
    health_poll_seconds: float = 2.0
    """How often the backend's faults are collected (NVML events are queued in between)."""
    health_quiet_seconds: float = 300.0
    """A device's taint is cleared once its fault has not shown for this long (seconds); a
    device that keeps faulting stays tainted."""
    fatal_xids: str = ""
    """Comma-separated XIDs whose taint is NoExecute (every pod using the GPU is evicted), and
    ``reset`` for every reset-needing fault (the catalog's reset/reboot XIDs, double-bit ECC, a
    lost GPU). Empty (the default): every taint is NoSchedule, as NVIDIA's DRA driver does."""
    ignored_xids: str = ""
    """Comma-separated XIDs that taint nothing, on top of those NVIDIA's XID catalog contains to
    the application (``devices.health.XID_CATALOG``)."""
    shared_gpus: str = ""
    """The nvml backend's GPUs that several claims may hold at once, each with a memory share,
    as YAML or JSON: a list of ``{gpus: all | [<index> | "GPU-<uuid>", ...], mode: TimeSlicing |
    MPS, memory: {default, min, max, step}}`` (docs/nodes.md "Node configuration"). Empty: every GPU
    exclusive. A GPU in MIG mode stays MIG-partitioned."""
    mig_own_layout: bool = False
    """The agent owns the MIG layout of the node's MIG-mode GPUs: at start it destroys every
    MIG instance its checkpoint does not record. False (the default): instances it did not make
    (the GPU Operator's mig-manager's) are left alone and their placements not offered."""

    mps_control: str = ""
    """The MPS control daemon run for each GPU shared with MPS (``-d`` to start it, commands on
    its stdin). Empty: the backend's own: ``nvidia-cuda-mps-control`` (nvml, found on PATH), the
    stand-in ``python -m dra_gpu.agent.mps_standin`` (simulated)."""
    mps_shm_dir: Path = Path("/dev/shm")
    """The host directory that MPS clients get as ``/dev/shm``: the daemon's own (the agent's
    ``/dev/shm``, the host's in the chart)."""
    nvidia_smi: str = "nvidia-smi"
    """nvidia-smi, which sets a TimeSlicing GPU's time-slice (``compute-policy``)."""
    driver_root: Path = Path("/")
    """Where the nvml backend reads the driver's device nodes (``/dev/nvidia*``) and
    ``/proc/driver/nvidia`` files for the claims' CDI specs."""
    toolkit_cdi_kind: str = ""
    """Workloads get GPUs through CDI only: the kind of the NVIDIA Container Toolkit's own CDI
    spec (``nvidia.com/gpu``, from ``nvidia-ctk cdi generate --device-name-strategy=uuid``),
    whose device prepare answers before ours for each device: a GPU's ``<kind>=GPU-<uuid>``,
    a MIG partition's parent GPU's (the driver's libraries and hooks come with it). Empty (the
    default): only our own devices (workloads run with the toolkit's runtime)."""

    @property
    def mps_control_argv(self) -> list[str]:
        """``mps_control`` as an argv (split on spaces), or the backend's default."""
        if self.mps_control.strip():
            return self.mps_control.split()
        if self.backend == "nvml":
            return ["nvidia-cuda-mps-control"]
        return list(STANDIN_MPS_CONTROL)

    @property
    def sharing_dir(self) -> Path:
        """Per shared GPU: the MPS daemon's pipe and log directories and what was set."""
        return self.checkpoint_dir / "sharing"

    @property
    def shared_gpu_policy(self) -> sharing.SharedGpus:
        """``shared_gpus`` parsed; InventoryError (a ValueError) naming the flag and field."""
        return sharing.parse_shared_gpus(self.shared_gpus, source=_SHARED_GPUS)

    @property
    def xid_policy(self) -> health.XidPolicy:
        return health.XidPolicy.parse(self.fatal_xids, self.ignored_xids)

    @property
    def registration_socket(self) -> Path:
        pod = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.kubelet_dir / "plugins_registry" / f"{self.driver_name}{pod}-reg.sock"

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "plugins" / self.driver_name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / (f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock")

    @property
    def checkpoint_file(self) -> Path:
        return self.checkpoint_dir / "checkpoint.json"

    @property
    def serialize_lock(self) -> Path:
        """The file lock that serializes prepares and unprepares of the agents sharing
        ``checkpoint_dir`` (the old and the new pod of a rolling update)."""
        return self.checkpoint_dir / "serialize.lock"

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node name is required (--node-name / DRA_GPU_NODE_NAME)")
        _check_rate_limit(self.api_qps, self.api_burst)
        if self.backend not in ("simulated", "nvml"):
            raise ValueError(f"backend {self.backend!r} is not one of: simulated, nvml")
        if self.backend == "simulated" and self.profile is None:
            raise ValueError("the simulated backend needs a profile (--profile / DRA_GPU_PROFILE)")
        if self.resync_seconds <= 0:
            raise ValueError(f"resync seconds must be positive, got {self.resync_seconds}")
        if self.claim_reads not in ("watch", "get"):
            raise ValueError(
                f"{flag_name('claim_reads')} / {env_name('claim_reads')}: "
                f"{self.claim_reads!r} is not one of: watch, get"
            )
        if self.health_poll_seconds <= 0:
            raise ValueError(
                f"health poll seconds must be positive, got {self.health_poll_seconds}"
            )
        if self.health_quiet_seconds < 0:
            raise ValueError(
                f"health quiet seconds must not be negative, got {self.health_quiet_seconds}"
            )
        try:
            self.xid_policy  # noqa: B018  (parses both lists)
        except ValueError as err:
            raise ValueError(f"{err} (--fatal-xids / --ignored-xids)") from None
        if self.shared_gpus.strip() and self.backend != "nvml":
            raise ValueError(
                f"{_SHARED_GPUS}: only the nvml backend reads it; the simulated backend's "
                "profile says which GPUs are shared (devices[].sharing)"
            )
        self.shared_gpu_policy  # noqa: B018  (parses it: a bad setting stops the agent at start)
        if self.toolkit_cdi_kind and not _CDI_KIND.fullmatch(self.toolkit_cdi_kind):
            raise ValueError(
                f"{flag_name('toolkit_cdi_kind')} / {env_name('toolkit_cdi_kind')}: "
                f"{self.toolkit_cdi_kind!r} is not a CDI kind (<vendor>/<class>, e.g. "
                "nvidia.com/gpu)"
            )
        if self.pod_uid and not re.fullmatch(
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", self.pod_uid
        ):
            raise ValueError(
                f"{flag_name('pod_uid')} / {env_name('pod_uid')}: {self.pod_uid!r} is not a pod "
                "UID (a lower-case UUID, the downward API's metadata.uid)"
            )
        for socket in (self.registration_socket, self.dra_socket):
            if len(bytes(socket)) > MAX_SOCKET_PATH:
                raise ValueError(
                    f"socket path {socket} is {len(bytes(socket))} bytes; unix sockets allow "
                    f"{MAX_SOCKET_PATH}: use a shorter --kubelet-dir / DRA_GPU_KUBELET_DIR"
                )


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """The cluster-wide controller (a Deployment; one replica acts at a time)."""

    driver_name: str = DEFAULT_DRIVER_NAME
    """The DRA driver whose slices, claims and classes this controller looks after."""
    namespace: str = "default"
    """Namespace of the leader-election Lease (the chart sets the release namespace)."""
    lease_name: str = "dra-gpu-controller"
    """The leader-election Lease; one per release (the chart sets ``<release>-controller``),
    so two releases for two drivers in one namespace each get a leader."""
    identity: str = ""
    """This replica's name in the Lease (the chart sets the pod name); default host-pid."""
    lease_seconds: int = 15
    """A leader that has not renewed for this long is replaced."""
    metrics_port: int = 9400
    """Prometheus ``/metrics`` (0 disables)."""
    health_port: int = 9401
    """``/healthz`` and ``/readyz`` (0 disables)."""
    bind_address: str = "0.0.0.0"
    """Address of the metrics and health listeners."""
    resync_seconds: float = 30.0
    """Explanations and metrics are recomputed at least this often, events or not."""
    kubeconfig: Path | None = None
    """Kubeconfig file; unset means ``$KUBECONFIG`` or the in-cluster service account."""
    api_qps: float = 50.0
    """Client-side rate limit of the controller's own API client (not Kopf's): requests a
    second once a burst is spent (watches are not counted); 0: no limit. kube-scheduler's
    default: one replica acts, and its writes (Events, status repairs) follow the claims that
    changed, so a class edit that re-explains a thousand waiting claims spreads its Events over
    20 s instead of sending them at once."""
    api_burst: int = 100
    """Requests sent at once before ``api_qps`` applies (kube-scheduler's default)."""
    event_qps: float = 100.0
    """Client-side rate limit of the controller's Events (the explanations, the class checks'
    Warnings, and the reads of Events they need), a bucket of their own beside ``api_qps``'s,
    as kube-scheduler keeps a client of its own for its Events: a backlog of explanations
    (a new leader's first pass over a thousand waiting claims) neither waits behind the
    controller's other requests nor holds them up. Twice kube-scheduler's 50, because an
    explanation is two Events (the claim's and its pod's) where the scheduler posts one per
    pod; 0: no limit."""
    event_burst: int = 200
    """Events sent at once before ``event_qps`` applies."""
    webhook_port: int = 0
    """HTTPS listener of the admission webhook on every replica (0: no admission)."""
    webhook_cert_dir: Path | None = None
    """A directory with ``tls.crt`` and ``tls.key`` kept by someone else (cert-manager's
    Secret, mounted); re-read when they change. Unset: the controller issues its own CA and
    serving certificate into ``webhook_secret`` and keeps ``webhook_configuration``'s caBundle."""
    webhook_secret: str = "dra-gpu-webhook-tls"
    """The Secret (in ``namespace``) holding the self-issued CA and serving certificate."""
    webhook_service: str = "dra-gpu-webhook"
    """The webhook's Service (in ``namespace``): the serving certificate's DNS names."""
    webhook_configuration: str = "dra-gpu"
    """The ValidatingWebhookConfiguration whose caBundle the leader keeps (self-issued)."""
    agent_pod_selector: str = ""
    """Labels of the agent DaemonSet's pods (``k=v,k2=v2``): a node with a pool of the driver
    whose agent pod is absent or not Ready for ``driver_gone_seconds`` gets its devices
    tainted. Empty: off (agents run as plain processes, not pods)."""
    agent_namespace: str = ""
    """Namespace of the agent pods (the chart's release namespace); empty: any."""
    driver_gone_seconds: float = 60.0
    """Seconds an agent may be gone before its node's devices are tainted NoSchedule."""

    def __post_init__(self) -> None:
        _check_rate_limit(self.api_qps, self.api_burst)
        _check_rate_limit(self.event_qps, self.event_burst, "event")
        if self.driver_gone_seconds < 0:
            raise ValueError(
                f"driver gone seconds must be at least 0, got {self.driver_gone_seconds}"
            )
        if self.lease_seconds < 2:
            raise ValueError(f"lease seconds must be at least 2, got {self.lease_seconds}")
        if not 0 <= self.webhook_port <= 65535:
            raise ValueError(f"webhook port must be 0-65535, got {self.webhook_port}")


def _check_rate_limit(qps: float, burst: int, of: str = "api") -> None:
    """``<of>_qps`` at least 0 (0: no limit) and, with a limit, ``<of>_burst`` at least 1."""
    qps_field, burst_field = f"{of}_qps", f"{of}_burst"
    if qps < 0:
        raise ValueError(
            f"{flag_name(qps_field)} / {env_name(qps_field)}: {qps:g} requests a second; "
            "use 0 for no client-side limit, or a positive number"
        )
    if qps > 0 and burst < 1:
        raise ValueError(
            f"{flag_name(burst_field)} / {env_name(burst_field)}: a burst of {burst} would "
            f"never send a request; at least 1 (with {flag_name(qps_field)} {qps:g})"
        )


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


_SHARED_GPUS = f"{flag_name('shared_gpus')} / {env_name('shared_gpus')}"
_CDI_NAME = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_CDI_KIND = re.compile(f"{_CDI_NAME}/{_CDI_NAME}")
"""A CDI kind, ``<vendor>/<class>`` (CDI's ``ValidateVendorName``, ``ValidateClassName``)."""


def add_arguments(parser: argparse.ArgumentParser, settings_type: type[Any]) -> None:
    """One flag per settings field, each documented with its env twin and default."""
    hints = {f.name: f for f in dataclasses.fields(settings_type)}
    docs = _field_docs(settings_type)
    for name, field in hints.items():
        default = field.default if field.default is not dataclasses.MISSING else None
        parser.add_argument(
            flag_name(name),
            dest=name,
            default=None,
            help=f"{docs.get(name, '')} [env {env_name(name)}; default {default}]",
        )


def settings_from(
    settings_type: type[Any], args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> Any:
    """Flags win over the environment, which wins over the defaults. Raises ValueError naming
    the flag and the env variable for a missing required value or one of the wrong type."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(settings_type):
        raw = getattr(args, field.name, None)
        source = flag_name(field.name)
        if raw is None and env_name(field.name) in environ:
            raw, source = environ[env_name(field.name)], env_name(field.name)
        if raw is None:
            if _required(field):
                raise ValueError(_missing(settings_type, field.name))
            continue
        values[field.name] = _convert(field, raw, source)
    return settings_type(**values)


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _missing(settings_type: type[Any], field: str) -> str:
    """``--node-name is required (or set DRA_GPU_NODE_NAME): the Node this agent serves ...``"""
    doc = _field_docs(settings_type).get(field, "").replace("``", "").rstrip(".")
    what = f": {doc[:1].lower()}{doc[1:]}" if doc else ""
    return f"{flag_name(field)} is required (or set {env_name(field)}){what}"


def _convert(field: dataclasses.Field[Any], raw: str, source: str) -> Any:
    kind = str(field.type)
    try:
        if "Path" in kind:
            return Path(raw) if raw else None
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return _bool(raw)
    except ValueError:
        raise ValueError(f"{source}: {raw!r} is not a valid {kind}") from None
    return raw


def _bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(raw)


def _field_docs(settings_type: type[Any]) -> dict[str, str]:
    """Attribute docstrings (the string literal after each field) as help texts."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(settings_type))
    docs: dict[str, str] = {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs

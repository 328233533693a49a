"""The DRA part of the kubelet stand-in: plays the kubelet towards DRA plugins over real gRPC.

For each fake node it does what a 1.34 kubelet does with DRA, over the real protocol on unix
sockets (reference: dra-facts.md §1-§3):

- discovers plugins in ``<kubelet dir>/plugins_registry`` (``*.sock``, polled), runs the
  registration handshake (``GetInfo`` with a 1 s deadline, version choice in the plugin's order,
  ``NotifyRegistrationStatus``) and deregisters a plugin when its socket file goes away;
- wipes the node's ResourceSlices at start, and a driver's slices once no instance of it has
  been connected for ``wipe_delay_seconds``;
- prepares the claims of pods bound to the node (``NodePrepareResources`` per driver, checked
  claim by claim; recorded before the call, as the kubelet checkpoints them), resolves the
  returned CDI device IDs in the node's CDI directory as a container runtime would, and only
  then lets the node part mark the pod Running;
- unprepares claims no other pod on the node uses when a pod terminates, and only then lets the
  node part finish the deletion;
- reports failures as the kubelet does: Warning Events on the pod with the kubelet's texts.

It owns the plugin connections, the prepared-claims record and the per-container CDI edits of
the pods it started. It must not write pod status or delete pods itself (the node part in
``_kubelet.py`` does, through the two callbacks it passes in), must never allocate or reserve
claims, and must never crash on a bad plugin answer: a bad answer is an Event and a log line.

Pure logic (version choice, response checks, CDI resolution, container matching, event bodies)
sits in plain functions at the top so unit tests need no sockets and no cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final, NoReturn

import grpc
import yaml

from dra_gpu import kube
from dra_gpu.proto.dra.v1 import api_pb2 as dra_v1
from dra_gpu.proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from dra_gpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dra_gpu.proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from dra_gpu.proto.pluginregistration.v1 import api_pb2 as reg_pb
from dra_gpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_gpu.testing import _waiting

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE: Final = "DRAPlugin"
V1: Final = "v1.DRAPlugin"
V1BETA1: Final = "v1beta1.DRAPlugin"
KUBELET_SERVICES: Final = (V1, V1BETA1)
"""What a 1.34 kubelet supports, in its own order (used only in its error text)."""

_SERVICE_MODULES: Final[dict[str, tuple[ModuleType, ModuleType]]] = {
    V1: (dra_v1, dra_v1_grpc),
    V1BETA1: (dra_v1beta1, dra_v1beta1_grpc),
}

FAILED_PREPARE: Final = "FailedPrepareDynamicResources"
FAILED_UNPREPARE: Final = "FailedUnprepareDynamicResources"
"""The real kubelet only logs unprepare failures; the stand-in also shows them on the pod."""

GET_INFO_TIMEOUT: Final = 1.0
NOTIFY_TIMEOUT: Final = 5.0
_REGISTRATION_BACKOFF_MAX: Final = 16.0
_WIPE_BACKOFF_MAX: Final = 30.0

RESOURCE_SLICES: Final = "/apis/resource.k8s.io/v1/resourceslices"


@dataclasses.dataclass(frozen=True)
class DraSettings:
    """Options of the DRA part; pass one as ``KubeletStandIn(..., dra=DraSettings())``."""

    cdi_dir: Path | None = None
    """One CDI directory shared by all nodes; None gives each node ``<kubelet dir>/cdi``."""
    wipe_delay_seconds: float = 30.0
    """How long a driver may have no connected instance before its node slices are wiped."""
    retry_seconds: float = 2.0
    """Period of retries for failed prepares and unprepares (the kubelet uses 60 s for the
    latter; tests want it short)."""
    discovery_seconds: float = 0.5
    """How often the registry directory is scanned for new or removed sockets."""
    call_timeout_seconds: float = 45.0
    """Deadline of each NodePrepareResources / NodeUnprepareResources call."""


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One device a plugin returned for a claim."""

    driver: str
    pool: str
    device: str
    request_names: tuple[str, ...]
    cdi_device_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    """An entry of the stand-in's record of prepared claims (the kubelet's checkpoint)."""

    namespace: str
    name: str
    uid: str
    devices: tuple[PreparedDevice, ...]
    pod_uids: frozenset[str]
    """Pods on the node that use the claim; it is unprepared when the last one is gone."""


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """What the kubelet sends about a claim: namespace, name and UID, nothing else."""

    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``, resolved to a ResourceClaim name."""

    pod_claim_name: str
    claim_name: str
    from_template: bool


@dataclasses.dataclass(frozen=True)
class ResolvedCdiDevice:
    """A CDI device ID found in a spec file: the edits it brings to a container."""

    device_id: str
    spec_file: str
    device_edits: kube.Body
    spec_edits: kube.Body


class DraFailure(Exception):
    """A failure the kubelet would report; the message is the kubelet's cause text."""


class NotReadyYet(Exception):
    """Nothing is wrong yet, the pod just cannot be prepared now (claim not allocated...)."""


# --- pure: registration ---------------------------------------------------------------------


def go_quote_list(items: Iterable[str]) -> str:
    """A string list as Go's ``%q`` prints it: ``["a" "b"]``."""
    return "[" + " ".join(json.dumps(item) for item in items) + "]"


def choose_service(supported: Sequence[str]) -> str:
    """The service a 1.34 kubelet talks to: the first of the plugin's list it knows.

    The plugin's order decides, not the kubelet's, and there is no fallback.
    Raises DraFailure with the kubelet's text if nothing matches.
    """
    if not supported:
        raise DraFailure("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in KUBELET_SERVICES:
            return service
    raise DraFailure(
        f"none of services supported by the plugin ({go_quote_list(supported)}) "
        f"are supported by the kubelet ({go_quote_list(KUBELET_SERVICES)})"
    )


def registration_error(
    plugin_type: str, name: str, endpoint: str, supported: Sequence[str], socket: str
) -> str | None:
    """Why the kubelet would refuse this ``PluginInfo`` (the text it notifies), or None."""
    if plugin_type != DRA_PLUGIN_TYPE:
        return (
            f"RegisterPlugin error -- no handler registered for plugin type: {plugin_type} "
            f"at socket {socket}"
        )
    try:
        choose_service(supported)
    except DraFailure as exc:
        return (
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
            f"versions of DRA driver plugin {name} at endpoint {endpoint}: {exc}"
        )
    return None


def go_rpc_error(code: grpc.StatusCode, details: str | None) -> str:
    """A gRPC error as Go's status package prints it, which is what users see in events."""
    if code == grpc.StatusCode.CANCELLED:
        name = "Canceled"
    elif code == grpc.StatusCode.OK:
        name = "OK"
    else:
        name = "".join(part.capitalize() for part in code.name.split("_"))
    desc = details or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and desc == "Deadline Exceeded":
        desc = "context deadline exceeded"  # the caller's own deadline, in Go's words
    return f"rpc error: code = {name} desc = {desc}"


# --- pure: claims of a pod ------------------------------------------------------------------


def pod_claims(pod: kube.Body) -> list[PodClaim] | None:
    """The ResourceClaims a pod uses, or None while a template's claim is not named yet.

    A template entry whose status names no claim needs none (the API's way to say so).
    """
    statuses = {
        s.get("name"): s for s in (pod.get("status", {}).get("resourceClaimStatuses") or [])
    }
    claims: list[PodClaim] = []
    for entry in pod.get("spec", {}).get("resourceClaims") or []:
        name = entry["name"]
        if entry.get("resourceClaimName"):
            claims.append(PodClaim(name, entry["resourceClaimName"], from_template=False))
            continue
        if name not in statuses:
            return None
        claim_name = statuses[name].get("resourceClaimName")
        if claim_name:
            claims.append(PodClaim(name, claim_name, from_template=True))
    return claims


def check_claim_for_pod(pod: kube.Body, claim: kube.Body, from_template: bool) -> None:
    """Raise DraFailure if the pod may never use the claim, NotReadyYet if not yet."""
    meta, claim_meta = pod["metadata"], claim["metadata"]
    if from_template and not any(
        ref.get("uid") == meta["uid"] and ref.get("controller")
        for ref in claim_meta.get("ownerReferences") or []
    ):
        raise DraFailure(
            f"ResourceClaim {claim_meta['namespace']}/{claim_meta['name']} was not created for "
            f"pod {meta['namespace']}/{meta['name']} (pod is not owner)"
        )
    status = claim.get("status", {})
    if not status.get("allocation"):
        raise NotReadyYet(f"ResourceClaim {claim_meta['name']} is not allocated")
    if not any(r.get("uid") == meta["uid"] for r in status.get("reservedFor") or []):
        raise NotReadyYet(f"ResourceClaim {claim_meta['name']} is not reserved for the pod")


def claim_drivers(claim: kube.Body) -> list[str]:
    """Drivers of the claim's allocated devices, sorted, each once."""
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results")
    return sorted({r.get("driver", "") for r in results or []})


def check_results(method: str, requested: Sequence[ClaimRef], errors: Mapping[str, str]) -> None:
    """Check a response's per-claim results like the kubelet; raise DraFailure on the first
    problem. ``errors`` maps each claim UID in the response to its ``error`` field."""
    by_uid = {c.uid: c for c in requested}
    for uid in sorted(errors):
        if uid not in by_uid:
            raise DraFailure(f"{method} returned result for unknown claim UID {uid}")
        if errors[uid]:
            raise DraFailure(f"{method} failed for ResourceClaim {by_uid[uid].name}: {errors[uid]}")
    skipped = len(by_uid) - len(errors)
    if skipped:
        raise DraFailure(f"{method} skipped {skipped} ResourceClaims")


def devices_from_response(driver: str, result: Any) -> tuple[PreparedDevice, ...]:
    """The devices of one ``NodePrepareResourceResponse`` (v1 and v1beta1 alike)."""
    return tuple(
        PreparedDevice(
            driver=driver,
            pool=d.pool_name,
            device=d.device_name,
            request_names=tuple(d.request_names),
            cdi_device_ids=tuple(d.cdi_device_ids),
        )
        for d in result.devices
    )


# --- pure: CDI, as a container runtime reads it ---------------------------------------------


def parse_cdi_id(device_id: str) -> tuple[str, str]:
    """``vendor/class=name`` -> (``vendor/class``, ``name``); DraFailure if malformed."""
    kind, sep, name = device_id.partition("=")
    vendor, slash, cdi_class = kind.partition("/")
    if not (sep and slash and vendor and cdi_class and name):
        raise DraFailure(f"CDI device ID {device_id!r} is not of the form vendor/class=name")
    return kind, name


def index_cdi_specs(specs: Iterable[tuple[str, Any]]) -> dict[str, list[ResolvedCdiDevice]]:
    """Every device of every spec, by fully-qualified ID. ``specs`` is (file, parsed content);
    content that is not a spec is skipped, as runtimes skip broken spec files."""
    index: dict[str, list[ResolvedCdiDevice]] = {}
    for origin, spec in specs:
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
            continue
        spec_edits = spec.get("containerEdits") or {}
        for device in spec.get("devices") or []:
            if not isinstance(device, dict) or not device.get("name"):
                continue
            device_id = f"{spec['kind']}={device['name']}"
            resolved = ResolvedCdiDevice(
                device_id, origin, device.get("containerEdits") or {}, spec_edits
            )
            index.setdefault(device_id, []).append(resolved)
    return index


def resolve_cdi_ids(
    index: Mapping[str, Sequence[ResolvedCdiDevice]], device_ids: Iterable[str], cdi_dir: Path
) -> list[ResolvedCdiDevice]:
    """Look each ID up; DraFailure naming the first one that does not resolve to one device."""
    resolved: list[ResolvedCdiDevice] = []
    for device_id in device_ids:
        parse_cdi_id(device_id)
        found = index.get(device_id, [])
        if not found:
            raise DraFailure(f"CDI device {device_id} not found in {cdi_dir}")
        if len(found) > 1:
            files = ", ".join(sorted(d.spec_file for d in found))
            raise DraFailure(f"CDI device {device_id} is defined more than once in {files}")
        resolved.append(found[0])
    return resolved


def merge_container_edits(devices: Sequence[ResolvedCdiDevice]) -> kube.Body:
    """The edits a container gets: each device's, then each involved spec's top-level edits
    once (the order the CDI library applies them in). Lists are concatenated."""
    merged: kube.Body = {}
    for device in devices:
        _append_edits(merged, device.device_edits)
    seen: set[str] = set()
    for device in devices:
        if device.spec_file not in seen:
            seen.add(device.spec_file)
            _append_edits(merged, device.spec_edits)
    return merged


def _append_edits(merged: kube.Body, edits: Mapping[str, Any]) -> None:
    for key, value in edits.items():
        if isinstance(value, list):
            merged.setdefault(key, []).extend(value)
        else:
            merged[key] = value


def env_of(edits: Mapping[str, Any]) -> dict[str, str]:
    """``KEY=value`` entries of merged edits as a dict; a later entry wins, as in a runtime."""
    env: dict[str, str] = {}
    for entry in edits.get("env") or []:
        key, _, value = str(entry).partition("=")
        env[key] = value
    return env


def container_cdi_ids(
    container: kube.Body, devices_by_pod_claim: Mapping[str, Sequence[PreparedDevice]]
) -> list[str]:
    """CDI IDs the kubelet hands to the runtime for one container (dra-facts §3.2).

    A device goes to a container that references its claim when the reference names no
    request, the device names no request, or the device serves the referenced request.
    """
    ids: list[str] = []
    for ref in container.get("resources", {}).get("claims") or []:
        request = ref.get("request") or ""
        for device in devices_by_pod_claim.get(ref.get("name", ""), ()):
            if not request or not device.request_names or request in device.request_names:
                ids.extend(i for i in device.cdi_device_ids if i not in ids)
    return ids


def pod_containers(pod: kube.Body) -> list[kube.Body]:
    spec = pod.get("spec", {})
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


# --- pure: events ---------------------------------------------------------------------------


def pod_event_body(
    pod: kube.Body, *, node: str, reason: str, message: str, now: str, unique: int
) -> kube.Body:
    """A core/v1 Warning Event about the pod, as the kubelet's recorder writes it.

    ``unique`` makes the name (``<pod>.<hex>``; the kubelet uses the time in nanoseconds).
    """
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{unique:x}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def prepare_message(cause: str) -> str:
    return f"Failed to prepare dynamic resources: prepare dynamic resources: {cause}"


def unprepare_message(cause: str) -> str:
    return f"Failed to unprepare dynamic resources: unprepare dynamic resources: {cause}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- I/O: files -----------------------------------------------------------------------------


def load_cdi_specs(cdi_dir: Path) -> list[tuple[str, Any]]:
    """Parse every ``*.json`` / ``*.yaml`` in ``cdi_dir`` (not recursive). Blocks: run in a
    thread. Unreadable files parse to None, which ``index_cdi_specs`` skips."""
    specs: list[tuple[str, Any]] = []
    try:
        paths = sorted(cdi_dir.iterdir())
    except FileNotFoundError:
        return specs
    for path in paths:
        if path.suffix not in (".json", ".yaml", ".yml") or not path.is_file():
            continue
        try:
            text = path.read_text()
            content = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            log.warning("CDI spec %s cannot be read, skipped: %s", path, exc)
            content = None
        specs.append((str(path), content))
    return specs


def _socket_identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime) of a socket file, or None: a re-created socket is a new plugin."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


def _empty_dir(directory: Path) -> None:
    for entry in directory.iterdir() if directory.is_dir() else ():
        if entry.is_file() or entry.is_symlink():
            entry.unlink(missing_ok=True)


# --- I/O: one registered plugin -------------------------------------------------------------


class _Plugin:
    """A registered instance of a driver: its DRA channel and the negotiated service."""

    def __init__(self, driver: str, service: str, endpoint: str, socket: Path) -> None:
        self.driver, self.service, self.endpoint, self.socket = driver, service, endpoint, socket
        # Created once; gRPC connects on demand and reconnects, like the kubelet's client.
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        self.pb, grpc_module = _SERVICE_MODULES[service]
        self.stub = grpc_module.DRAPluginStub(self.channel)
        self.connected = False
        self.monitor: asyncio.Task[None] | None = None

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self.pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    async def prepare(
        self, claims: Sequence[ClaimRef], deadline: float
    ) -> dict[str, tuple[str, tuple[PreparedDevice, ...]]]:
        """Per claim UID: (error, devices). Raises DraFailure for a failed call."""
        request = self.pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = await self._call("NodePrepareResources", request, deadline)
        return {
            uid: (result.error, devices_from_response(self.driver, result))
            for uid, result in response.claims.items()
        }

    async def unprepare(self, claims: Sequence[ClaimRef], deadline: float) -> dict[str, str]:
        """Per claim UID: error. Raises DraFailure for a failed call."""
        request = self.pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = await self._call("NodeUnprepareResources", request, deadline)
        return {uid: result.error for uid, result in response.claims.items()}

    async def _call(self, method: str, request: Any, deadline: float) -> Any:
        try:
            return await getattr(self.stub, method)(request, timeout=deadline)  # gRPC deadline
        except grpc.aio.AioRpcError as exc:
            raise DraFailure(f"{method}: {go_rpc_error(exc.code(), exc.details())}") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being stopped
            # The channel was closed under the call (the plugin's socket was re-created and
            # discovery dropped this instance): grpc cancels the call, a failure like any other.
            details = "grpc: the client connection is closing"
            raise DraFailure(
                f"{method}: {go_rpc_error(grpc.StatusCode.CANCELLED, details)}"
            ) from None

    async def close(self) -> None:
        if self.monitor is not None:
            self.monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.monitor
        await self.channel.close()


# --- I/O: events ----------------------------------------------------------------------------


class _EventRecorder:
    """Posts the node's pod Events. A message repeated for the same pod bumps ``count`` and
    ``lastTimestamp`` of the event already posted, as the kubelet's recorder does."""

    def __init__(self, api: kube.Kube, node: str) -> None:
        self.api, self.node = api, node
        self._posted: dict[tuple[str, str, str], tuple[str, int]] = {}

    async def warn(self, pod: kube.Body, reason: str, message: str) -> None:
        meta = pod["metadata"]
        log.warning("node %s: pod %s/%s: %s", self.node, meta["namespace"], meta["name"], message)
        key = (meta["uid"], reason, message)
        events = f"/api/v1/namespaces/{meta['namespace']}/events"
        try:
            if key in self._posted:
                name, count = self._posted[key]
                try:
                    await self.api.patch(
                        f"{events}/{name}", {"count": count + 1, "lastTimestamp": _now()}
                    )
                    self._posted[key] = (name, count + 1)
                    return
                except kube.ApiError as exc:
                    if not exc.not_found:
                        raise
                    # The event expired or was deleted: post a new one.
            body = pod_event_body(
                pod,
                node=self.node,
                reason=reason,
                message=message,
                now=_now(),
                unique=time.time_ns(),
            )
            created = await self.api.create(events, body)
            self._posted[key] = (created["metadata"]["name"], 1)
        except Exception as exc:  # e.g. a terminating namespace: the log line above stays
            log.warning("node %s: cannot post event %r: %s", self.node, message, exc)

    def forget(self, pod_uid: str) -> None:
        for key in [k for k in self._posted if k[0] == pod_uid]:
            del self._posted[key]


# --- I/O: one node --------------------------------------------------------------------------

RunPod = Callable[[str, kube.Body], Awaitable[None]]
"""Marks a pod Running: (node name, pod). Provided by the node part of the stand-in."""
FinishDeletion = Callable[[kube.Body], Awaitable[None]]
"""Deletes a terminating pod with grace period 0. Provided by the node part."""


@dataclasses.dataclass
class _ClaimRecord:
    """A claim the node uses, recorded before its first prepare call as the kubelet does: a
    pod deleted before any prepare succeeded still gets its claims unprepared."""

    ref: ClaimRef
    drivers: tuple[str, ...]  # of the allocation: these are asked to unprepare
    devices: dict[str, tuple[PreparedDevice, ...]]  # by driver, once prepared
    pod_uids: set[str]

    @property
    def prepared(self) -> bool:
        return all(driver in self.devices for driver in self.drivers)

    def snapshot(self) -> PreparedClaim:
        devices = tuple(d for driver in sorted(self.devices) for d in self.devices[driver])
        return PreparedClaim(
            self.ref.namespace, self.ref.name, self.ref.uid, devices, frozenset(self.pod_uids)
        )


@dataclasses.dataclass(frozen=True)
class _Retry:
    """A socket whose registration failed: tried again at ``due`` unless it was re-created."""

    ident: tuple[int, int]
    due: float
    backoff: float


@dataclasses.dataclass
class _StartedPod:
    namespace: str
    name: str
    edits: dict[str, kube.Body]  # by container name


class _DraNode:
    """The DRA state of one node. Prepares and unprepares run in one worker task, one pod at
    a time (the kubelet serialises them too), so plugin answers never interleave."""

    def __init__(
        self,
        api: kube.Kube,
        settings: DraSettings,
        name: str,
        kubelet_dir: Path,
        run_pod: RunPod,
        finish_deletion: FinishDeletion,
    ) -> None:
        self.api, self.settings, self.name = api, settings, name
        self.registry_dir = kubelet_dir / "plugins_registry"
        self.cdi_dir = settings.cdi_dir or kubelet_dir / "cdi"
        self._run_pod, self._finish_deletion = run_pod, finish_deletion
        self.events = _EventRecorder(api, name)
        self.plugins: dict[Path, _Plugin] = {}  # by registration socket, in registration order
        self._sockets: dict[Path, tuple[int, int]] = {}  # registered or given up on
        self._retries: dict[Path, _Retry] = {}
        self._wipes: dict[str, asyncio.Task[None]] = {}
        self.claims: dict[str, _ClaimRecord] = {}  # survives a kubelet restart
        self.pods: dict[str, kube.Body] = {}  # pods with claims bound here, by UID
        self.started: dict[str, _StartedPod] = {}
        self.wake = asyncio.Event()
        self.discovery_lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"kubelet-standin-dra-{self.name}-{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # ---- registry view ---------------------------------------------------------------------

    def plugin_for(self, driver: str) -> _Plugin | None:
        """The newest connected instance, else the newest one (the kubelet's heuristic)."""
        instances = [p for p in self.plugins.values() if p.driver == driver]
        connected = [p for p in instances if p.connected]
        return (connected or instances or [None])[-1]

    def registered(self) -> dict[str, str]:
        return {p.driver: p.service for p in self.plugins.values()}

    # ---- discovery -------------------------------------------------------------------------

    async def discover_forever(self) -> NoReturn:
        while True:
            async with self.discovery_lock:
                try:
                    await self.discover_once()
                except Exception:  # a broken plugin must not end discovery
                    log.exception("node %s: plugin discovery failed", self.name)
            await asyncio.sleep(self.settings.discovery_seconds)

    async def discover_once(self) -> None:
        present = {
            path: ident
            for path in sorted(self.registry_dir.glob("*.sock"))
            if (ident := _socket_identity(path)) is not None
        }
        for path, ident in list(self._sockets.items()):
            if present.get(path) != ident:
                await self._deregister(path)
        for path in [p for p in self._retries if p not in present]:
            del self._retries[path]
        now = asyncio.get_running_loop().time()
        for path, ident in present.items():
            if path in self._sockets:
                continue
            retry = self._retries.get(path)
            if retry is None or retry.ident != ident:  # new, or re-created: from scratch
                await self._register(path, ident, backoff=0.0)
            elif now >= retry.due:
                await self._register(path, ident, backoff=retry.backoff)

    async def _register(self, socket: Path, ident: tuple[int, int], backoff: float) -> None:
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        try:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                log.info("node %s: GetInfo at %s failed, retrying: %s", self.name, socket, exc)
                self._retry_later(socket, ident, backoff)
                return
            endpoint = info.endpoint or str(socket)
            error = registration_error(
                info.type, info.name, endpoint, list(info.supported_versions), str(socket)
            )
            if error is not None:
                self._retry_later(socket, ident, backoff)  # the kubelet retries these too
            elif any(
                p.driver == info.name and p.endpoint == endpoint for p in self.plugins.values()
            ):
                error = (
                    "RegisterPlugin error -- plugin registration failed with err: endpoint "
                    f"{endpoint} already registered for DRA driver plugin {info.name}"
                )
                self._sockets[socket] = ident  # not retried until the socket is re-created
            else:
                service = choose_service(info.supported_versions)
                self._add_plugin(_Plugin(info.name, service, endpoint, socket), ident)
            await self._notify(stub, socket, error)
        finally:
            await channel.close()

    def _retry_later(self, socket: Path, ident: tuple[int, int], backoff: float) -> None:
        delay = min(max(backoff * 2, self.settings.discovery_seconds), _REGISTRATION_BACKOFF_MAX)
        self._retries[socket] = _Retry(ident, asyncio.get_running_loop().time() + delay, delay)

    async def _notify(self, stub: Any, socket: Path, error: str | None) -> None:
        if error is not None:
            log.warning("node %s: plugin at %s refused: %s", self.name, socket, error)
        status = reg_pb.RegistrationStatus(plugin_registered=error is None, error=error or "")
        try:
            await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT)
        except grpc.aio.AioRpcError as exc:  # the kubelet keeps the registration as well
            log.warning("node %s: NotifyRegistrationStatus at %s: %s", self.name, socket, exc)

    def _add_plugin(self, plugin: _Plugin, ident: tuple[int, int]) -> None:
        self._retries.pop(plugin.socket, None)
        self._sockets[plugin.socket] = ident
        self.plugins[plugin.socket] = plugin
        plugin.monitor = self.spawn(self._monitor(plugin), f"connection-{plugin.driver}")
        log.info(
            "node %s: registered DRA driver %s at %s via %s",
            self.name,
            plugin.driver,
            plugin.endpoint,
            plugin.service,
        )
        self._sync_driver(plugin.driver)
        self.wake.set()  # pods waiting for this driver are retried now

    async def _deregister(self, socket: Path) -> None:
        self._sockets.pop(socket, None)
        plugin = self.plugins.pop(socket, None)
        if plugin is None:
            return
        log.info("node %s: DRA driver %s deregistered (%s gone)", self.name, plugin.driver, socket)
        await plugin.close()
        self._sync_driver(plugin.driver)

    async def drop_plugins(self) -> None:
        for socket in list(self.plugins):
            plugin = self.plugins.pop(socket)
            await plugin.close()
        self._sockets.clear()
        self._retries.clear()
        for task in self._wipes.values():
            task.cancel()
        self._wipes.clear()

    async def _monitor(self, plugin: _Plugin) -> None:
        """Track whether the DRA channel is connected; asking for a connection on every change
        makes gRPC notice a plugin that comes back, as the kubelet's Connect() does."""
        state = plugin.channel.get_state(try_to_connect=True)
        while True:
            connected = state == grpc.ChannelConnectivity.READY
            if connected != plugin.connected:
                plugin.connected = connected
                self._sync_driver(plugin.driver)
            await plugin.channel.wait_for_state_change(state)
            state = plugin.channel.get_state(try_to_connect=True)

    # ---- slice wiping ----------------------------------------------------------------------

    def _sync_driver(self, driver: str) -> None:
        """Cancel a pending wipe when an instance is connected, else make sure one is due."""
        if any(p.connected for p in self.plugins.values() if p.driver == driver):
            task = self._wipes.pop(driver, None)
            if task is not None:
                task.cancel()
        elif driver not in self._wipes:
            self._wipes[driver] = self.spawn(self._wipe_later(driver), f"wipe-{driver}")

    async def _wipe_later(self, driver: str) -> None:
        await asyncio.sleep(self.settings.wipe_delay_seconds)
        log.info("node %s: no instance of %s connected, wiping its slices", self.name, driver)
        await self.wipe_slices(driver)
        self._wipes.pop(driver, None)

    async def wipe_slices(self, driver: str | None = None) -> None:
        """Delete the node's ResourceSlices (of one driver), retrying until the API agrees."""
        selector = f"spec.nodeName={self.name}"
        if driver:
            selector += f",spec.driver={driver}"
        delay = 0.5
        while True:
            try:
                await self.api.request(
                    "DELETE",
                    RESOURCE_SLICES,
                    body={"kind": "DeleteOptions", "apiVersion": "v1"},
                    query={"fieldSelector": selector},
                )
                return
            except Exception as exc:  # the API server may be restarting: retry like a kubelet
                log.warning("node %s: wiping slices (%s) failed: %s", self.name, selector, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _WIPE_BACKOFF_MAX)

    # ---- pods ------------------------------------------------------------------------------

    def observe(self, pod: kube.Body) -> None:
        self.pods[pod["metadata"]["uid"]] = pod
        self.wake.set()

    def forget(self, uid: str) -> None:
        if self.pods.pop(uid, None) is not None:
            self.wake.set()  # its claims may now be unused
        self.started.pop(uid, None)
        self.events.forget(uid)

    async def work_forever(self) -> NoReturn:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.settings.retry_seconds)
            self.wake.clear()
            await self.sync_all()

    async def sync_all(self) -> None:
        for uid, pod in list(self.pods.items()):
            if uid not in self.pods:
                continue  # forgotten while an earlier pod was synced
            try:
                if pod["metadata"].get("deletionTimestamp"):
                    await self.terminate(pod)
                elif uid not in self.started:
                    await self.start(pod)
            except Exception:  # one pod must not stop the others
                log.exception("node %s: syncing pod %s failed", self.name, uid)
        try:
            await self.unprepare_orphans()
        except Exception:
            log.exception("node %s: unpreparing claims of vanished pods failed", self.name)

    def active_pod_uids(self) -> set[str]:
        return {u for u, p in self.pods.items() if not p["metadata"].get("deletionTimestamp")}

    # ---- prepare ---------------------------------------------------------------------------

    async def start(self, pod: kube.Body) -> None:
        meta = pod["metadata"]
        try:
            by_pod_claim = await self.prepare(pod)
            edits = await self.container_edits(pod, by_pod_claim)
        except NotReadyYet as exc:
            log.debug(
                "node %s: pod %s/%s waits: %s", self.name, meta["namespace"], meta["name"], exc
            )
            return
        except DraFailure as exc:
            await self.events.warn(pod, FAILED_PREPARE, prepare_message(str(exc)))
            return
        if pod.get("status", {}).get("phase") != "Running":
            await self._run_pod(self.name, pod)
        self.started[meta["uid"]] = _StartedPod(meta["namespace"], meta["name"], edits)

    async def prepare(self, pod: kube.Body) -> dict[str, list[PreparedDevice]]:
        """Prepare the pod's claims not prepared yet; return devices by pod claim name."""
        wanted = pod_claims(pod)
        if wanted is None:
            raise NotReadyYet("a claim from a template is not named in the pod status yet")
        claims = {pc.pod_claim_name: await self._fetch_claim(pod, pc) for pc in wanted}
        uid = pod["metadata"]["uid"]
        # Every driver must be registered first: a pod that never reached one is not held
        # up by it on deletion (the kubelet checks this before it records anything, too).
        for claim in claims.values():
            for driver in claim_drivers(claim):
                self._plugin_or_fail(driver)
        records: dict[str, _ClaimRecord] = {}
        todo: dict[str, list[ClaimRef]] = {}
        for name, claim in claims.items():
            ref = _claim_ref(claim)
            # Recorded before the call: whatever happens to the pod now, its claims will be
            # unprepared (the kubelet checkpoints its claim info before preparing, too).
            record = self.claims.setdefault(
                ref.uid, _ClaimRecord(ref, tuple(claim_drivers(claim)), {}, set())
            )
            record.pod_uids.add(uid)
            records[name] = record
            for driver in record.drivers:
                if driver not in record.devices:
                    todo.setdefault(driver, []).append(ref)
        for driver in sorted(todo):
            for claim_uid, devices in (await self._prepare_with(driver, todo[driver])).items():
                self.claims[claim_uid].devices[driver] = devices
        return {
            name: [d for devices in record.devices.values() for d in devices]
            for name, record in records.items()
        }

    async def _fetch_claim(self, pod: kube.Body, pod_claim: PodClaim) -> kube.Body:
        ns = pod["metadata"]["namespace"]
        path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{pod_claim.claim_name}"
        try:
            claim = await self.api.get(path)
        except kube.ApiError as exc:
            message = exc.body.get("message", exc) if isinstance(exc.body, dict) else exc
            raise DraFailure(f"fetch ResourceClaim {pod_claim.claim_name}: {message}") from None
        check_claim_for_pod(pod, claim, pod_claim.from_template)
        return claim

    async def _prepare_with(
        self, driver: str, refs: list[ClaimRef]
    ) -> dict[str, tuple[PreparedDevice, ...]]:
        plugin = self._plugin_or_fail(driver)
        results = await plugin.prepare(refs, self.settings.call_timeout_seconds)
        check_results("NodePrepareResources", refs, {u: r[0] for u, r in results.items()})
        return {u: r[1] for u, r in results.items()}

    def _plugin_or_fail(self, driver: str) -> _Plugin:
        if not driver:
            raise DraFailure("DRA driver name is empty")
        plugin = self.plugin_for(driver)
        if plugin is None:
            raise DraFailure(f"DRA driver {driver} is not registered")
        return plugin

    async def container_edits(
        self, pod: kube.Body, by_pod_claim: Mapping[str, Sequence[PreparedDevice]]
    ) -> dict[str, kube.Body]:
        """Resolve every CDI ID the pod's containers get, as the runtime would on start."""
        index = index_cdi_specs(await asyncio.to_thread(load_cdi_specs, self.cdi_dir))
        # Every returned ID must resolve, even one no container references: the plugin
        # promised it, and a runtime given it would fail the container.
        every_id = [i for ds in by_pod_claim.values() for d in ds for i in d.cdi_device_ids]
        resolve_cdi_ids(index, every_id, self.cdi_dir)
        edits: dict[str, kube.Body] = {}
        for container in pod_containers(pod):
            ids = container_cdi_ids(container, by_pod_claim)
            edits[container["name"]] = merge_container_edits(
                resolve_cdi_ids(index, ids, self.cdi_dir)
            )
        return edits

    # ---- unprepare -------------------------------------------------------------------------

    async def terminate(self, pod: kube.Body) -> None:
        uid = pod["metadata"]["uid"]
        others = self.active_pod_uids() - {uid}
        mine = [r for r in self.claims.values() if uid in r.pod_uids]
        for record in mine:
            if record.pod_uids & others:
                record.pod_uids.discard(uid)  # still used by another pod: stays prepared
        unused = [r for r in mine if not r.pod_uids & others]
        try:
            await self.unprepare(unused)
        except DraFailure as exc:
            await self.events.warn(pod, FAILED_UNPREPARE, unprepare_message(str(exc)))
            return
        try:
            await self._finish_deletion(pod)
        except kube.ApiError as exc:
            if not exc.conflict:  # 409: the UID precondition failed, the pod is gone already
                raise
        self.forget(uid)

    async def unprepare(self, records: Sequence[_ClaimRecord]) -> None:
        """Unprepare claims per driver; drop them from the record once all drivers agreed."""
        by_driver: dict[str, list[ClaimRef]] = {}
        for record in records:
            for driver in record.drivers:
                by_driver.setdefault(driver, []).append(record.ref)
        for driver in sorted(by_driver):
            plugin = self._plugin_or_fail(driver)
            refs = by_driver[driver]
            errors = await plugin.unprepare(refs, self.settings.call_timeout_seconds)
            check_results("NodeUnprepareResources", refs, errors)
        for record in records:
            self.claims.pop(record.ref.uid, None)

    async def unprepare_orphans(self) -> None:
        """Claims whose pods all vanished without terminating here (force-deleted)."""
        orphans = [r for r in self.claims.values() if not r.pod_uids & set(self.pods)]
        if orphans:
            try:
                await self.unprepare(orphans)
            except DraFailure as exc:
                log.warning("node %s: %s", self.name, unprepare_message(str(exc)))


def _claim_ref(claim: kube.Body) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


# --- the public face ------------------------------------------------------------------------


class DraStandIn:
    """The DRA side of ``KubeletStandIn``, reached as ``kubelet.dra``.

    Tests use it to look at what a kubelet would know: which drivers registered with which
    service, which claims are prepared, which CDI edits each container got, and to simulate
    kubelet restarts and node reboots.
    """

    def __init__(
        self,
        api: kube.Kube,
        settings: DraSettings,
        kubelet_dirs: Mapping[str, Path],
        run_pod: RunPod,
        finish_deletion: FinishDeletion,
    ) -> None:
        self.settings = settings
        self._nodes = {
            name: _DraNode(api, settings, name, path, run_pod, finish_deletion)
            for name, path in kubelet_dirs.items()
        }

    async def start(self) -> None:
        """Wipe every node's slices (as a starting kubelet does), then discover and work."""
        for node in self._nodes.values():
            node.cdi_dir.mkdir(parents=True, exist_ok=True)
            await node.wipe_slices()
            node.spawn(node.discover_forever(), "discovery")
            node.spawn(node.work_forever(), "pods")

    async def stop(self) -> None:
        """Cancel every task this part started and close every plugin connection."""
        for node in self._nodes.values():
            tasks = list(node.tasks)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await node.drop_plugins()

    # ---- fed by the node part --------------------------------------------------------------

    def sync_pod(self, node: str, pod: kube.Body) -> None:
        """A pod with claims bound to ``node`` was seen: prepare it, or unprepare it if it is
        terminating. Returns at once; the node's worker does the rest."""
        self._nodes[node].observe(pod)

    def pod_deleted(self, node: str, pod: kube.Body) -> None:
        self._nodes[node].forget(pod["metadata"]["uid"])

    def pods_listed(self, node: str, pods: Sequence[kube.Body]) -> None:
        """After a relist: pods not in it are gone (their deletion events were missed)."""
        present = {p["metadata"]["uid"] for p in pods}
        dra_node = self._nodes[node]
        for uid in [u for u in dra_node.pods if u not in present]:
            dra_node.forget(uid)

    # ---- for tests -------------------------------------------------------------------------

    def cdi_dir(self, node: str) -> Path:
        """Where the plugin under test must write CDI specs for ``node``."""
        return self._nodes[node].cdi_dir

    def registry_dir(self, node: str) -> Path:
        return self._nodes[node].registry_dir

    def registered_drivers(self, node: str) -> dict[str, str]:
        """Driver name -> negotiated service (``v1.DRAPlugin`` or ``v1beta1.DRAPlugin``)."""
        return self._nodes[node].registered()

    def connected(self, node: str, driver: str) -> bool:
        """Whether an instance of ``driver`` has a connected gRPC channel."""
        return any(p.connected for p in self._nodes[node].plugins.values() if p.driver == driver)

    async def wait_registered(
        self,
        node: str,
        driver: str,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 - a deadline for the whole wait
    ) -> str:
        """Until ``driver`` is registered on ``node``; returns the negotiated service."""
        service: str = await _waiting.eventually(
            lambda: self.registered_drivers(node).get(driver),
            timeout=timeout,
            interval=0.1,
            what=f"DRA driver {driver} registered on {node}",
        )
        return service

    def prepared_claims(self, node: str) -> dict[str, PreparedClaim]:
        """The record of prepared claims on ``node``, by claim UID."""
        claims = self._nodes[node].claims
        return {uid: r.snapshot() for uid, r in claims.items() if r.prepared}

    def container_edits(self, namespace: str, pod: str, container: str) -> kube.Body:
        """The merged CDI containerEdits the container got when the pod started."""
        for node in self._nodes.values():
            for started in node.started.values():
                if (started.namespace, started.name) == (namespace, pod):
                    if container not in started.edits:
                        raise KeyError(f"pod {namespace}/{pod} has no container {container!r}")
                    return started.edits[container]
        raise KeyError(f"pod {namespace}/{pod} was not started by the DRA stand-in")

    def container_env(self, namespace: str, pod: str, container: str) -> dict[str, str]:
        """The environment the container got from CDI: ``{"GPU_DEVICE_0": "gpu-0"}``."""
        return env_of(self.container_edits(namespace, pod, container))

    async def restart_kubelet(self, node: str) -> None:
        """Simulate a kubelet restart: connections dropped, the node's slices wiped, sockets
        discovered again. Prepared claims and running pods are kept, like the checkpoint."""
        await self._restart(node, reboot=False)

    async def reboot(self, node: str) -> None:
        """A kubelet restart after a reboot: every file in the CDI directory is gone and the
        containers with it. The kubelet then starts the pods again and, having only its
        checkpoint (not which claims it prepared since boot), asks the plugins to prepare every
        recorded claim again before it resolves the CDI IDs afresh."""
        await self._restart(node, reboot=True)

    async def _restart(self, node: str, *, reboot: bool) -> None:
        dra_node = self._nodes[node]
        async with dra_node.discovery_lock:  # no registration sneaks in half way
            await dra_node.drop_plugins()
            if reboot:
                await asyncio.to_thread(_empty_dir, dra_node.cdi_dir)
                dra_node.started.clear()
                for record in dra_node.claims.values():
                    record.devices.clear()
            await dra_node.wipe_slices()
        dra_node.wake.set()

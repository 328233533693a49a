"""Why is a ResourceClaim pending? The pure reasoning behind the controller's explanations.

Owns: given API bodies (the claim, the pod that uses it, DeviceClasses, ResourceSlices, the
other claims, Nodes), say which of the tutorial's four pieces is missing (class, devices,
node, driver), per request and for the claim as a whole, in the plain words the controller
posts as a Warning Event and ``dra-gpu explain`` prints. Selectors are evaluated through
``dra_gpu.cel`` the way the scheduler does: class selectors first, then the request's, over
complete pools at their highest generation only.

Must not: do any I/O (no client, no clock, no logging, no files) or change its inputs; dicts
in, frozen dataclasses out. It does not allocate and is not a second scheduler: it looks at
each request on its own (constraints such as ``matchAttribute``, requests competing for one
device and the pod's other resources are not modelled), so its answer is "the first missing
piece we can see". The output is deterministic (devices in natural order, bounded lists), so
the controller can post "the same reason once".

The cluster side of the reasoning is a ``World``, built once and read by every claim's check:
``explain_claim`` builds one from lists for one claim; the controller keeps a ``Layout`` (devices
in order, per selector list their outcomes) until a pool changes and builds a ``World`` per pass
over its view's indexes, and calls ``explain`` for the claims whose inputs changed. Requests
alike (same request, same pod constraints, same classes) share one check within a World.

Partitions and shares (``partitions``): a device whose counters the allocated partitions used
up, or a shared device without room for the request's share, is not free; the message says
which counters of which set are short and who holds them, or how much of the shared capacity
is left ("node-01/gpu-0 needs memory-slice 8 of gpu-0-counters, 4 free (held by ns/a)",
"node-01/gpu-1 shared: 30Gi of 80Gi memory free, the request asks 40Gi"). Claims in that
situation are explained as ``DevicesAllocated``: other claims hold what the device needs.

``Reason`` lists the vocabulary in order of importance: when several requests miss pieces,
the claim's message names the most important first (class > selectors > devices published >
fit > allocation > node > driver).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from dra_gpu import cel
from dra_gpu.controller import partitions, published, selections
from dra_gpu.controller.published import DeviceKey
from dra_gpu.controller.selections import ListKey, Outcome, Selections
from dra_gpu.resource import names

Body = Mapping[str, Any]

PIECE_NAMES = ("class", "devices", "node", "driver")
PREPARE_FAILED = "FailedPrepareDynamicResources"  # the kubelet's Event reason
LIST_LIMIT = 3
"""Devices named per kind of problem in a message; the rest are counted ("and 7 more ...")."""
REQUEST_LIMIT = 3
"""Failing requests named in a claim's message; the rest are counted."""
MESSAGE_LIMIT = 1000
"""Event messages are capped at 1024 bytes by the API; longer ones are cut, ending in "…"."""
NOT_CHECKED = "not checked (an earlier piece is missing)"


class Reason(enum.StrEnum):
    """Short machine reasons for Events and metric labels, most important first."""

    CLAIM_DELETING = "ClaimDeleting"
    DEVICE_CLASS_MISSING = "DeviceClassMissing"
    SELECTOR_INVALID = "SelectorInvalid"  # a class or request selector does not compile
    NO_DEVICES_PUBLISHED = "NoDevicesPublished"  # no device of the class is published
    POOL_INCOMPLETE = "PoolIncomplete"  # ...except possibly in pools still being written
    SELECTOR_ERROR = "SelectorError"  # CEL runtime error on a device: the scheduler errors out
    NO_DEVICE_FITS = "NoDeviceFits"  # devices of the class exist, none passes the selectors
    NOT_ENOUGH_DEVICES = "NotEnoughDevices"  # some fit, but never `count` of them on one node
    DEVICES_ALLOCATED = "DevicesAllocated"  # enough fit, but other claims hold them
    DEVICES_TAINTED = "DevicesTainted"  # enough fit, but taints the claim does not tolerate
    NODE_EXCLUDED = "NodeExcluded"  # free fitting devices only on nodes the pod cannot use
    NO_COMMON_NODE = "NoCommonNode"  # every request fits somewhere, but not all on one node
    DRIVER_NOT_READY = "DriverNotReady"  # the kubelet could not prepare (a PrepareFailure)
    SATISFIABLE = "Satisfiable"  # no missing piece found: it is the scheduler's move
    ALLOCATED = "Allocated"  # nothing to explain
    PREPARED = "Prepared"  # a claim explained as DriverNotReady was prepared: its pod runs
    FITS = "Fits"  # per request only: this request can be satisfied on its own


_SEVERITY = {reason: rank for rank, reason in enumerate(Reason)}


class Verdict(enum.StrEnum):
    """What one published device is to one request; checks run in this order."""

    OTHER_CLASS = "other-class"  # a class selector rules it out: not a candidate at all
    ERROR = "error"  # a selector failed to evaluate on it
    MISMATCH = "mismatch"  # of the class, but a request selector rules it out
    ALLOCATED = "allocated"  # passes, but another claim holds it
    COUNTERS = "counters"  # passes, but allocated partitions used up counters it consumes
    CAPACITY = "capacity"  # passes, a shared device, but its shares leave too little
    TAINTED = "tainted"  # passes, but has a taint the request does not tolerate
    EXCLUDED = "excluded"  # the pod cannot run on its node
    FITS = "fits"


@dataclasses.dataclass(frozen=True)
class Piece:
    """One of the tutorial's four pieces: class, devices, node, driver."""

    name: str
    satisfied: bool | None
    """True: present; False: missing; None: not checked because an earlier piece is missing."""
    reason: str

    @property
    def status(self) -> str:
        return {True: "OK", False: "NO", None: "--"}[self.satisfied]


@dataclasses.dataclass(frozen=True)
class DeviceVerdict:
    """One published device as one request sees it."""

    driver: str
    pool: str
    device: str
    node: str | None
    """The node the device is attached to; None for devices of allNodes/nodeSelector slices."""
    verdict: Verdict
    text: str
    """Plain words, starting with the device: "node-01/gpu-1 has memory 8Gi, needs >= 24Gi"."""

    @property
    def label(self) -> str:
        return f"{self.node or self.pool}/{self.device}"


@dataclasses.dataclass(frozen=True)
class RequestExplanation:
    """One request (``gpu``) or subrequest (``gpu/large``) of the claim."""

    request: str
    device_class: str
    reason: Reason
    """``Reason.FITS`` when the request can be satisfied on its own."""
    message: str
    """``request gpu: ...`` in plain words; for a fitting request, where it fits."""
    pieces: tuple[Piece, ...]
    """Always the four pieces, in ``PIECE_NAMES`` order."""
    devices: tuple[DeviceVerdict, ...] = ()
    """Every device of the complete pools, in natural order (empty if none was evaluated)."""
    notes: tuple[str, ...] = ()
    """Incomplete pools that may hold devices of the class."""
    nodes: tuple[str, ...] = ()
    """Nodes on which the request can be satisfied, sorted; empty when it cannot."""
    subrequests: tuple[RequestExplanation, ...] = ()
    """For ``firstAvailable``: each alternative, in the claim's order."""

    @property
    def satisfied(self) -> bool:
        return self.reason == Reason.FITS


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why one claim is (or is not) pending."""

    claim: str
    """``namespace/name``."""
    reason: Reason
    message: str
    """One plain-words line for the Event: the most important missing piece first."""
    pieces: tuple[Piece, ...]
    """The four pieces for the whole claim (all requests), in ``PIECE_NAMES`` order."""
    requests: tuple[RequestExplanation, ...] = ()

    @property
    def missing(self) -> bool:
        """Whether a piece is missing, i.e. whether a Warning Event is due."""
        return self.reason not in (Reason.ALLOCATED, Reason.SATISFIABLE, Reason.PREPARED)


@dataclasses.dataclass(frozen=True)
class PrepareFailure:
    """The kubelet's word that it could not prepare a pod's claims: its latest
    ``FailedPrepareDynamicResources`` Event on the pod, which only the caller can see."""

    message: str
    """What the kubelet said, without its "Failed to prepare dynamic resources: " preamble:
    "DRA driver gpu.example.com is not registered", or the agent's error for one claim."""
    node: str | None = None
    """Where (the kubelet's host); None: unknown, the pod's node is meant."""
    since: str | None = None
    """When the kubelet first said it (RFC 3339), across its retries."""
    pod_uid: str = ""

    @functools.cached_property
    def driver(self) -> str | None:
        """The driver the kubelet names as missing, if it names one."""
        found = _NOT_REGISTERED.search(self.message)
        return found[1] if found else None

    @functools.cached_property
    def claim(self) -> str | None:
        """``namespace/name`` of the one claim the kubelet names, if it names one."""
        found = _FOR_CLAIM.search(self.message)
        return found[1] if found else None

    def concerns(self, claim: Body, driver: str) -> bool:
        """Whether this failure is ``driver``'s part of ``claim``: the claim is allocated with a
        device of ``driver``, and the kubelet names no other claim and no other driver."""
        meta = claim.get("metadata") or {}
        if self.claim is not None and self.claim != f"{meta.get('namespace')}/{meta.get('name')}":
            return False
        if self.driver is not None and self.driver != driver:
            return False
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        return any(r.get("driver") == driver for r in results)


_PREAMBLES = ("Failed to prepare dynamic resources: ", "prepare dynamic resources: ")
_NOT_REGISTERED = re.compile(r"DRA driver (\S+) is not registered")
_UNAVAILABLE = "code = Unavailable"
"""gRPC's status when the kubelet cannot reach a registered plugin's socket (for 30 s after the
plugin goes, the kubelet keeps it registered, in case it is only restarting)."""
_FOR_CLAIM = re.compile(r"for claim ([a-z0-9.-]+/[a-z0-9.-]+)")


def prepare_failure(event: Body) -> PrepareFailure | None:
    """The ``PrepareFailure`` a kubelet Event says (core/v1 or events.k8s.io shape, as a
    core/v1 watch shows either); None when it is not a ``FailedPrepareDynamicResources``."""
    if event.get("reason") != PREPARE_FAILED:
        return None
    message = str(event.get("message") or event.get("note") or "")
    for preamble in _PREAMBLES:
        message = message.removeprefix(preamble)
    node = (event.get("source") or {}).get("host") or event.get("reportingInstance") or None
    since = event.get("firstTimestamp") or event.get("eventTime") or event.get("lastTimestamp")
    pod_uid = str((event.get("involvedObject") or event.get("regarding") or {}).get("uid") or "")
    return PrepareFailure(message, str(node) if node else None, since or None, pod_uid)


def driver_not_ready(failure: PrepareFailure, drivers: Sequence[str], node: str | None) -> str:
    """The driver piece in words: which driver, on which node, since when, what the kubelet
    said, and for "not registered" where to look."""
    who = f"driver {', '.join(drivers)}" if drivers else "the driver"
    where = failure.node or node
    text = f"{who}{f' on {where}' if where else ''} has not prepared the claim"
    if failure.since:
        text += f" since {failure.since}"
    text += f"; the kubelet says: {failure.message}"
    on = f" on {where}" if where else ""
    if failure.driver is not None:
        text += (
            f" (the node agent of {failure.driver} is not running{on}, or has not registered "
            "with its kubelet yet)"
        )
    elif _UNAVAILABLE in failure.message:  # registered, but its socket does not answer
        agents = ", ".join(drivers) or "the driver"
        text += f" (the node agent of {agents}{on} does not answer: stopped, or restarting)"
    return _bounded(text)


def explain_claim(
    claim: Body,
    *,
    pod: Body | None = None,
    classes: Mapping[str, Body],
    slices: Sequence[Body],
    claims: Sequence[Body],
    nodes: Mapping[str, Body],
    prepare_failure: PrepareFailure | None = None,
) -> Explanation:
    """Explain ``claim`` against the cluster as the caller's caches show it.

    ``classes`` and ``nodes`` map names to bodies; ``slices`` are all ResourceSlices (every
    driver); ``claims`` may include ``claim`` itself (it never counts as holding a device).
    ``pod`` is the pod that uses the claim, if known: without it, tolerations, nodeSelector,
    node affinity and ``nodeName`` are not checked. ``prepare_failure`` is the kubelet's
    latest FailedPrepareDynamicResources on the pod (e.g. "DRA driver gpu.example.com is not
    registered"), which only the caller can see, in Events: the driver piece.
    """
    if (claim.get("status") or {}).get("allocation") or (claim.get("metadata") or {}).get(
        "deletionTimestamp"
    ):
        world = World(Layout(()), published.HolderIndex(), nodes, slices)  # not read
    else:
        world = build_world(slices, claims, nodes)
    return explain(claim, world, classes=classes, pod=pod, prepare_failure=prepare_failure)


def explain(
    claim: Body,
    world: World,
    *,
    classes: Mapping[str, Body],
    pod: Body | None = None,
    prepare_failure: PrepareFailure | None = None,
    detail: bool = True,
) -> Explanation:
    """``explain_claim`` against a World built beforehand, shared by many claims.

    ``detail=False`` leaves out each request's ``devices`` (every published device, with its
    verdict): the reason, message and pieces are the same, at a fraction of the cost.
    """
    meta = claim.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    if (claim.get("status") or {}).get("allocation"):
        return _explain_allocated(name, claim, pod, classes, world.slice_list(), prepare_failure)
    if meta.get("deletionTimestamp"):
        return Explanation(
            name, Reason.CLAIM_DELETING, f"resourceclaim {name} is being deleted", _unchecked()
        )
    scope = world.scope(claim, pod, detail=detail)
    devices_spec = (claim.get("spec") or {}).get("devices") or {}
    requests = tuple(
        _explain_request(r, scope, classes) for r in devices_spec.get("requests") or []
    )
    return _summarize(name, requests, bool(devices_spec.get("constraints")), prepare_failure, pod)


def build_world(
    slices: Iterable[Body],
    claims: Iterable[Body],
    nodes: Mapping[str, Body],
    *,
    selections: Selections | None = None,
) -> World:
    """The World of ``explain_claim``: all ResourceSlices, all claims, Nodes by name."""
    slices = list(slices)
    layout = Layout(published.read_pools(slices), selections)
    return World(layout, published.HolderIndex.of(claims), nodes, slices)


def format_pieces(explanation: Explanation) -> str:
    """The CLI's text: one line per piece, each ending in a newline, e.g.
    ``class    OK   device class gpu-inferencia exists``."""
    return "".join(f"{p.name:<8} {p.status:<4} {p.reason}\n" for p in explanation.pieces)


# --- the claim as a whole ----------------------------------------------------------------


def _summarize(
    name: str,
    requests: tuple[RequestExplanation, ...],
    has_constraints: bool,
    prepare_failure: PrepareFailure | None,
    pod: Body | None,
) -> Explanation:
    pieces = _combine_pieces([r.pieces for r in requests], any_of=False)
    not_ready = None
    if prepare_failure is not None:
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        not_ready = driver_not_ready(prepare_failure, (), node)
        pieces = _with_piece(pieces, Piece("driver", False, not_ready))
    failing = sorted((r for r in requests if not r.satisfied), key=lambda r: _SEVERITY[r.reason])
    if failing:
        message = _join_messages([r.message for r in failing])
        return Explanation(name, failing[0].reason, message, pieces, requests)
    common = sorted(set.intersection(*(set(r.nodes) for r in requests))) if requests else []
    if requests and not common:
        where = "; ".join(f"request {r.request} fits on {_names(r.nodes)}" for r in requests)
        message = _bounded(f"no node satisfies every request: {where}")
        pieces = _with_piece(pieces, Piece("node", False, message))
        return Explanation(name, Reason.NO_COMMON_NODE, message, pieces, requests)
    if not_ready is not None:
        return Explanation(name, Reason.DRIVER_NOT_READY, not_ready, pieces, requests)
    if not requests:
        return Explanation(name, Reason.SATISFIABLE, "the claim requests no devices", pieces)
    message = f"no missing piece found: every request can be satisfied on {_names(common)}"
    if has_constraints:
        message += " (constraints are not checked)"
    return Explanation(name, Reason.SATISFIABLE, message, pieces, requests)


def _explain_allocated(
    name: str,
    claim: Body,
    pod: Body | None,
    classes: Mapping[str, Body],
    slices: Sequence[Body],
    prepare_failure: PrepareFailure | None,
) -> Explanation:
    """An allocated claim: the scheduler's part is done; only the kubelet's may be missing."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    node = ((pod or {}).get("spec") or {}).get("nodeName") or _allocation_node(allocation)
    attached = _attached_nodes(slices)
    labels = [
        f"{attached.get(_result_key(r)) or r.get('pool')}/{r.get('device')}"
        for r in sorted(results, key=lambda r: (_natural(str(r.get("pool"))), _result_key(r)))
    ]
    allocated = f"allocated {', '.join(labels)}" if labels else "allocated"
    named = class_names(claim)
    class_reason = (
        f"device class {', '.join(named)} exists"
        if all(c in classes for c in named)
        else f"allocated with device class {', '.join(named)}"
    )
    if ((pod or {}).get("spec") or {}).get("nodeName"):
        node_reason = f"the pod is bound to {node}"
    else:
        node_reason = f"allocated for {node}" if node else "allocated for any node"
    drivers = sorted({str(r.get("driver")) for r in results})
    published = set(_slice_nodes(slices))
    not_ready = driver_not_ready(prepare_failure, drivers, node) if prepare_failure else None
    if not_ready is not None:
        driver = Piece("driver", False, not_ready)
    elif node and drivers and all((d, node) in published for d in drivers):
        driver = Piece("driver", True, f"{', '.join(drivers)} published devices for {node}")
    else:
        driver = Piece("driver", True, "no prepare error reported")
    pieces = (
        Piece("class", True, class_reason),
        Piece("devices", True, allocated),
        Piece("node", True, node_reason),
        driver,
    )
    if not_ready is not None:
        return Explanation(name, Reason.DRIVER_NOT_READY, not_ready, pieces)
    return Explanation(name, Reason.ALLOCATED, allocated + (f" on {node}" if node else ""), pieces)


def prepared(claim: Body, pod: Body, classes: Mapping[str, Body]) -> Explanation:
    """The all-clear for a claim once explained as ``DRIVER_NOT_READY``: its pod left Pending,
    so the driver prepared it."""
    meta = claim.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    base = _explain_allocated(name, claim, pod, classes, (), None)
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    drivers = sorted({str(r.get("driver")) for r in results.get("results") or []})
    pod_meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    message = (
        f"driver {', '.join(drivers) or '?'}{f' on {node}' if node else ''} prepared the claim: "
        f"pod {pod_meta.get('namespace')}/{pod_meta.get('name')} is "
        f"{(pod.get('status') or {}).get('phase', 'Pending')}"
    )
    return dataclasses.replace(base, reason=Reason.PREPARED, message=message)


def _allocation_node(allocation: Body) -> str | None:
    """The node of a node-local allocation: ``matchFields metadata.name In [node]``."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    names = {
        str(value)
        for term in terms
        for field in term.get("matchFields") or []
        if field.get("key") == "metadata.name" and field.get("operator") == "In"
        for value in field.get("values") or []
    }
    return names.pop() if len(names) == 1 else None


def class_names(claim: Body) -> list[str]:
    """The DeviceClasses a claim's requests name, sorted."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    names = {str((r.get("exactly") or {}).get("deviceClassName", "")) for r in requests}
    names |= {
        str(s.get("deviceClassName", "")) for r in requests for s in r.get("firstAvailable") or []
    }
    return sorted(n for n in names if n)


_result_key = published.result_key


def _attached_nodes(slices: Sequence[Body]) -> dict[DeviceKey, str]:
    attached: dict[DeviceKey, str] = {}
    for body in slices:
        spec = body.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name"))
        for device in spec.get("devices") or []:
            node = device.get("nodeName") or spec.get("nodeName")
            if node:
                attached[(str(spec.get("driver")), pool, str(device.get("name")))] = str(node)
    return attached


def _slice_nodes(slices: Sequence[Body]) -> Iterable[tuple[str, str]]:
    for body in slices:
        spec = body.get("spec") or {}
        if spec.get("nodeName"):
            yield str(spec.get("driver")), str(spec["nodeName"])


# --- the cluster as the requests see it --------------------------------------------------


_Device = published.PublishedDevice


@dataclasses.dataclass(frozen=True)
class _IncompletePool:
    driver: str
    pool: str
    generation: int
    present: int
    expected: int
    source: published.Pool

    @property
    def devices(self) -> tuple[_Device, ...]:
        return self.source.devices

    @property
    def note(self) -> str:
        return self.source.why_incomplete


class Layout:
    """The slices as every check reads them: the devices of complete pools at their newest
    generation, in natural order, and the incomplete pools.

    Built from the pools (once per change of any pool: the controller keeps one until then).
    Per list of selectors, the outcome on every device, in that order, is computed on first
    use from ``Selections`` (per pool, kept across Layouts) and kept here.
    """

    def __init__(
        self, pools: Iterable[published.Pool], selections: Selections | None = None
    ) -> None:
        self.selections = selections if selections is not None else Selections()
        placed: list[tuple[_Device, published.Pool, int]] = []
        incomplete: list[_IncompletePool] = []
        pools_placed: dict[tuple[str, str], published.Pool] = {}
        for pool in sorted(pools, key=lambda p: p.key):
            if pool.complete:
                pools_placed[pool.key] = pool
                placed.extend((d, pool, i) for i, d in enumerate(pool.devices))
            else:
                incomplete.append(
                    _IncompletePool(
                        pool.driver, pool.pool, pool.generation, pool.present, pool.expected, pool
                    )
                )
        placed.sort(key=lambda entry: entry[0].order)  # stable: pool order, then slice order
        self.devices: tuple[_Device, ...] = tuple(d for d, _, _ in placed)
        """Devices of complete pools at their newest generation, in natural order."""
        where: dict[tuple[str, str], tuple[published.Pool, list[int]]] = {}
        for index, (_, pool, position) in enumerate(placed):
            where.setdefault(pool.key, (pool, [0] * len(pool.devices)))[1][position] = index
        self._where = list(where.values())
        self.incomplete: tuple[_IncompletePool, ...] = tuple(
            sorted(incomplete, key=lambda p: (_natural(p.pool), p.driver))
        )
        self.device_nodes = frozenset(d.node for d in self.devices if d.node)
        self.pools = pools_placed
        """The complete pools, by (driver, pool)."""
        self.special = frozenset(i for i, d in enumerate(self.devices) if d.consumes or d.shared)
        """Indexes of the devices that consume counters or are shared (``partitions``)."""
        self._outcomes: dict[ListKey, list[Outcome]] = {}
        self._candidates: dict[ListKey, tuple[int, ...]] = {}

    def outcomes(self, selectors: Sequence[cel.Compiled]) -> list[Outcome]:
        """Each device's outcome (see ``selections``), aligned with ``devices``."""
        key = selections.list_key(selectors)
        found = self._outcomes.get(key)
        if found is None:
            found = [None] * len(self.devices)
            for pool, indexes in self._where:
                for index, outcome in zip(
                    indexes, self.selections.outcomes(selectors, pool), strict=True
                ):
                    if outcome is not None:
                        found[index] = outcome
            self._outcomes[key] = found
        return found

    def candidates(self, selectors: Sequence[cel.Compiled]) -> tuple[int, ...]:
        """Indexes of the devices a class's selectors do not rule out with a plain "no"."""
        key = selections.list_key(selectors)
        found = self._candidates.get(key)
        if found is None:
            outcomes = self.outcomes(selectors)
            found = tuple(i for i, o in enumerate(outcomes) if selections.candidate(o))
            self._candidates[key] = found
        return found


class Checks:
    """Request checks kept from one World to the next (the controller's, pass after pass).

    A check is reused while the Layout is the same one and the ``versions`` of the request's
    classes have not moved: the caller bumps a class's version whenever anything its requests
    could read changes (see ``explaining``). Within one World, checks are shared anyway.
    """

    LIMIT = 20_000

    def __init__(self, versions: Callable[[str], Hashable]) -> None:
        self.versions = versions
        self._layout: Layout | None = None
        self._found: dict[tuple[Any, ...], RequestExplanation] = {}

    def table(self, layout: Layout) -> dict[tuple[Any, ...], RequestExplanation]:
        if layout is not self._layout or len(self._found) > self.LIMIT:
            self._layout, self._found = layout, {}
        return self._found


class World:
    """The cluster as each claim's check reads it: built once (per pass), read by every check.

    ``holders``, ``nodes`` and ``usage`` (counters and shares in use; by default worked out from
    ``holders`` over the layout's pools) are read as they are when a check runs (the controller
    passes its view's live indexes and builds a new World for each pass, with ``checks`` kept
    between).
    """

    def __init__(
        self,
        layout: Layout,
        holders: published.HolderIndex,
        nodes: Mapping[str, Body],
        slices: Sequence[Body] | Callable[[], Sequence[Body]],
        *,
        checks: Checks | None = None,
        usage: partitions.Usage | None = None,
    ) -> None:
        self.layout = layout
        self.holders = holders
        self.usage = usage if usage is not None else partitions.Usage(holders, layout.pools)
        self.nodes = nodes
        self._slices = slices
        self._exclusions: dict[str, _Exclusions] = {}
        self._requests = checks.table(layout) if checks is not None else {}
        self._versions = checks.versions if checks is not None else None

    @property
    def devices(self) -> tuple[_Device, ...]:
        return self.layout.devices

    @property
    def incomplete(self) -> tuple[_IncompletePool, ...]:
        return self.layout.incomplete

    def slice_list(self) -> Sequence[Body]:
        """All ResourceSlices (allocated claims name their devices' nodes from them)."""
        return self._slices() if callable(self._slices) else self._slices

    def has_node(self, name: str) -> bool:
        return name in self.nodes or name in self.layout.device_nodes

    def node_names(self) -> list[str]:
        return sorted(set(self.nodes) | self.layout.device_nodes)

    def scope(self, claim: Body, pod: Body | None, *, detail: bool) -> _Scope:
        """What one claim's check reads: holders other than the claim, the pod's exclusions."""
        meta = claim.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        uid = str(meta.get("uid") or "")
        signature = _pod_signature(pod)
        exclusions = self._exclusions.get(signature)
        if exclusions is None:
            exclusions = self._exclusions[signature] = _Exclusions(self, pod)
        bound = ((pod or {}).get("spec") or {}).get("nodeName") or None
        if self.holders.involves(name, uid):  # it holds devices itself: its own view
            owners = functools.partial(self.holders.owners_excluding, name=name, uid=uid)
            usage = self.usage.excluding(name, uid)
            return _Scope(self, exclusions, bound, owners, usage.taken(), usage, None, detail)
        return _Scope(
            self,
            exclusions,
            bound,
            self.holders.owners,
            self.usage.taken(),
            self.usage,
            (signature, detail),
            detail,
        )


def _pod_signature(pod: Body | None) -> str:
    """What of the pod its checks read (``_node_exclusion``, the bound node)."""
    if pod is None:
        return "-"
    spec = pod.get("spec") or {}
    read = [spec.get(f) for f in ("nodeName", "tolerations", "nodeSelector", "affinity")]
    return json.dumps(read, sort_keys=True, default=str)


_UNKNOWN: Any = object()


class _Exclusions(Mapping[str, str | None]):
    """Node -> why the pod cannot run there (None: it can), for every node we know of;
    worked out for a node when first asked."""

    def __init__(self, world: World, pod: Body | None) -> None:
        self._world = world
        self._pod = pod
        self._known: dict[str, str | None] = {}

    def __getitem__(self, name: str) -> str | None:
        try:
            return self._known[name]
        except KeyError:
            pass
        if not self._world.has_node(name):
            raise KeyError(name)
        found = _node_exclusion(name, self._world.nodes.get(name), self._pod)
        self._known[name] = found
        return found

    def get(self, name: str, default: Any = None) -> Any:
        found = self._known.get(name, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        try:
            return self[name]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[str]:
        return iter(self._world.node_names())

    def __len__(self) -> int:
        return len(self._world.node_names())


@dataclasses.dataclass(frozen=True)
class _Scope:
    """One claim's view of the World."""

    world: World
    exclusions: Mapping[str, str | None]
    bound_node: str | None
    holders: Callable[[DeviceKey], tuple[str, ...]]
    """Device -> ``ns/name`` of the other claims that hold it (admin access does not count)."""
    held: Callable[[DeviceKey], bool]
    """Whether another claim holds the device alone (a shared device's shares do not)."""
    usage: partitions.Usage
    """Counters and shares the other claims use."""
    shared: tuple[str, bool] | None
    """How checks of this scope may be shared with other claims'; None: they may not."""
    detail: bool


# --- nodes -------------------------------------------------------------------------------


def _node_exclusion(name: str, node: Body | None, pod: Body | None) -> str | None:
    """Why the pod cannot run on node ``name``, in plain words; None if nothing stops it.

    The simple part of the scheduler's node filters: nodeName, existence, Ready, cordon,
    NoSchedule/NoExecute taints, nodeSelector, required node affinity. Without a pod, only
    what holds for any pod is checked (the node exists, is Ready and not cordoned).
    """
    pod_spec = (pod or {}).get("spec") or {}
    bound = pod_spec.get("nodeName")
    if bound and bound != name:
        return f"the pod is bound to {bound}"
    if node is None:
        return f"node {name} does not exist"
    if not _node_ready(node):
        return f"node {name} is not Ready"
    node_spec = node.get("spec") or {}
    tolerations = pod_spec.get("tolerations") or []
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    if node_spec.get("unschedulable") and not _tolerated(cordon, tolerations):
        return f"node {name} is cordoned (unschedulable)"
    if pod is None:
        return None
    for taint in node_spec.get("taints") or []:
        effect = taint.get("effect")
        if effect in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return f"node {name} has taint {_taint_text(taint)}, which the pod does not tolerate"
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    wrong = sorted(f"{k}={v}" for k, v in selector.items() if labels.get(k) != v)
    if wrong:
        return f"node {name} does not match the pod's nodeSelector {','.join(wrong)}"
    if not _affinity_allows(pod_spec, name, labels):
        return f"node {name} does not match the pod's required node affinity"
    return None


def _node_ready(node: Body) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tolerated(taint: Body, tolerations: Iterable[Body]) -> bool:
    """Kubernetes' ToleratesTaint: effect, key (an empty key with Exists matches any), value."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
            continue
        key = toleration.get("key")
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            return True
        if (
            key
            and operator == "Equal"
            and (toleration.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _taint_text(taint: Body) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _affinity_allows(pod_spec: Body, name: str, labels: Mapping[str, str]) -> bool:
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    # Terms are ORed; within a term, every expression and field must hold.
    return any(_term_matches(term, name, labels) for term in terms)


def _term_matches(term: Body, name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_requirement_holds(e, labels.get(e.get("key", ""))) for e in expressions) and all(
        f.get("key") == "metadata.name" and _requirement_holds(f, name) for f in fields
    )


def _requirement_holds(requirement: Body, value: str | None) -> bool:
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


# --- one request -------------------------------------------------------------------------


def _explain_request(
    request: Body, scope: _Scope, classes: Mapping[str, Body]
) -> RequestExplanation:
    memo = None
    if scope.shared is not None:
        names = class_names({"spec": {"devices": {"requests": [request]}}})
        versions = scope.world._versions
        memo = (
            json.dumps(request, sort_keys=True, default=str),
            tuple(id(classes.get(n)) for n in names),
            tuple(versions(n) for n in names) if versions is not None else (),
            *scope.shared,
        )
        found = scope.world._requests.get(memo)
        if found is not None:
            return found
    name = str(request.get("name", ""))
    if request.get("firstAvailable") and request.get("exactly") is None:
        alternatives = tuple(
            _explain_exact(f"{name}/{sub.get('name', '')}", sub, scope, classes)
            for sub in request["firstAvailable"]
        )
        result = _first_available(name, alternatives)
    else:
        result = _explain_exact(name, request.get("exactly") or {}, scope, classes)
    if memo is not None:
        scope.world._requests[memo] = result
    return result


def _first_available(name: str, alternatives: tuple[RequestExplanation, ...]) -> RequestExplanation:
    """The request fits if any alternative does; but a missing class or a selector that does
    not compile in any alternative stops the scheduler before it tries one (PreFilter)."""
    blocked = [
        a
        for a in alternatives
        if a.reason in (Reason.DEVICE_CLASS_MISSING, Reason.SELECTOR_INVALID)
    ]
    if blocked:
        return dataclasses.replace(blocked[0], request=name, nodes=(), subrequests=alternatives)
    fitting = [a for a in alternatives if a.satisfied]
    if fitting:
        nodes = tuple(sorted({n for a in fitting for n in a.nodes}))
        return dataclasses.replace(fitting[0], request=name, nodes=nodes, subrequests=alternatives)
    ranked = sorted(alternatives, key=lambda a: _SEVERITY[a.reason])
    return RequestExplanation(
        request=name,
        device_class=", ".join(a.device_class for a in alternatives),
        reason=ranked[0].reason,
        message=_join_messages([a.message for a in ranked]),
        pieces=_combine_pieces([a.pieces for a in alternatives], any_of=True),
        subrequests=alternatives,
    )


@dataclasses.dataclass(frozen=True)
class _Selector:
    index: int
    compiled: cel.Compiled
    owner: str
    """``"class gpu-inferencia "`` for a class selector, ``""`` for the request's own."""


def _explain_exact(
    name: str, spec: Body, scope: _Scope, classes: Mapping[str, Body]
) -> RequestExplanation:
    class_name = str(spec.get("deviceClassName", ""))
    device_class = classes.get(class_name)
    if device_class is None:
        # The scheduler's own words (PreFilter), so the two messages can be matched up.
        message = f"request {name}: device class {class_name} does not exist"
        pieces = (Piece("class", False, message), *_unchecked()[1:])
        return RequestExplanation(name, class_name, Reason.DEVICE_CLASS_MISSING, message, pieces)
    class_selectors = _selectors((device_class.get("spec") or {}).get("selectors"), class_name)
    request_selectors = _selectors(spec.get("selectors"), None)
    class_ok = Piece("class", True, f"device class {class_name} exists")
    for selectors, piece in ((class_selectors, "class"), (request_selectors, "devices")):
        problem = _compile_problem(selectors)
        if problem is not None:
            message = f"request {name}: {problem}"
            pieces = _with_piece((class_ok, *_unchecked()[1:]), Piece(piece, False, message))
            return RequestExplanation(name, class_name, Reason.SELECTOR_INVALID, message, pieces)
    check = _RequestCheck(name, class_name, spec, scope, class_selectors, request_selectors)
    return check.explain()


def _selectors(raw: Sequence[Body] | None, class_name: str | None) -> tuple[_Selector, ...]:
    owner = f"class {class_name} " if class_name is not None else ""
    return tuple(
        _Selector(i, cel.compile_selector(str((s.get("cel") or {}).get("expression", ""))), owner)
        for i, s in enumerate(raw or [])
    )


def _compile_problem(selectors: Sequence[_Selector]) -> str | None:
    for selector in selectors:
        compiled = selector.compiled
        if compiled.error is not None:
            where = f"device {selector.owner.strip()}: " if selector.owner else ""
            return (
                f"{where}selector #{selector.index} does not compile: {_one_line(compiled.error)} "
                f"({_short(compiled.expression)})"
            )
    return None


class _Checked:
    """One device as one request sees it; its text is written only when read."""

    __slots__ = ("_text", "_why", "device", "passed", "verdict")

    def __init__(
        self,
        device: _Device,
        verdict: Verdict,
        passed: bool,
        text: str | None = None,
        why: tuple[_Selector, cel.Evaluation] | None = None,
    ) -> None:
        self.device = device
        self.verdict = verdict
        self.passed = passed
        """Whether every selector accepted the device (whatever its allocation or node)."""
        self._text = text
        self._why = why

    @property
    def text(self) -> str:
        if self._text is None:
            assert self._why is not None
            selector, evaluation = self._why
            if evaluation.error is not None:
                where = f"{selector.owner}selector #{selector.index}"
                self._text = f"{self.device.label}: {where}: {_one_line(evaluation.error)}"
            else:
                self._text = _mismatch_text(selector, self.device)
        return self._text

    def public(self) -> DeviceVerdict:
        d = self.device
        return DeviceVerdict(d.driver, d.pool, d.name, d.node, self.verdict, self.text)


_FITS, _PASSING, _FREE = range(3)
"""Which passing devices ``_fitting_nodes`` counts: those that fit, all, those not allocated."""

# What the hot loop finds for each candidate device: small ints, cheap to compare and count.
(
    _C_ERROR,
    _C_MISMATCH,
    _C_EXCLUDED_ERROR,
    _C_TOO_SMALL,
    _C_ALLOCATED,
    _C_COUNTERS,
    _C_CAPACITY,
    _C_TAINTED,
    _C_EXCLUDED,
    _C_FITS,
) = range(10)
_C_PASSED = _C_ALLOCATED  # this code and those above: every selector accepted the device
_VERDICT_OF = (
    Verdict.ERROR,
    Verdict.MISMATCH,
    Verdict.EXCLUDED,  # a selector failed with an error, on a node the pod cannot use
    Verdict.MISMATCH,  # the request's capacity never fits it (``partitions.ShareMiss``)
    Verdict.ALLOCATED,
    Verdict.COUNTERS,
    Verdict.CAPACITY,
    Verdict.TAINTED,
    Verdict.EXCLUDED,
    Verdict.FITS,
)


class _Group:
    """A group of devices as messages read it: how many, and the first ``LIST_LIMIT``."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first: list[int] = []  # positions among the candidates


class _RequestCheck:
    """One exactly-request (or subrequest) against every published device.

    Only the devices the class does not rule out with a plain "no" (``Layout.candidates``) are
    looked at one by one, and only to count them: per verdict, per node, and the first few of
    each group, which alone get their words written (``_Checked``). The others are all
    ``OTHER_CLASS``, listed only when the class has no candidate at all. ``detail`` writes out
    every device.
    """

    def __init__(
        self,
        name: str,
        class_name: str,
        spec: Body,
        scope: _Scope,
        class_selectors: tuple[_Selector, ...],
        request_selectors: tuple[_Selector, ...],
    ) -> None:
        self.name = name
        self.class_name = class_name
        self.scope = scope
        self.class_selectors = class_selectors
        self.request_selectors = request_selectors
        self.all_mode = spec.get("allocationMode") == "All"
        count = spec.get("count")
        self.count = count if isinstance(count, int) and count > 0 and not self.all_mode else 1
        layout = scope.world.layout
        self._layout = layout
        self._class_compiled = tuple(s.compiled for s in class_selectors)
        self._class_outcomes = layout.outcomes(self._class_compiled)
        self._request_outcomes = (
            layout.outcomes([s.compiled for s in request_selectors]) if request_selectors else None
        )
        self._indexes = layout.candidates(self._class_compiled)
        self._groups = {v: _Group() for v in Verdict}
        self._excluded = _Group()  # passing devices on nodes the pod cannot use
        self._free = _Group()  # passing devices not allocated
        self._local: dict[str, list[int]] = {}  # node -> passing, fitting, allocated
        self._anywhere = [0, 0, 0]  # the same for devices of allNodes/nodeSelector slices
        self._fit_drivers: set[str] = set()
        self._tolerations = tuple(
            t for t in spec.get("tolerations") or () if isinstance(t, Mapping)
        )
        self._capacity = partitions.capacity_requests(spec)
        self._codes = self._check_candidates()
        self.passing = sum(self._local_totals()) + self._anywhere[0]
        self.notes = tuple(p.note for p in scope.world.incomplete if self._may_hold_class(p))

    def _local_totals(self) -> Iterator[int]:
        return (row[0] for row in self._local.values())

    # Per device.

    def _check_candidates(self) -> list[int]:
        """Each device the class does not rule out, in order: the hot loop of a check (tens of
        thousands of devices), hence the local names and no objects per device."""
        devices, class_outcomes = self._layout.devices, self._class_outcomes
        request_outcomes = self._request_outcomes
        exclusion = self.scope.exclusions.get
        held = self.scope.held
        tolerations = self._tolerations
        local, anywhere = self._local, self._anywhere
        special, capacity, usage = self._layout.special, self._capacity, self.scope.usage
        # Per code: the group it counts in (EXCLUDED has two codes), its count, its first few.
        group_of = [self._groups[v] for v in _VERDICT_OF]
        counts = dict.fromkeys(map(id, group_of), 0)
        excluded_positions: list[int] = []
        free_positions: list[int] = []
        excluded_count = free_count = 0
        codes: list[int] = []
        last_node: Any = _UNKNOWN
        excluded: str | None = None
        row = anywhere
        for position, i in enumerate(self._indexes):
            device = devices[i]
            node = device.node
            if node != last_node:
                last_node = node
                excluded = exclusion(node) if node else None
                row = (local.get(node) or local.setdefault(node, [0, 0, 0])) if node else anywhere
            failed = class_outcomes[i]
            if failed is None and request_outcomes is not None:
                failed = request_outcomes[i]
            miss = None
            if failed is None and (capacity is not None or i in special):
                miss = self._share_miss(device)
            if failed is not None:
                if failed[1].error is None:
                    code = _C_MISMATCH
                else:
                    # The scheduler filters the node out first and never evaluates its devices.
                    code = _C_ERROR if excluded is None else _C_EXCLUDED_ERROR
            elif miss is not None and miss.intrinsic:
                code = _C_TOO_SMALL
            else:
                row[0] += 1
                if held(device.key):
                    code = _C_ALLOCATED
                    row[2] += 1
                elif i in special and not usage.counters_fit(device):
                    code = _C_COUNTERS
                    row[2] += 1
                elif miss is not None:
                    code = _C_CAPACITY
                    row[2] += 1
                elif device.taints and _untolerated(device.taints, tolerations):
                    code = _C_TAINTED
                    row[2] += 1  # not free, as if allocated: the scheduler skips it
                else:
                    if excluded is not None:
                        code = _C_EXCLUDED
                        if excluded_count < LIST_LIMIT:
                            excluded_positions.append(position)
                        excluded_count += 1
                    else:
                        code = _C_FITS
                        row[1] += 1
                        self._fit_drivers.add(device.driver)
                    if free_count < LIST_LIMIT:
                        free_positions.append(position)
                    free_count += 1
            codes.append(code)
            group = group_of[code]
            if len(group.first) < LIST_LIMIT:
                group.first.append(position)
            counts[id(group)] += 1
        for group in group_of:
            group.count = counts[id(group)]
        self._excluded.first, self._excluded.count = excluded_positions, excluded_count
        self._free.first, self._free.count = free_positions, free_count
        return codes

    def _share_miss(self, device: _Device) -> partitions.ShareMiss | None:
        """Why the request's capacity does not fit ``device`` (None: it does, or the device is
        not shared and the request asks no capacity)."""
        if not device.shared and self._capacity is None:
            return None
        used = self.scope.usage.consumed(device.key) if device.shared else {}
        return partitions.check_share(device, self._capacity, used)

    def _checked(self, position: int) -> _Checked:
        """The candidate at ``position``, in words."""
        index = self._indexes[position]
        device = self._layout.devices[index]
        code = self._codes[position]
        verdict = _VERDICT_OF[code]
        usage = self.scope.usage
        if code in (_C_TOO_SMALL, _C_CAPACITY):
            miss = self._share_miss(device)
            assert miss is not None
            owners = self.scope.holders(device.key) if code == _C_CAPACITY else ()
            text = partitions.share_text(device.label, miss, owners)
            return _Checked(device, verdict, code == _C_CAPACITY, text)
        if code == _C_COUNTERS:
            counters = usage.counters(device)
            short = [c for c in counters if c.free < c.needs]
            owners = usage.counter_holders(device, short)
            text = partitions.counters_text(device.label, counters, owners)
            return _Checked(device, verdict, True, text)
        if code in (_C_ERROR, _C_MISMATCH):
            failed = self._class_outcomes[index]
            selectors = self.class_selectors
            if failed is None:
                failed, selectors = self._request_outcomes[index], self.request_selectors  # type: ignore[index]
            assert failed is not None
            return _Checked(device, verdict, False, why=(selectors[failed[0]], failed[1]))
        passed = code >= _C_PASSED
        if code == _C_ALLOCATED:
            text = f"{device.label} is allocated to {', '.join(self.scope.holders(device.key))}"
        elif code == _C_TAINTED:
            taints = _untolerated(device.taints, self._tolerations)
            text = f"{device.label} is tainted {', '.join(map(device_taint_text, taints))}"
        elif code == _C_FITS:
            text = f"{device.label} fits"
        else:
            text = f"{device.label}: {self.scope.exclusions.get(device.node or '')}"
        return _Checked(device, verdict, passed, text)

    def _head(self, group: _Group) -> _Head:
        return _Head([self._checked(p) for p in group.first], group.count)

    def group(self, verdict: Verdict) -> _Head:
        return self._head(self._groups[verdict])

    def _other(self, index: int) -> _Checked:
        """A device the class rules out."""
        outcome = self._class_outcomes[index]
        assert outcome is not None
        selector = self.class_selectors[outcome[0]]
        device = self.scope.world.devices[index]
        return _Checked(device, Verdict.OTHER_CLASS, False, why=(selector, outcome[1]))

    @functools.cached_property
    def checked(self) -> list[_Checked]:
        """Every device in natural order (for ``detail``)."""
        positions = {index: position for position, index in enumerate(self._indexes)}
        return [
            self._checked(positions[index]) if index in positions else self._other(index)
            for index in range(len(self._class_outcomes))
        ]

    def _may_hold_class(self, pool: _IncompletePool) -> bool:
        # An incomplete pool of another driver is no business of this request; an empty one
        # may be half written, so it is mentioned.
        if not pool.devices:
            return True
        outcomes = self.scope.world.layout.selections.outcomes(self._class_compiled, pool.source)
        return any(selections.admits(o) for o in outcomes)

    # The request as a whole.

    def explain(self) -> RequestExplanation:
        if not self._indexes:
            return self._nothing_published()
        if self._groups[Verdict.ERROR].count:
            listing = _listing([(self.group(Verdict.ERROR), "more fail")])
            return self._failure(Reason.SELECTOR_ERROR, f"selector error: {listing}")
        if not self.passing:
            return self._failure(Reason.NO_DEVICE_FITS, f"no device fits: {self._all_items()}")
        nodes = self._fitting_nodes(_FITS, respect_exclusion=True)
        if nodes:
            return self._fits(nodes)
        if not self._fitting_nodes(_PASSING, respect_exclusion=False):
            reason = Reason.NOT_ENOUGH_DEVICES
        elif not self._fitting_nodes(_FREE, respect_exclusion=False):
            allocated = sum(
                self._groups[v].count
                for v in (Verdict.ALLOCATED, Verdict.COUNTERS, Verdict.CAPACITY)
            )
            tainted = self._groups[Verdict.TAINTED].count
            reason = Reason.DEVICES_TAINTED if tainted > allocated else Reason.DEVICES_ALLOCATED
        else:
            reason = Reason.NODE_EXCLUDED
        return self._failure(reason, f"{self._headline()}: {self._all_items()}")

    def _fitting_nodes(self, usable: int, *, respect_exclusion: bool) -> list[str]:
        """Nodes where enough passing devices are ``usable`` (``_FITS``, ``_PASSING`` or
        ``_FREE``; for All: every one of them)."""
        local, anywhere = self._local, self._anywhere
        exclusions = self.scope.exclusions
        candidates = {n for n, row in local.items() if row[0]}
        if anywhere[0]:
            candidates |= set(exclusions)
        if respect_exclusion:
            candidates = {n for n in candidates if exclusions.get(n) is None}
        fitting = []
        none = (0, 0, 0)
        for node in sorted(candidates, key=_natural):
            row = local.get(node, none)
            total = row[0] + anywhere[0]
            if usable == _FITS:
                good = row[1] + anywhere[1]
            elif usable == _PASSING:
                good = total
            else:
                good = total - row[2] - anywhere[2]
            ok = (total > 0 and good == total) if self.all_mode else good >= self.count
            if ok:
                fitting.append(node)
        return fitting

    def _headline(self) -> str:
        if self.all_mode:
            return "needs every matching device of one node, free"
        if self.count == 1:
            return "no device fits"
        most = max([row[1] for row in self._local.values()] + [self._anywhere[1]])
        return f"needs {self.count} devices on one node, at most {most} available"

    def _all_items(self) -> str:
        groups = [
            (self.group(Verdict.MISMATCH), "more do not match"),
            (self.group(Verdict.ALLOCATED), "more are allocated"),
            (self.group(Verdict.COUNTERS), "more have their counters used up"),
            (self.group(Verdict.CAPACITY), "more are shared and full"),
            (self.group(Verdict.TAINTED), "more are tainted"),
            (self.group(Verdict.EXCLUDED), "more are on excluded nodes"),
            (self.group(Verdict.FITS), "more fit"),
        ]
        return "; ".join(filter(None, [_listing(groups), *self.notes]))

    def _nothing_published(self) -> RequestExplanation:
        devices = self.scope.world.devices
        if not devices and not self.notes:
            return self._failure(Reason.NO_DEVICES_PUBLISHED, "no devices published")
        headline = (
            f"no device of class {self.class_name} published" if devices else "no devices published"
        )
        # No candidate: every device is of another class.
        others = _Head([self._other(i) for i in range(min(LIST_LIMIT, len(devices)))], len(devices))
        listing = _listing([(others, "more are of other classes")])
        details = "; ".join(filter(None, [*self.notes, listing]))
        reason = Reason.POOL_INCOMPLETE if self.notes else Reason.NO_DEVICES_PUBLISHED
        return self._failure(reason, f"{headline}: {details}")

    def _failure(self, reason: Reason, text: str) -> RequestExplanation:
        message = _bounded(f"request {self.name}: {text}")
        devices_piece = Piece("devices", False, message)
        node_piece = self._node_piece() if self.passing else Piece("node", None, NOT_CHECKED)
        if reason == Reason.NODE_EXCLUDED:
            # Enough free devices pass, on nodes the pod cannot use: the devices are there.
            devices_piece = Piece("devices", True, self._free_text())
            node_piece = Piece("node", False, self._exclusions_text())
        return self._result(reason, message, devices_piece, node_piece, driver_ok=None)

    def _fits(self, nodes: list[str]) -> RequestExplanation:
        bound = self.scope.bound_node
        node_reason = (
            f"the pod is bound to {bound}" if bound else f"{_names(nodes)} can run the pod"
        )
        drivers = sorted(self._fit_drivers)
        driver_reason = f"{', '.join(drivers)} published devices for {_names(nodes)}"
        return self._result(
            Reason.FITS,
            f"request {self.name}: fits on {_names(nodes)}",
            Piece("devices", True, self._free_text()),
            Piece("node", True, node_reason),
            driver_ok=driver_reason,
            nodes=tuple(nodes),
        )

    def _free_text(self) -> str:
        free = self._free
        shown = ", ".join(self._checked(p).device.label for p in free.first)
        more = f" and {free.count - LIST_LIMIT} more" if free.count > LIST_LIMIT else ""
        return f"{shown}{more} {'fits' if free.count == 1 else 'fit'}"

    def _node_piece(self) -> Piece:
        """Whether a node the pod may use holds a device that passes the selectors."""
        nodes = {n for n, row in self._local.items() if row[0]}
        exclusions = self.scope.exclusions
        if self._anywhere[0]:
            nodes |= set(exclusions)
        eligible = sorted((n for n in nodes if exclusions.get(n) is None), key=_natural)
        if eligible:
            return Piece("node", True, f"{_names(eligible)} can run the pod")
        return Piece("node", False, self._exclusions_text())

    def _exclusions_text(self) -> str:
        listing = _listing([(self._head(self._excluded), "more are on excluded nodes")])
        return _bounded(f"request {self.name}: {listing or 'no node can run the pod'}")

    def _result(
        self,
        reason: Reason,
        message: str,
        devices_piece: Piece,
        node_piece: Piece,
        *,
        driver_ok: str | None,
        nodes: tuple[str, ...] = (),
    ) -> RequestExplanation:
        driver_piece = (
            Piece("driver", True, driver_ok) if driver_ok else Piece("driver", None, NOT_CHECKED)
        )
        return RequestExplanation(
            request=self.name,
            device_class=self.class_name,
            reason=reason,
            message=message,
            pieces=(
                Piece("class", True, f"device class {self.class_name} exists"),
                devices_piece,
                node_piece,
                driver_piece,
            ),
            devices=tuple(c.public() for c in self.checked) if self.scope.detail else (),
            notes=self.notes,
            nodes=nodes,
        )


# --- device taints -------------------------------------------------------------------------


def _untolerated(taints: Sequence[Body], tolerations: Sequence[Body]) -> tuple[Body, ...]:
    """The taints (NoSchedule/NoExecute) that no toleration of the request tolerates."""
    return tuple(t for t in taints if not any(_tolerates(x, t) for x in tolerations))


def _tolerates(toleration: Body, taint: Body) -> bool:
    # resource.k8s.io/v1 DeviceToleration: an empty key with Exists matches every key; an
    # empty effect matches every effect; operator defaults to Equal.
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator", "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def device_taint_text(taint: Body) -> str:
    """``gpu.example.com/xid=79:NoExecute since 12:03`` (UTC, from ``timeAdded``)."""
    value = taint.get("value")
    text = f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"
    added = taint.get("timeAdded")
    if isinstance(added, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d.*", added):
        text += f" since {added[11:16]}"
    return text


# --- selectors in plain words ------------------------------------------------------------


_S = r"\s*"
_CAPACITY = (
    rf'device{_S}\.{_S}capacity{_S}\[{_S}"(?P<domain>[^"]+)"{_S}\]{_S}'
    rf'(?:\.{_S}(?P<name>[A-Za-z_]\w*)|\[{_S}"(?P<qname>[^"]+)"{_S}\])'
)
_QUANTITY = rf'quantity{_S}\({_S}"(?P<quantity>[^"]+)"{_S}\)'
_COMPARE_TO = re.compile(
    rf"{_S}{_CAPACITY}{_S}\.{_S}compareTo{_S}\({_S}{_QUANTITY}{_S}\){_S}"
    rf"(?P<op>>=|<=|==|!=|>|<){_S}(?P<n>-?\d+){_S}"
)
_IS_GREATER_OR_LESS = re.compile(
    rf"{_S}(?P<neg>!?){_S}{_CAPACITY}{_S}\.{_S}(?P<method>isGreaterThan|isLessThan){_S}"
    rf"\({_S}{_QUANTITY}{_S}\){_S}"
)
_DRIVER_IS = re.compile(rf'{_S}device{_S}\.{_S}driver{_S}=={_S}"(?P<driver>[^"]*)"{_S}')
_ATTRIBUTE_IS = re.compile(
    rf'{_S}device{_S}\.{_S}attributes{_S}\[{_S}"(?P<domain>[^"]+)"{_S}\]{_S}'
    rf'(?:\.{_S}(?P<name>[A-Za-z_]\w*)|\[{_S}"(?P<qname>[^"]+)"{_S}\]){_S}=={_S}'
    rf'(?P<literal>"[^"]*"|-?\d+|true|false){_S}'
)
# `x.compareTo(q) OP n` as a relation between x and q; None where it is not that simple.
_RELATIONS = {
    (">=", 0): ">=",
    (">", 0): ">",
    ("<=", 0): "<=",
    ("<", 0): "<",
    ("==", 0): "==",
    ("!=", 0): "!=",
    ("==", 1): ">",
    (">=", 1): ">",
    ("!=", 1): "<=",
    ("<", 1): "<=",
    ("==", -1): "<",
    ("<=", -1): "<",
    ("!=", -1): ">=",
    (">", -1): ">=",
}
_METHOD_RELATIONS = {
    ("", "isGreaterThan"): ">",
    ("!", "isGreaterThan"): "<=",
    ("", "isLessThan"): "<",
    ("!", "isLessThan"): ">=",
}


def _mismatch_text(selector: _Selector, device: _Device) -> str:
    """Why ``device`` fails ``selector``: read from the device for the common simple forms
    (capacity comparisons, driver and attribute equality), else the selector itself."""
    expression = selector.compiled.expression
    for explain in (_capacity_mismatch, _driver_mismatch, _attribute_mismatch):
        text = explain(expression, device)
        if text is not None:
            return f"{device.label} {text}"
    where = f"{selector.owner}selector #{selector.index}"
    return f"{device.label} does not match {where} ({_short(expression)})"


def _capacity_mismatch(expression: str, device: _Device) -> str | None:
    match = _COMPARE_TO.fullmatch(expression)
    if match is not None:
        relation = _RELATIONS.get((match["op"], int(match["n"])))
    else:
        match = _IS_GREATER_OR_LESS.fullmatch(expression)
        relation = _METHOD_RELATIONS.get((match["neg"], match["method"])) if match else None
    if match is None or relation is None:
        return None
    name = match["name"] or match["qname"]
    shown, value = _lookup(device, "capacity", match["domain"], name)
    needs = f"needs {relation} {match['quantity']}"
    if not isinstance(value, Mapping) or "value" not in value:
        return f"has no {shown} capacity, {needs}"
    return f"has {shown} {value['value']}, {needs}"


def _driver_mismatch(expression: str, device: _Device) -> str | None:
    match = _DRIVER_IS.fullmatch(expression)
    if match is None:
        return None
    return f"has driver {device.driver}, needs {match['driver']}"


def _attribute_mismatch(expression: str, device: _Device) -> str | None:
    match = _ATTRIBUTE_IS.fullmatch(expression)
    if match is None:
        return None
    shown, value = _lookup(device, "attributes", match["domain"], match["name"] or match["qname"])
    needs = f"needs {match['literal']}"
    if not isinstance(value, Mapping) or not value:
        return f"has no {shown} attribute, {needs}"
    kind, raw = next(iter(value.items()))
    text = f'"{raw}"' if kind in ("string", "version") else str(raw).lower()
    return f"has {shown} {text}, {needs}"


def _lookup(device: _Device, field: str, domain: str, name: str) -> tuple[str, object]:
    """A capacity or attribute by CEL's (domain, name); bare names are the driver's domain."""
    values = device.body.get(field) or {}
    qualified = f"{domain}/{name}"
    if domain == device.driver:
        return name, values.get(name, values.get(qualified))
    return qualified, values.get(qualified)


# --- small helpers -----------------------------------------------------------------------


class _Head(Sequence[_Checked]):
    """The first few of a group whose other members were never built, and its size."""

    def __init__(self, first: list[_Checked], size: int) -> None:
        self._first = first
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: Any) -> Any:
        if (
            isinstance(index, slice)
            and (index.start or 0) == 0
            and index.step is None
            and index.stop is not None
            and min(index.stop, self._size) <= len(self._first)
        ):
            return self._first[: index.stop]
        raise IndexError("only the first items of a _Head are known")


def _listing(groups: Sequence[tuple[Sequence[_Checked], str]]) -> str:
    """Each group's first ``LIST_LIMIT`` texts, then "and N <phrase>"; groups in order."""
    parts: list[str] = []
    for checked, phrase in groups:
        parts.extend(c.text for c in checked[:LIST_LIMIT])
        if len(checked) > LIST_LIMIT:
            parts.append(f"and {len(checked) - LIST_LIMIT} {phrase}")
    return "; ".join(parts)


def _combine_pieces(rows: Sequence[tuple[Piece, ...]], *, any_of: bool) -> tuple[Piece, ...]:
    """The pieces of several requests: all must be satisfied (a claim's requests), or any
    (a firstAvailable request's alternatives)."""
    if not rows:
        return tuple(Piece(name, True, "no devices requested") for name in PIECE_NAMES)
    combined = []
    for index, name in enumerate(PIECE_NAMES):
        states = [row[index] for row in rows]
        if any_of and any(p.satisfied for p in states):
            satisfied: bool | None = True
        elif any(p.satisfied is False for p in states):
            satisfied = False
        else:
            satisfied = True if all(p.satisfied for p in states) else None
        chosen = [p.reason for p in states if p.satisfied is satisfied]
        reason = " | ".join(dict.fromkeys(chosen)) if satisfied is not None else NOT_CHECKED
        combined.append(Piece(name, satisfied, _bounded(reason)))
    return tuple(combined)


def _with_piece(pieces: Sequence[Piece], replacement: Piece) -> tuple[Piece, ...]:
    return tuple(replacement if p.name == replacement.name else p for p in pieces)


def _unchecked() -> tuple[Piece, ...]:
    return tuple(Piece(name, None, NOT_CHECKED) for name in PIECE_NAMES)


def _join_messages(messages: Sequence[str]) -> str:
    shown = list(messages[:REQUEST_LIMIT])
    if len(messages) > REQUEST_LIMIT:
        shown.append(f"and {len(messages) - REQUEST_LIMIT} more requests")
    return _bounded(" | ".join(shown))


def _names(nodes: Sequence[str]) -> str:
    shown = ", ".join(nodes[:LIST_LIMIT])
    return f"{shown} and {len(nodes) - LIST_LIMIT} more" if len(nodes) > LIST_LIMIT else shown


def _short(expression: str, limit: int = 80) -> str:
    collapsed = " ".join(expression.split())
    return collapsed if len(collapsed) <= limit else collapsed[: limit - 1] + "…"


def _one_line(error: str, limit: int = 200) -> str:
    """A CEL error fit for a one-line message: the parser's caret drawing ("| ...") and its
    copy of the expression (quoted separately) dropped, whitespace collapsed, cut."""
    kept = " ".join(line for line in error.splitlines() if not line.lstrip().startswith("|"))
    text = _PARSE_PREFIX.sub("", " ".join(kept.split()), count=1)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PARSE_PREFIX = re.compile(r"^Failed to parse expression '.*?': ")


def _bounded(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


_natural = names.natural

"""The controller's in-memory view of the cluster, fed by Kopf's watch events, and its indexes.

Kopf's ``on.event`` handlers put every DeviceClass, ResourceClaim, ResourceSlice, Pod, Node and
DeviceTaintRule here; nothing is written back to those objects (no Kopf annotations, no
finalizers: they belong to users). Each object is kept as the API's JSON cut down to the fields
the controller reads (``_KEEP``), so a Node's images or a Pod's containers cost nothing, an
update that touches only other fields (a Node's heartbeat, a Pod's container status) is no
change at all, and a view may skip the Pods that use no claim (most Pods of a cluster)
altogether — except those its ``agent_pods`` test keeps: the driver's own agents, by their
labels (``absences`` reads them).

``apply`` keeps the indexes the controller's jobs read instead of scanning: pods by the claims
they use, pending claims, claims by state, devices by holder (``claimed.HolderIndex``), each
pool at its newest generation (``published.Pool``, rebuilt only when one of its slices changes),
the pools with devices on each node, and what allocations use of each pool's counter sets and
shared devices (``partitions.Usage``, worked out again for a pool when it or its holders
change), and the agent pods on each node. A DeviceTaintRule's taint is added to the devices it
selects as the pools are read (``taintrules``: as the scheduler sees them), so a rule's change
is a change of the pools it selects. It also notes what changed (``take_changes``), so a pass
costs what changed, not what exists. Pure: no I/O, no clock.

At start the controller also reads some objects itself (``startup``: its own paged lists, a
waiting pod read by name) and ``offer``s them, so the view is complete before Kopf has handed
over its initial listings. Kopf's stream stays the truth: a version read is taken only where the
view holds nothing newer and Kopf has not told of a later deletion (``begin_reads`` keeps
Kopf's deletions meanwhile), and it stands until Kopf tells a version at least as new — Kopf's
own listing, older than the controller's read, does not undo it. Newer and older are the
objects' resourceVersions, which clients may compare within one resource from Kubernetes 1.35
(KEP-5504, ``resource_version``); an object without one is taken as before.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dra_gpu.controller import claimed, kubelet, partitions, published, taintrules
from dra_gpu.resource import bodies

Body = dict[str, Any]
KINDS = ("DeviceClass", "ResourceClaim", "ResourceSlice", "Pod", "Node", "DeviceTaintRule")
PoolKey = tuple[str, str]


# What is kept of each kind: field -> None (all of it) or the fields kept below it.
_Keep = Mapping[str, "_Keep | None"]
_KEEP: dict[str, _Keep] = {
    "DeviceClass": {"metadata": {"name": None, "uid": None, "resourceVersion": None}, "spec": None},
    "ResourceClaim": {
        "metadata": {
            "name": None,
            "namespace": None,
            "uid": None,
            "resourceVersion": None,
            "creationTimestamp": None,
            "deletionTimestamp": None,
            "ownerReferences": None,  # cut to the controller's below (``owners``)
        },
        "spec": None,
        "status": None,
    },
    "ResourceSlice": {
        "metadata": {
            "name": None,
            "uid": None,
            "resourceVersion": None,
            "labels": None,
            "ownerReferences": None,
        },
        "spec": None,
    },
    "Pod": {
        "metadata": {
            "name": None,
            "namespace": None,
            "uid": None,
            "resourceVersion": None,
            "creationTimestamp": None,
        },
        "spec": {
            "nodeName": None,
            "resourceClaims": None,
            "tolerations": None,
            "nodeSelector": None,
            "affinity": {"nodeAffinity": None},
        },
        # conditions: cut to the Ready condition's type, status and lastTransitionTime below
        "status": {"phase": None, "resourceClaimStatuses": None},
    },
    "Node": {
        "metadata": {"name": None, "uid": None, "resourceVersion": None, "labels": None},
        "spec": {"unschedulable": None, "taints": None},
        "status": {"conditions": None},  # cut to the Ready condition's type and status below
    },
    "DeviceTaintRule": {
        "metadata": {
            "name": None,
            "uid": None,
            "resourceVersion": None,
            "labels": None,
            "annotations": None,
        },
        "spec": None,
    },
}
# Read for optimistic concurrency only: a new one alone is no change.
_VOLATILE = ("resourceVersion",)


def trim(kind: str, body: Mapping[str, Any]) -> Body:
    """``body`` cut down to what the controller reads of a ``kind``."""
    kept = _cut(body, _KEEP[kind])
    if kind == "Node":
        conditions = (body.get("status") or {}).get("conditions") or []
        ready = [
            {"type": c.get("type"), "status": c.get("status")}
            for c in conditions
            if isinstance(c, Mapping) and c.get("type") == "Ready"
        ]
        kept["status"] = {"conditions": ready}
    elif kind == "ResourceClaim" and isinstance(kept.get("metadata"), dict):
        refs = kept["metadata"].pop("ownerReferences", None) or []
        controller = [
            {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
            for r in refs
            if isinstance(r, Mapping) and r.get("controller") is True
        ]
        if controller:
            kept["metadata"]["ownerReferences"] = controller
    elif kind == "Pod":
        conditions = (body.get("status") or {}).get("conditions") or []
        ready = [
            {k: c.get(k) for k in ("type", "status", "lastTransitionTime")}
            for c in conditions
            if isinstance(c, Mapping) and c.get("type") == "Ready"
        ]
        if ready:
            kept.setdefault("status", {})["conditions"] = ready
    return kept


def _cut(body: Mapping[str, Any], keep: _Keep) -> Body:
    out: Body = {}
    for field, below in keep.items():
        if field not in body:
            continue
        value = body[field]
        if below is not None and isinstance(value, Mapping):
            value = _cut(value, below)
        out[field] = value
    return out


def _same(old: Body, new: Body) -> bool:
    if old.get("metadata", {}).get("resourceVersion") == new.get("metadata", {}).get(
        "resourceVersion"
    ):
        return old == new
    meta_old = {k: v for k, v in old.get("metadata", {}).items() if k not in _VOLATILE}
    meta_new = {k: v for k, v in new.get("metadata", {}).items() if k not in _VOLATILE}
    return meta_old == meta_new and all(
        old.get(f) == new.get(f) for f in set(old) | set(new) if f != "metadata"
    )


def resource_version(body: Mapping[str, Any]) -> int | None:
    """``metadata.resourceVersion`` as the integer it is: from Kubernetes 1.35 (KEP-5504) the
    versions of one resource's objects compare as integers, a later one larger. None when it is
    absent or not a decimal integer (then nothing is compared)."""
    version = (body.get("metadata") or {}).get("resourceVersion")
    if isinstance(version, str) and version.isdigit():
        return int(version)
    return None


def claim_names(pod: Mapping[str, Any]) -> set[str]:
    """Names of the claims a pod uses: named in its spec, or generated for it (status)."""
    refs = (pod.get("spec") or {}).get("resourceClaims") or []
    names = {ref.get("resourceClaimName") for ref in refs}
    names |= {
        status.get("resourceClaimName")
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names.discard(None)
    return {str(n) for n in names}


@dataclasses.dataclass
class Changes:
    """What changed in the view since the last ``take_changes()`` (keys, as in ``objects``)."""

    classes: set[str] = dataclasses.field(default_factory=set)
    claims: set[str] = dataclasses.field(default_factory=set)
    pods: set[str] = dataclasses.field(default_factory=set)
    nodes: set[str] = dataclasses.field(default_factory=set)
    slices: set[str] = dataclasses.field(default_factory=set)
    pools: dict[PoolKey, published.Pool | None] = dataclasses.field(default_factory=dict)
    """Pools whose slices changed, each with the pool as it was before (None: it was not)."""
    held: set[published.DeviceKey] = dataclasses.field(default_factory=set)
    """Devices whose holders may have changed."""
    rules: set[str] = dataclasses.field(default_factory=set)
    """DeviceTaintRules (their pools are in ``pools`` too)."""
    agents: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose agent pods (``ClusterView.agent_pods``) changed."""

    def __bool__(self) -> bool:
        return bool(
            self.classes
            or self.claims
            or self.pods
            or self.nodes
            or self.slices
            or self.pools
            or self.held
            or self.rules
            or self.agents
        )


@dataclasses.dataclass
class ClusterView:
    pods_without_claims: bool = True
    """Keep Pods that use no claim (the controller does not: it never reads them)."""
    agent_pods: Callable[[Mapping[str, Any]], bool] | None = None
    """Pods (as the API has them) kept even without a claim, and indexed by node
    (``agents_on``): the driver's agent pods (``agents.AgentSelector``)."""
    objects: dict[str, dict[str, Body]] = dataclasses.field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )
    generation: int = 0
    """Bumped on every change, so the reconcile loop can tell a quiet view from a busy one."""

    def __post_init__(self) -> None:
        self._stamps: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        self._pods_by_claim: dict[str, set[str]] = {}
        self._claims_of_pod: dict[str, tuple[str, ...]] = {}
        self._pending: set[str] = set()
        self._states: dict[str, str] = {}
        self.claim_states: collections.Counter[str] = collections.Counter(
            {"pending": 0, "allocated": 0, "reserved": 0}
        )
        self.holders = claimed.HolderIndex()
        self._slice_seq: dict[str, int] = {}
        self._slice_pool: dict[str, PoolKey] = {}
        self._pool_slices: dict[PoolKey, set[str]] = {}
        self.pools: dict[PoolKey, published.Pool] = {}
        """Every (driver, pool) at its newest generation."""
        self.usage = partitions.Usage(self.holders, self.pools)
        """Counters and shares the allocations use, per pool."""
        self._pools_on_node: dict[str, set[PoolKey]] = {}
        self._agents_on_node: dict[str, set[str]] = {}
        self._agent_node: dict[str, str] = {}  # agent pod key -> its node
        self._rules: dict[str, taintrules.Rule] = {}
        self.prepare_failures: dict[str, kubelet.PrepareFailure] = {}
        """Pod key -> the kubelet's latest prepare failure on it (``set_prepare_failure``)."""
        self._changes = Changes()
        self._seq = 0
        # kind -> key -> the version read, until Kopf tells one as new (``offer``)
        self._reads: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        # kind -> key -> Kopf's deletion, kept while the controller reads (``begin_reads``)
        self._deleted: dict[str, dict[str, int]] | None = None

    # ---- what Kopf hands over, and what the controller reads itself ------------------------

    def apply(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Take one watch event; returns whether the view changed (in a field it keeps)."""
        if not self._kopf_catches_up(kind, event_type, body):
            return False
        return self._take(kind, event_type, body)

    def begin_reads(self) -> None:
        """The controller reads objects itself from now (``offer``): Kopf's deletions are kept
        until ``end_reads``, so that a read older than one does not bring the object back."""
        if self._deleted is None:
            self._deleted = {kind: {} for kind in KINDS}

    def end_reads(self) -> None:
        """No more reads of the controller's own. The versions read still stand until Kopf
        tells one as new (its listing of a kind may go on after its Pods are all listed)."""
        self._deleted = None

    def offer(self, kind: str, body: Mapping[str, Any]) -> bool:
        """A version the controller read itself (between ``begin_reads`` and ``end_reads``):
        taken as a new object, unless the view holds this version or a newer one, or Kopf told
        of a deletion since; it then stands until Kopf tells a version at least as new. Returns
        whether the view changed."""
        if self._deleted is None:
            raise RuntimeError("offer() outside begin_reads() / end_reads()")
        name = bodies.key(body)
        version = resource_version(body)
        gone = self._deleted[kind].get(name)
        if gone is not None and (version is None or version <= gone):
            return False  # deleted after this was read
        old = self.objects[kind].get(name)
        if old is not None:
            held = resource_version(old)
            if version is None or held is None or version <= held:
                return False  # Kopf's word, as new as this read or newer, or not comparable
        changed = self._take(kind, "ADDED", body)
        if version is not None and name in self.objects[kind]:
            self._reads[kind][name] = version
        return changed

    def _kopf_catches_up(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Whether Kopf's event is taken: not when it is older than a version the controller
        read (Kopf's listing, made before the read). A deletion is kept while reads go on."""
        reads = self._reads[kind]
        if not reads and self._deleted is None:
            return True  # nothing read stands: Kopf's word, as ever
        name = bodies.key(body)
        version = resource_version(body)
        if event_type == "DELETED" and version is not None and self._deleted is not None:
            deleted = self._deleted[kind]
            deleted[name] = max(version, deleted.get(name, version))
        read = reads.get(name)
        if read is None:
            return True
        if version is not None and version < read:
            return False
        del self._reads[kind][name]  # Kopf has caught up with what was read
        return True

    def _take(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> bool:
        name = bodies.key(body)
        store = self.objects[kind]
        old = store.get(name)
        new: Body | None = None
        if event_type != "DELETED":
            new = trim(kind, body)
            if (
                kind == "Pod"
                and not self.pods_without_claims
                and not claim_names(new)
                and not (self.agent_pods is not None and self.agent_pods(body))
            ):
                new = None  # spec.resourceClaims is immutable: it never will use one
            elif old is not None and _same(old, new):
                store[name] = new  # the newest resourceVersion, for writes that carry it
                return False
        if old is None and new is None:
            return False
        if new is None:
            del store[name]
            self._stamps[kind].pop(name, None)
        else:
            store[name] = new
        self.generation += 1
        if new is not None:
            self._stamps[kind][name] = self.generation
        getattr(self, _ON_CHANGE[kind])(name, old, new)
        return True

    def set_prepare_failure(self, pod_key: str, failure: kubelet.PrepareFailure | None) -> bool:
        """The kubelet's latest prepare failure on a pod (None: none, or it expired); a change
        of it is a change of that pod. Returns whether it changed."""
        if self.prepare_failures.get(pod_key) == failure:
            return False
        if failure is None:
            del self.prepare_failures[pod_key]
        else:
            self.prepare_failures[pod_key] = failure
        self.generation += 1
        self._changes.pods.add(pod_key)
        return True

    def take_changes(self) -> Changes:
        changes, self._changes = self._changes, Changes()
        return changes

    def stamp(self, kind: str, name: str) -> int:
        """The view's generation when the object last changed; 0 when it is not in the view."""
        return self._stamps[kind].get(name, 0)

    # ---- the kinds -------------------------------------------------------------------------

    @property
    def classes(self) -> dict[str, Body]:
        return self.objects["DeviceClass"]

    @property
    def claims(self) -> dict[str, Body]:
        return self.objects["ResourceClaim"]

    @property
    def slices(self) -> dict[str, Body]:
        return self.objects["ResourceSlice"]

    @property
    def pods(self) -> dict[str, Body]:
        return self.objects["Pod"]

    @property
    def nodes(self) -> dict[str, Body]:
        return self.objects["Node"]

    @property
    def taint_rules(self) -> dict[str, Body]:
        return self.objects["DeviceTaintRule"]

    # ---- queries ---------------------------------------------------------------------------

    def pods_of(self, claim: Mapping[str, Any]) -> list[Body]:
        """Pods that use the claim (naming it in spec or status), sorted by namespace/name."""
        return [self.pods[p] for p in self.pod_keys_of(bodies.key(claim))]

    def pod_keys_of(self, claim_key: str) -> list[str]:
        return sorted(self._pods_by_claim.get(claim_key, ()))

    def claim_keys_of_pod(self, pod_key: str) -> tuple[str, ...]:
        """Keys of the claims a kept pod uses, sorted."""
        return self._claims_of_pod.get(pod_key, ())

    def slices_of_pool(self, pool: PoolKey) -> list[Body]:
        """The ResourceSlices of one (driver, pool), every generation."""
        return [self.slices[name] for name in sorted(self._pool_slices.get(pool, ()))]

    def pending_claims(self) -> Iterator[Body]:
        """Claims not allocated yet, in a stable order."""
        for name in self.pending_keys():
            yield self.claims[name]

    def pending_keys(self) -> list[str]:
        return sorted(self._pending)

    def is_pending(self, claim_key: str) -> bool:
        """Whether the claim is in the view and not allocated yet."""
        return claim_key in self._pending

    def pools_on_node(self, node: str) -> set[PoolKey]:
        """Pools with a device attached to ``node``."""
        return self._pools_on_node.get(node, set())

    def agents_on(self, node: str) -> list[Body]:
        """The agent pods (``agent_pods``) bound to ``node``, by key."""
        return [self.pods[k] for k in sorted(self._agents_on_node.get(node, ()))]

    def agent_nodes(self) -> set[str]:
        """Nodes with an agent pod bound to them."""
        return set(self._agents_on_node)

    def tainted_slices(self, slices: list[Body] | None = None) -> list[Mapping[str, Any]]:
        """``slices`` (default: all of them) with the DeviceTaintRules' taints on the devices
        they select, as the scheduler reads them (``taintrules``)."""
        chosen = list(self.slices.values()) if slices is None else slices
        return taintrules.tainted_slices(chosen, self._rules.values())

    # ---- indexes, per kind -----------------------------------------------------------------

    def _class_changed(self, name: str, old: Body | None, new: Body | None) -> None:
        self._changes.classes.add(name)

    def _node_changed(self, name: str, old: Body | None, new: Body | None) -> None:
        self._changes.nodes.add(name)

    def _pod_changed(self, name: str, old: Body | None, new: Body | None) -> None:
        if self.agent_pods is not None:
            self._index_agent(name, new)
        namespace = (new or old or {}).get("metadata", {}).get("namespace")
        claims = tuple(sorted(f"{namespace}/{c}" for c in claim_names(new))) if new else ()
        before = self._claims_of_pod.get(name, ())
        if claims != before:
            for claim in before:
                pods = self._pods_by_claim[claim]
                pods.discard(name)
                if not pods:
                    del self._pods_by_claim[claim]
            for claim in claims:
                self._pods_by_claim.setdefault(claim, set()).add(name)
            if claims:
                self._claims_of_pod[name] = claims
            else:
                self._claims_of_pod.pop(name, None)
        self._changes.pods.add(name)

    def _index_agent(self, name: str, new: Body | None) -> None:
        """Agent pods by node: a pod kept without claims is one (``apply`` kept it for that);
        one with claims is not (agents use none)."""
        was = self._agent_node.pop(name, None)
        now = None
        if new is not None and not claim_names(new):
            now = (new.get("spec") or {}).get("nodeName") or None
        if was is not None:
            on_node = self._agents_on_node[was]
            on_node.discard(name)
            if not on_node:
                del self._agents_on_node[was]
            self._changes.agents.add(was)
        if now is not None:
            self._agent_node[name] = now
            self._agents_on_node.setdefault(now, set()).add(name)
            self._changes.agents.add(now)

    def _rule_changed(self, name: str, old: Body | None, new: Body | None) -> None:
        before = self._rules.pop(name, None)
        after = taintrules.Rule.read(new) if new is not None else None
        if after is not None:
            self._rules[name] = after
        self._changes.rules.add(name)
        if before == after:
            return
        touched = [r for r in (before, after) if r is not None]
        if all(r.driver is not None and r.pool is not None for r in touched):
            pools = {(str(r.driver), str(r.pool)) for r in touched}
        else:  # a rule for every pool of a driver, or of a name: look at each
            pools = {p for p in self._pool_slices if any(r.selects_pool(*p) for r in touched)}
        for pool in sorted(pools):
            if pool in self._pool_slices:
                self._reread_pool(pool)

    def _claim_changed(self, name: str, old: Body | None, new: Body | None) -> None:
        before = self._states.pop(name, None)
        if before is not None:
            self.claim_states[before] -= 1
        self._pending.discard(name)
        if new is not None:
            state = claimed.claim_state(new)
            self._states[name] = state
            self.claim_states[state] += 1
            if state == "pending":
                self._pending.add(name)
        held = self.holders.put(name, new)
        self.usage.forget({(driver, pool) for driver, pool, _ in held})
        self._changes.held |= held
        self._changes.claims.add(name)

    def _slice_changed(self, name: str, old: Body | None, new: Body | None) -> None:
        if old is None:
            self._seq += 1
            self._slice_seq[name] = self._seq
        was = self._slice_pool.pop(name, None)
        now = published.pool_key(new) if new is not None else None
        if was is not None:
            self._pool_slices[was].discard(name)
        if now is not None:
            self._slice_pool[name] = now
            self._pool_slices.setdefault(now, set()).add(name)
        if new is None:
            del self._slice_seq[name]
        for pool in {p for p in (was, now) if p is not None}:
            self._reread_pool(pool)
        self._changes.slices.add(name)

    def _reread_pool(self, pool: PoolKey) -> None:
        before = self.pools.get(pool)
        self.usage.forget((pool,))
        self._changes.pools.setdefault(pool, before)
        names = self._pool_slices.get(pool)
        if before is not None:
            for node in {d.node for d in before.devices if d.node}:
                on_node = self._pools_on_node[node]
                on_node.discard(pool)
                if not on_node:
                    del self._pools_on_node[node]
        if not names:
            self._pool_slices.pop(pool, None)
            self.pools.pop(pool, None)
            return
        # The pool's slices in the order they came into the view, as a list of the view's
        # slices would have them.
        bodies: list[Mapping[str, Any]] = [
            self.slices[n] for n in sorted(names, key=self._slice_seq.__getitem__)
        ]
        rules = [r for r in self._rules.values() if r.selects_pool(*pool)]
        if rules:
            bodies = taintrules.tainted_slices(bodies, rules)
        current = published.read_pool(pool[0], pool[1], bodies)
        self.pools[pool] = current
        for node in {d.node for d in current.devices if d.node}:
            self._pools_on_node.setdefault(node, set()).add(pool)


_ON_CHANGE = {
    "DeviceClass": "_class_changed",
    "ResourceClaim": "_claim_changed",
    "ResourceSlice": "_slice_changed",
    "Pod": "_pod_changed",
    "Node": "_node_changed",
    "DeviceTaintRule": "_rule_changed",
}

"""A driver that is gone is marked: the devices of a node whose agent is gone are tainted.

When the agent of a node with a pool of our driver has been gone for ``driver_gone_seconds``
(``agents``: its DaemonSet pod absent or not Ready — the signal, and why it is that one), the
leader writes a ``DeviceTaintRule`` that taints every device of that pool ``NoSchedule``:

- key ``<driver>/agent-gone``, no value, ``timeAdded`` now; the annotation
  ``resource.dra-gpu.io/description`` says why in words ("the agent of gpu.example.com on
  node-02 has not been ready since 2030-01-01T10:00:00Z: no agent pod on node-02"), which the
  explanations show beside the taint (``taintrules``);
- selector ``{driver, pool}``: the pool's devices only, of our driver only;
- named ``<driver>-<pool>-agent-gone`` (a DNS subdomain; a long one shortened with a digest),
  labelled ``app.kubernetes.io/managed-by: dra-gpu``.

The scheduler then places no new claim on those devices (one that tolerates the taint
excepted); pods already running keep running (NoSchedule evicts nothing), and the kubelet
still unprepares what they held once the agent is back. When a Ready agent pod is on the node
again, or the node or its pool is gone, the rule is deleted (with its UID as a precondition).
A rule is ours only if it carries our label, selects our driver and adds our key: no other
rule is ever written or deleted. Every pass compares the rules wanted (the nodes gone past the
grace: few) with ours in the view (few), so a leader that takes over (``sweep``) reconciles
what an earlier one left — a rule whose node's agent is back, or whose node is gone — and
keeps those whose agent is still gone.

Where the API server serves no DeviceTaintRules (``served_version``: resource.k8s.io v1 from
1.37; v1beta2 on 1.36 and v1alpha3 on 1.35 only with the ``DRADeviceTaintRules`` feature gate
and that version enabled), nothing can tell the scheduler: the leader logs that once, posts one
Warning ``DriverGone`` Event on the Node per absence (and a Normal ``DriverBack`` when the agent
returns), and the metric counts the node all the same.

Every replica tracks the absences (``track``: a standby taking over knows since when);
``dra_gpu_nodes_driver_gone`` is the number of nodes gone past the grace (a cluster-wide series,
the leader's). A pass is due when the next node passes its grace (``wake``, on a timer), so a
node is marked within the grace plus a pass, not at the next resync. The leader's job:
``sweep``, ``note``, ``run_once``.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import time
from collections.abc import Callable

from dra_gpu import kube
from dra_gpu.controller import agents, published, taintrules
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.view import Changes, ClusterView
from dra_gpu.resource import labels, names
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
GROUP = "/apis/resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")
"""DeviceTaintRule's versions, newest first: the first one served is used."""
EFFECT = "NoSchedule"


async def served_version(api: kube.Kube) -> str | None:
    """The newest version of resource.k8s.io that serves ``devicetaintrules`` (None: none).
    Discovery is readable by every authenticated client; an error other than 404 is raised."""
    for version in VERSIONS:
        try:
            listing = await api.get(f"{GROUP}/{version}")
        except kube.ApiError as exc:
            if exc.not_found:
                continue
            raise
        if any(r.get("name") == "devicetaintrules" for r in listing.get("resources") or ()):
            return version
    return None


def taint_key(driver: str) -> str:
    return f"{driver}/agent-gone"


def rule_name(driver: str, pool: str) -> str:
    """``<driver>-<pool>-agent-gone``: one per pool (our agent's pool is its node), a DNS
    subdomain; made one (lower case, other characters as ``-``, a digest when too long)."""
    wanted = f"{driver}-{pool}-agent-gone"
    if names.is_dns_subdomain(wanted):
        return wanted
    digest = hashlib.sha256(f"{driver}/{pool}".encode()).hexdigest()[:10]
    cleaned = "".join(c if c.isalnum() or c in "-." else "-" for c in wanted.lower())
    cleaned = cleaned.strip("-.")[: 253 - 12].rstrip("-.")
    return f"{cleaned}-{digest}"


class DriverGone:
    def __init__(
        self,
        view: ClusterView,
        api: kube.Kube,
        reporter: Reporter,
        driver: str,
        grace: float,
        wake: Callable[[], None],
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.view = view
        self.api = api
        self.reporter = reporter
        self.driver = driver
        self.enabled = enabled
        """Off (no agent selector: agents run as plain processes): nothing is tracked."""
        self.wake = wake
        self.wall = wall
        self.absences = agents.Absences(grace, clock, wall)
        self.key = taint_key(driver)
        self.version: str | None = None
        """DeviceTaintRule's served version (``discover``); None: the fallback."""
        self._discovered = False
        self._looked = False
        self._told: set[str] = set()  # fallback: nodes told DriverGone in this absence
        self._timer: asyncio.TimerHandle | None = None
        metrics.NODES_DRIVER_GONE.set(0)

    async def discover(self) -> str | None:
        """Ask the API server, once, which version serves DeviceTaintRules."""
        if not self._discovered:
            self.version = await served_version(self.api)
            self._discovered = True
            if self.version is None:
                log.warning(
                    "the API server serves no DeviceTaintRules (resource.k8s.io v1 from "
                    "Kubernetes 1.37; earlier, the DRADeviceTaintRules feature gate): nodes whose "
                    "agent of %s is gone get a Warning Event DriverGone instead of a device "
                    "taint, and the scheduler may still place claims on their devices",
                    self.driver,
                )
        return self.version

    # ---- every replica -------------------------------------------------------------------

    def track(self, changes: Changes) -> None:
        """Look again at the nodes the changes touch (all of them, the first time); the gauge."""
        if not self.enabled:
            return
        if not self._looked:
            self._looked = True
            nodes = self.view.agent_nodes() | {
                n
                for (d, _), pool in self.view.pools.items()
                if d == self.driver
                for n in _nodes(pool)
            }
        else:
            nodes = set(changes.agents) | set(changes.nodes)
            for key, before in changes.pools.items():
                if key[0] != self.driver:
                    continue
                nodes |= _nodes(before) | _nodes(self.view.pools.get(key))
        for node in sorted(nodes):
            self.absences.update(node, self.view.agents_on(node), has_pool=bool(self._pools(node)))
        metrics.NODES_DRIVER_GONE.set(len(self.absences.gone()))

    def _pools(self, node: str) -> list[str]:
        """Our pools whose devices are all on ``node`` (our agent's: the node's own), while
        the Node exists."""
        if node not in self.view.nodes:
            return []
        found = []
        for driver, pool in sorted(self.view.pools_on_node(node)):
            if driver == self.driver and _nodes(self.view.pools[(driver, pool)]) == {node}:
                found.append(pool)
        return found

    # ---- the leader ----------------------------------------------------------------------

    def sweep(self) -> None:
        self._told.clear()

    def note(self, changes: Changes) -> None:
        pass  # every pass compares what is wanted with what is there (both few)

    async def run_once(self) -> None:
        if not self.enabled:
            return
        gone = self.absences.gone()
        metrics.NODES_DRIVER_GONE.set(len(gone))
        version = await self.discover()
        if version is None:
            await self._tell(gone)
        else:
            await self._reconcile(version, gone)
        self._wake_when_due()

    async def _reconcile(self, version: str, gone: dict[str, agents.Absence]) -> None:
        path = f"{GROUP}/{version}/devicetaintrules"
        wanted = {
            rule_name(self.driver, pool): (node, pool)
            for node in gone
            for pool in self._pools(node)
        }
        ours = {n: b for n, b in self.view.taint_rules.items() if self._ours(b)}
        for name, (node, pool) in sorted(wanted.items()):
            if name in ours:
                continue
            absence = gone[node]
            body = self._rule(version, name, node, pool, absence)
            try:
                await self.api.create(path, body)
            except kube.ApiError as exc:
                if exc.conflict:  # there already: ours a moment ago, or not ours at all
                    continue
                raise
            log.warning(
                "node %s: the agent of %s is gone (%s, since %s): tainted its devices %s:%s "
                "(DeviceTaintRule %s)",
                node,
                self.driver,
                absence.why,
                absence.since,
                self.key,
                EFFECT,
                name,
            )
            metrics.TAINT_RULE_WRITES.labels("create").inc()
        for name, body in sorted(ours.items()):
            if name in wanted:
                continue
            pool = str((body["spec"].get("deviceSelector") or {}).get("pool", ""))
            await self.api.delete(f"{path}/{name}", uid=body["metadata"].get("uid"))
            log.info(
                "pool %s: the agent of %s is back (or the node or pool is gone): "
                "DeviceTaintRule %s deleted",
                pool,
                self.driver,
                name,
            )
            metrics.TAINT_RULE_WRITES.labels("delete").inc()

    def _ours(self, body: kube.Body) -> bool:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        return (
            (meta.get("labels") or {}).get(labels.MANAGED_BY_LABEL) == labels.MANAGED_BY_VALUE
            and (spec.get("deviceSelector") or {}).get("driver") == self.driver
            and (spec.get("taint") or {}).get("key") == self.key
        )

    def _rule(
        self, version: str, name: str, node: str, pool: str, absence: agents.Absence
    ) -> kube.Body:
        now = self.wall().replace(microsecond=0).isoformat().replace("+00:00", "Z")
        return {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY_VALUE},
                "annotations": {taintrules.DESCRIPTION_ANNOTATION: self.description(absence)},
            },
            "spec": {
                "deviceSelector": {"driver": self.driver, "pool": pool},
                "taint": {"key": self.key, "effect": EFFECT, "timeAdded": now},
            },
        }

    def description(self, absence: agents.Absence) -> str:
        return (
            f"the agent of {self.driver} on {absence.node} has not been ready since "
            f"{absence.since}: {absence.why}"
        )

    async def _tell(self, gone: dict[str, agents.Absence]) -> None:
        """The fallback: one Warning Event per absence on the Node, a Normal one when back."""
        for node, absence in gone.items():
            body = self.view.nodes.get(node)
            if node in self._told or body is None:
                continue
            message = (
                f"{self.description(absence)}; its devices cannot be tainted (the API server "
                "serves no DeviceTaintRules), so the scheduler may still place claims on them"
            )
            log.warning("Node %s: %s", node, message)
            await self.reporter.warn(body, "Node", "DriverGone", message)
            self._told.add(node)
        for node in sorted(self._told - set(gone)):
            self._told.discard(node)
            body = self.view.nodes.get(node)
            if body is None:
                continue
            message = f"the agent of {self.driver} on {node} is back"
            log.info("Node %s: %s", node, message)
            await self.reporter.warn(body, "Node", "DriverBack", message, type_="Normal")

    def _wake_when_due(self) -> None:
        """A pass when the next node passes its grace (the passes wait for changes)."""
        due = self.absences.due_in()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due is not None:
            self._timer = asyncio.get_running_loop().call_later(due + 0.05, self.wake)


def _nodes(pool: published.Pool | None) -> set[str]:
    return {d.node for d in pool.devices if d.node} if pool is not None else set()

"""Whether each node's agent is there: the rule behind "a driver that is gone is marked".

The signal is **the agent DaemonSet's pod on the node: absent, or not Ready**, for longer than
a grace period, while the node has a pool of our driver published. Why this one:

- it costs no API write: the controller already watches every Pod, and keeps these few (one per
  node, two during a rollout) by their labels (``AgentSelector``). A heartbeat of the agent's
  own — a Lease per node renewed every few seconds — would add one write per node every few
  seconds, a fleet's cost on one API server, to say what the pod's Ready condition says;
- it covers every way an agent goes: it crashes or crash-loops (its ``/readyz``, which the
  kubelet probes, fails: the pod is not Ready), it is evicted or no longer scheduled there (the
  pod is gone), or the node dies (the node lifecycle controller marks its pods not Ready about
  40 s after the kubelet stops posting; ``Ready`` then says ``Unknown``);
- the slices alone cannot say it: they stay published while the agent is down, by design.

Any Ready pod means present, so an agent rollout (the new pod beside the old, a surge) is
never an absence; a pod Ready but being deleted still serves until it exits. A node without a
pool of ours has nothing to mark and is never gone; one that comes back, or whose pool goes, is
forgotten. Time is this replica's monotonic clock from when it first saw the agent gone
(observed time, as the Lease's expiry: no clock compared across machines); ``since`` in words
is the pod's Ready ``lastTransitionTime`` when it has one, else when this replica saw it gone.
A replica that starts (or a new leader) so waits a whole grace before it marks a node, and
never unmarks one whose agent is still gone (``absences`` keeps rules until the agent is back).

Owns: ``AgentSelector`` (which pods are agents), ``agent_ready``, ``Absences`` (per node, since
when its agent is gone; which are gone past the grace; when the next one will be).
Pure: no I/O; the clocks are injected.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Body = Mapping[str, Any]


class AgentSelector:
    """Pods of the agent DaemonSet: a label selector (``k=v,k2=v2``; equality only, as a
    DaemonSet's ``matchLabels``) and a namespace (empty: any)."""

    def __init__(self, selector: str, namespace: str = "") -> None:
        labels: dict[str, str] = {}
        for part in selector.split(","):
            part = part.strip()
            if not part:
                continue
            key, eq, value = part.partition("=")
            value = value[1:] if value.startswith("=") else value  # k==v, as kubectl takes
            if not eq or not key.strip() or "!" in key or "=" in value:
                raise ValueError(
                    f"agent pod selector {selector!r}: {part!r} is not key=value "
                    "(equality only, comma-separated)"
                )
            labels[key.strip()] = value.strip()
        if not labels:
            raise ValueError(f"agent pod selector {selector!r} selects no label")
        self.labels = labels
        self.namespace = namespace

    def __call__(self, pod: Body) -> bool:
        meta = pod.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        on_pod = meta.get("labels") or {}
        return all(on_pod.get(k) == v for k, v in self.labels.items())

    def __repr__(self) -> str:
        text = ",".join(f"{k}={v}" for k, v in self.labels.items())
        return f"AgentSelector({text!r}, namespace={self.namespace!r})"


def _ready(pod: Body) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition
    return None


def agent_ready(pods: Iterable[Body]) -> bool:
    """Any of the node's agent pods Ready (a rollout has two: either one serves)."""
    return any((_ready(p) or {}).get("status") == "True" for p in pods)


def why_absent(node: str, pods: Iterable[Body]) -> tuple[str, str | None]:
    """Why the agent on ``node`` is not there, in words, and since when the API says so (the
    latest Ready ``lastTransitionTime`` of its pods; None: it does not say)."""
    pods = list(pods)
    if not pods:
        return f"no agent pod on {node}", None
    names = ", ".join(
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
        for p in pods
    )
    times = [
        str(c["lastTransitionTime"])
        for p in pods
        if (c := _ready(p)) and c.get("lastTransitionTime")
    ]
    what = "agent pod {} is" if len(pods) == 1 else "agent pods {} are"
    return f"{what.format(names)} not Ready", (max(times) if times else None)


@dataclasses.dataclass(frozen=True)
class Absence:
    """A node whose agent is gone: since when (this replica's clock, and in words)."""

    node: str
    observed: float
    """This replica's monotonic clock when it first saw the agent gone."""
    since: str
    """When, as an RFC 3339 time: the pod's Ready transition, else when seen gone."""
    why: str
    """``no agent pod on node-02`` or ``agent pod ns/x is not Ready``."""


class Absences:
    """Per node with a pool of ours, since when its agent is gone.

    ``update`` each node whose agent pods, pools or Node changed; ``gone`` lists those gone
    for longer than ``grace`` seconds, ``due_in`` says when the next will be."""

    def __init__(
        self,
        grace: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.grace = grace
        self.clock = clock
        self.wall = wall
        self._absent: dict[str, Absence] = {}

    def update(self, node: str, pods: Iterable[Body], *, has_pool: bool) -> bool:
        """Look at ``node`` again: its agent pods, and whether it has a pool of ours (and
        exists). Returns whether its state (present, absent) changed."""
        pods = list(pods)
        if not has_pool or agent_ready(pods):
            return self._absent.pop(node, None) is not None
        why, since = why_absent(node, pods)
        known = self._absent.get(node)
        if known is not None:
            if known.why != why:  # the pod came back, not Ready yet (or went): same absence
                self._absent[node] = dataclasses.replace(known, why=why, since=since or known.since)
            return False
        seen = self.wall().replace(microsecond=0).isoformat().replace("+00:00", "Z")
        self._absent[node] = Absence(node, self.clock(), since or seen, why)
        return True

    def forget(self, node: str) -> None:
        self._absent.pop(node, None)

    def absent(self) -> dict[str, Absence]:
        """Every node whose agent is gone, past the grace or not."""
        return dict(self._absent)

    def gone(self) -> dict[str, Absence]:
        """Nodes whose agent has been gone for longer than the grace, by name."""
        now = self.clock()
        return {n: a for n, a in sorted(self._absent.items()) if now - a.observed >= self.grace}

    def due_in(self) -> float | None:
        """Seconds until the next node passes the grace (None: none is on its way)."""
        now = self.clock()
        waiting = [a.observed + self.grace - now for a in self._absent.values()]
        waiting = [w for w in waiting if w > 0]
        return min(waiting) if waiting else None

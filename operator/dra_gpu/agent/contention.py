"""One writer per pool: what an agent does when another agent writes the pool it publishes.

Two agents of one driver on one node (the old and the new pod of a rolling update, two releases
or DaemonSets with the same driver name) would otherwise overwrite each other's pool in a hot
loop: each write is the other's watch event, each reads as "the pool is wrong", and the pool's
generation climbs by thousands within minutes. Every slice says who wrote it
(``slices.Publisher``: the time the kubelet registered the writer, and its instance), and this
module decides, purely (no I/O, time passed in):

- A pool written by an agent that the kubelet registered *later* than us belongs to it: the
  kubelet calls the plugin it registered last, so that is the agent that prepares the devices
  the pool shows. While that agent's registration is live on the node (the caller says so,
  ``newer_registered``: the registry directory holds another live registration of the
  driver), we **hand the pool over**: we write nothing, not even tries, and say so once (a
  Normal Event: a rolling update does this on every node). Once it is no longer registered
  (its pod went: a rollout rolled back, a release removed), the pool is ours again, at once.
  A caller that cannot tell (``newer_registered`` None) gets the older rule: we yield, and
  try to take the pool back after a back-off that doubles on every failed try
  (``initial_seconds`` up to ``max_seconds``).
- A pool written by an agent registered *earlier* (or one that does not say who it is: an
  older dra-gpu, a hand edit) is ours to write. The first time at once; if that agent writes
  again sooner than our back-off after our write, it does not yield, and our answers back off
  exponentially, so no pair of agents ever loops hot, whatever the other one does.
- A pool whose last writer is not this process but which we never wrote ourselves is a
  predecessor's (this agent restarted, or the old pod of a rolling update): ours to replace,
  no conflict.

A conflict (two live writers that do not agree who publishes) is reported once per other agent
(the caller logs it and posts a Warning Event on the Node), and counted every time the other
agent's write is found over ours; a handover is not a conflict.
"""

from __future__ import annotations

import dataclasses

from dra_gpu.agent.slices import Publisher

INITIAL_SECONDS = 5.0
MAX_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do about a pool that another agent wrote last."""

    wait: float
    """Seconds until we may write the pool; 0: now."""
    conflict: bool
    """The other agent wrote the pool after we did, or is registered after us: two live
    writers (the caller counts it)."""
    report: str | None = None
    """Set the first time a conflict with this other agent is found: the log line and
    Event message."""
    notice: str | None = None
    """Set when the pool is handed over to a newer agent, or taken back from one that is gone:
    a log line and a Normal Event, not a conflict."""


class Contention:
    """The back-off state of one publisher against other writers of its pool."""

    def __init__(
        self,
        *,
        pool: str,
        driver: str,
        initial_seconds: float = INITIAL_SECONDS,
        max_seconds: float = MAX_SECONDS,
    ) -> None:
        self.pool = pool
        self.driver = driver
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds
        self.backoff = initial_seconds
        self.yielding_to: Publisher | None = None
        """The later-registered agent we leave the pool to, while we do."""
        self.other: Publisher | None = None
        """The last other agent found writing over us (for the metric; forgotten after twice
    ``max_seconds`` without a conflict)."""
        self.other_unnamed = False
        """... or True if that writer did not say who it is."""
        self._last_write: float | None = None
        self._last_conflict: float | None = None
        self._not_before = 0.0
        self._answered: int | None = None  # the other's generation our back-off last counted
        self._reported: set[str] = set()
        self.handed_over = False
        """``yielding_to`` is a newer agent that is registered: we write nothing until it goes."""
        self._noticed: set[str] = set()

    @property
    def yielding(self) -> bool:
        return self.yielding_to is not None

    def wrote(self, now: float) -> None:
        """We wrote the pool at ``now``."""
        self._last_write = now

    def settled(self, now: float) -> str | None:
        """The pool shows what we would publish. Returns a line to log when that ends a yield:
        our try has stood for ``initial_seconds`` (our own write comes back through the watch
        at once, the other agent's answer a moment later), so we took the pool over. After
        twice ``max_seconds`` without a conflict the back-off starts from the beginning."""
        message = None
        if self.yielding_to is not None and not self.handed_over:
            if self._last_write is None or now - self._last_write < self.initial_seconds:
                return None
            message = (
                f"ResourceSlice pool {self.pool} of driver {self.driver}: took it over from "
                f"{self.yielding_to.instance}, which no longer writes it"
            )
            self.yielding_to = None
        if self._last_conflict is not None and now - self._last_conflict > 2 * self.max_seconds:
            self.backoff = self.initial_seconds
            self._last_conflict = None
            self.other, self.other_unnamed = None, False
        return message

    def foreign(
        self,
        writer: Publisher | None,
        me: Publisher,
        generation: int,
        now: float,
        *,
        newer_registered: bool | None = None,
    ) -> Decision:
        """The pool must change, and its newest slices were written by ``writer`` (None: a
        writer that does not say who it is) at ``generation``, not by us (``me``).
        ``newer_registered``: whether another agent of the driver is registered with the
        node's kubelet now (None: not known)."""
        newer = writer is not None and writer > me
        if newer_registered is not None and (newer or self.handed_over):
            return self._hand_over(writer if newer else None, me, now, newer_registered)
        if self._last_write is None and not newer:
            return Decision(0.0, conflict=False)  # a predecessor's pool: ours to replace
        fresh = generation != self._answered  # a write of theirs we have not reacted to yet
        self._answered = generation
        if fresh:
            self._last_conflict = now
            self.other, self.other_unnamed = writer, writer is None
        if newer:
            assert writer is not None
            if self.yielding_to is None or self.yielding_to.instance != writer.instance:
                self.yielding_to = writer
                self._not_before = now + self.backoff
            elif now >= self._not_before:  # time to try again; if it still writes: longer
                self.backoff = min(2 * self.backoff, self.max_seconds)
                self._not_before = now + self.backoff
                return Decision(0.0, conflict=fresh)
            wait = self._not_before - now
            action = (
                f"{writer.instance} was registered with the kubelet after this agent, so it "
                f"publishes; this agent backs off (next try in {wait:.0f} s, then ever longer "
                f"up to {self.max_seconds:.0f} s) and takes over when it stops"
            )
            return Decision(wait, conflict=fresh, report=self._report(writer, me, action))
        if self.yielding_to is not None:
            # We were registered again after it (its sockets went away, ours came back): the
            # pool is ours from now on; ``settled`` ends the yield once our write stands.
            self._not_before = now
        elif fresh:
            assert self._last_write is not None
            quick = now - self._last_write < self.backoff
            self.backoff = (
                min(2 * self.backoff, self.max_seconds) if quick else self.initial_seconds
            )
            self._not_before = self._last_write + self.backoff if quick else now
        wait = max(0.0, self._not_before - now)
        action = (
            "this agent was registered with the kubelet after it, so it keeps publishing; "
            "the other agent should back off (if it keeps writing, this agent answers ever "
            f"more slowly, up to every {self.max_seconds:.0f} s)"
        )
        return Decision(wait, conflict=True, report=self._report(writer, me, action))

    def _hand_over(
        self, writer: Publisher | None, me: Publisher, now: float, registered: bool
    ) -> Decision:
        """``writer`` (None: we were registered again after the one we handed over to) is
        newer than us; ``registered``: it, or another agent, is registered now."""
        if writer is not None and registered:
            self.yielding_to, self.handed_over = writer, True
            self._answered = None
            key = f"to {writer.instance}"
            notice = None
            if key not in self._noticed:
                self._noticed.add(key)
                notice = (
                    f"ResourceSlice pool {self.pool} of driver {self.driver}: {me.instance} "
                    f"hands it over to {writer}, which the kubelet registered later and "
                    "calls now (a rolling update?); this agent no longer writes it while that "
                    "one is registered"
                )
            return Decision(self.max_seconds, conflict=False, notice=notice)
        gone = self.yielding_to
        self.yielding_to, self.handed_over = None, False
        self.backoff, self._not_before = self.initial_seconds, now
        why = (
            "is no longer registered with the kubelet"
            if writer is not None or not registered
            else "was registered before this agent's registration came back"
        )
        notice = (
            f"ResourceSlice pool {self.pool} of driver {self.driver}: {me.instance} takes it "
            f"back from {gone.instance if gone is not None else 'the newer agent'}, which {why}"
        )
        return Decision(0.0, conflict=False, notice=notice)

    def _report(self, writer: Publisher | None, me: Publisher, action: str) -> str | None:
        key = writer.instance if writer is not None else ""
        if key in self._reported:
            return None
        self._reported.add(key)
        who = str(writer) if writer is not None else "an agent that does not say which"
        return (
            f"ResourceSlice pool {self.pool} of driver {self.driver} is also written by "
            f"another agent, {who}; this agent is {me}. Two agents serve driver "
            f"{self.driver} on node {self.pool} (two releases or DaemonSets with one driver "
            f"name, or an old pod still running?): {action}"
        )

"""Leader election with a coordination.k8s.io Lease: one controller replica acts at a time.

Every replica watches and keeps its view warm; only the leader writes (Events, claim status
repairs, stale slice deletions, the admission certificates). The rules are client-go's
(``k8s.io/client-go/tools/leaderelection``), on a monotonic clock (``clock``), so no replica
ever compares its wall clock with another's:

- **Renew deadline.** The leader renews every ``renew_seconds``; each try runs under a
  timeout that ends at ``last successful renew + renew_deadline``. ``is_leader`` is computed
  from the clock (``leading_until()``), so a leader whose renewal hangs stops acting exactly at
  its deadline, even while the request is still blocked and even if the event loop is busy
  elsewhere; ``changed`` is set then too. "The last successful renew" is the moment *before*
  that try's first request was sent: the others cannot have seen it earlier.
- **Observed-time expiry.** A standby keeps the record it last saw (``observed``: holder,
  times, duration, transitions, as the API holds them) and the local time it saw it *change*.
  The lease has expired only when it has stayed unchanged for ``leaseDurationSeconds`` of this
  replica's own clock; ``renewTime`` is written (for people and for client-go) but never
  compared with a local clock, so clock skew neither shortens nor lengthens a lease.
- So, with ``renew_deadline < lease_seconds``: the old leader stops at ``t + renew_deadline``
  (``t``: before its last renewal was sent), a standby takes over no earlier than
  ``t + lease_seconds`` (it cannot have seen that renewal before ``t``); the margin between
  the two is ``lease_seconds - renew_deadline`` (5 s of the default 15 s, client-go's 15/10/2).
- Writes are optimistic (``resourceVersion`` on replace; create on 404), so two replicas never
  both win one round. On a clean stop ``release`` steps down first, then empties
  ``holderIdentity``; a standby watches the Lease and takes a released one at once.
- A standby's tries are jittered as client-go's ``acquire`` loop jitters them
  (``wait.JitterUntil(RetryPeriod, JitterFactor=1.2)``): replicas started together do not try
  in step. The leader renews on the beat (``wait.Until``, no jitter), as client-go does.

Owns: the Lease (``try_acquire_or_renew``, ``release``), ``is_leader`` / ``leading_until`` /
``changed`` (what every writer checks), and ``acting`` (a scope whose body is cancelled at the
renew deadline: for writes that must not outlive the leadership they started under). The pure
rules (``Observation``, ``observe``, ``expired``, ``released``) take a clock value in and give a
decision out.

Why not ``kubernetes_asyncio.leaderelection`` (36.1, a dependency already): its renew loop
checks the deadline only *between* tries, and a try is not bounded, so a renewal that hangs
keeps the replica leading for as long as the request takes (the 30 s this module used to
allow); it signals leadership only by running and cancelling a callback (our parts read a
flag, ``is_leader``, before each write), measures times with ``time.time()`` (a wall-clock
step moves the deadline and the expiry) and writes local naive times with a ``Z``, expires the
observed record with its own configured duration rather than the record's, never releases the
lease on a stop, polls instead of watching (no takeover at once on a release), and talks through
kubernetes-asyncio's ``ApiClient`` and its own credential loading, not ``kube.Kube`` (our
kubeconfig handling, token refresh and request metrics). Fixing those would be a rewrite of its
300 lines; this module is client-go's rules on our client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

from dra_gpu import kube
from dra_gpu.kube import backoff

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Seconds on a monotonic clock (``time.monotonic``: the event loop's clock, too)."""
JITTER = 1.2
"""client-go's ``JitterFactor`` for a standby's tries: each waits up to 2.2 retry periods."""


class NotLeading(Exception):
    """``LeaderElector.acting`` was entered by a replica that does not lead."""


def renew_deadline_for(lease_seconds: float) -> float:
    """client-go's proportion (10 s of a 15 s lease): a leader that could not renew for this
    long stops acting, a third of the lease before anyone may take over."""
    return lease_seconds * 2 / 3


def retry_seconds_for(lease_seconds: float) -> float:
    """client-go's proportion (2 s of a 15 s lease): how often the leader renews and a standby
    tries; five tries fit in the renew deadline."""
    return lease_seconds * 2 / 15


# ---- the pure rules -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Observation:
    """A Lease's ``spec`` as this replica last saw it, and when (``clock``) it last saw it
    change: client-go's ``observedRecord`` and ``observedTime``."""

    record: dict[str, Any]
    at: float


def observe(previous: Observation | None, record: dict[str, Any], now: float) -> Observation:
    """``previous`` if ``record`` is the record it holds (its time stays), else ``record``
    observed ``now``. Any field counts: a renewal changes ``renewTime``."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(dict(record), now)


def released(spec: dict[str, Any]) -> bool:
    """Whether nobody holds the lease (its holder gave it up on a clean stop)."""
    return not spec.get("holderIdentity")


def duration_of(spec: dict[str, Any], default: float) -> float:
    """The record's ``leaseDurationSeconds``; ``default`` when it has none."""
    seconds = spec.get("leaseDurationSeconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else default


def expired(observation: Observation, now: float, default_seconds: float) -> bool:
    """Whether another replica may take the lease ``now``: it is released, or its record has
    not changed for its ``leaseDurationSeconds`` (``default_seconds`` if it has none) of this
    replica's clock. ``renewTime`` is not looked at: it is another machine's wall clock."""
    record = observation.record
    if released(record):
        return True
    return observation.at + duration_of(record, default_seconds) < now


def standby_wait(
    retry_seconds: float,
    observation: Observation | None,
    now: float,
    default_seconds: float,
    rand: Callable[[], float],
) -> float:
    """How long a standby waits before its next try: ``retry_seconds`` jittered by
    ``JITTER`` (client-go's ``acquire``), but no later than just after the observed record
    expires (``expired``), so a lease that lapsed is taken at once."""
    wait = backoff.jittered(retry_seconds, JITTER, rand)
    if observation is not None and not released(observation.record):
        expiry = observation.at + duration_of(observation.record, default_seconds)
        wait = max(0.0, min(wait, expiry - now + 0.001))
    return wait


def _micro(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wall() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# ---- the elector --------------------------------------------------------------------------


class LeaderElector:
    """One replica's candidacy for the Lease ``namespace/name``; ``run_forever`` runs it.

    ``lease_seconds``: how long a record that stopped changing keeps others off (written as
    ``leaseDurationSeconds``, rounded up to whole seconds); ``renew_deadline``: how long the
    leader keeps acting without a successful renewal (default ``renew_deadline_for``, must be
    shorter than the lease); ``renew_seconds``: how often the leader renews and a standby tries
    (default ``retry_seconds_for``, must be shorter than the deadline); ``clock``: monotonic
    seconds (tests inject one); ``rand``: uniform in [0, 1), a standby's jitter (tests
    inject one)."""

    def __init__(
        self,
        api: kube.Kube,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15,
        renew_deadline: float | None = None,
        renew_seconds: float | None = None,
        clock: Clock = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        deadline = renew_deadline_for(lease_seconds) if renew_deadline is None else renew_deadline
        retry = retry_seconds_for(lease_seconds) if renew_seconds is None else renew_seconds
        if not 0 < deadline < lease_seconds:
            raise ValueError(
                f"the renew deadline ({deadline:g} s) must be positive and shorter than the "
                f"lease ({lease_seconds:g} s), or a standby may take over before the leader stops"
            )
        if not 0 < retry < deadline:
            raise ValueError(
                f"the renew period ({retry:g} s) must be positive and shorter than the renew "
                f"deadline ({deadline:g} s), or one late renewal costs the leadership"
            )
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = deadline
        self.renew_seconds = retry
        self.clock = clock
        self.rand = rand
        self.changed = asyncio.Event()
        """Set whenever ``is_leader`` changes (cleared by its one reader, the pass loop)."""
        self.observed: Observation | None = None
        """The Lease's spec as last read or watched, and when it last changed (``clock``)."""
        self._renewed_at: float | None = None
        """``clock`` before the last try that wrote our name into the Lease was sent."""
        self._holding = False
        """The last write we know of names us (the deadline alone may have ended it)."""
        self._reported = False
        """What ``changed`` and the log last said."""
        self._seen: str | None = None
        """The Lease's resourceVersion when another replica held it (a standby watches from
        there)."""
        self._scopes: set[asyncio.Timeout] = set()
        """The ``acting`` scopes open now: each renewal moves their deadline."""

    # ---- what writers read ----------------------------------------------------------------

    def leading_until(self) -> float | None:
        """The ``clock`` time at which this replica stops leading unless it renews first
        (``last renew + renew_deadline``; in the past once that has passed without a
        renewal); None when no write of ours is known to hold the lease."""
        if not self._holding or self._renewed_at is None:
            return None
        return self._renewed_at + self.renew_deadline

    @property
    def is_leader(self) -> bool:
        """Whether this replica may write now: it holds the lease and its last renewal is
        less than ``renew_deadline`` old. Computed from the clock at every read."""
        until = self.leading_until()
        return until is not None and self.clock() < until

    @is_leader.setter
    def is_leader(self, leading: bool) -> None:
        """For tests of the parts that read it: True leads as after a renewal now, False
        steps down. The elector itself never assigns it."""
        self._holding = leading
        self._renewed_at = self.clock() if leading else None
        self._report("set")

    @contextlib.asynccontextmanager
    async def acting(self) -> AsyncIterator[None]:
        """A scope for leader-only work: raises ``NotLeading`` when this replica does not
        lead; otherwise its body is cancelled (``TimeoutError``) when the leadership ends,
        however long a request inside it hangs; renewals extend it."""
        until = self.leading_until()
        if until is None or not self.is_leader:
            raise NotLeading(f"{self.identity} does not hold the lease {self.name}")
        async with asyncio.timeout_at(self._loop_time(until)) as scope:
            self._scopes.add(scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)

    def _loop_time(self, moment: float) -> float:
        """``moment`` (``clock``) on the event loop's clock."""
        return asyncio.get_running_loop().time() + (moment - self.clock())

    def _report(self, why: str) -> None:
        """Tell ``changed``, the log and the ``acting`` scopes what ``is_leader`` is now."""
        leading = self.is_leader
        until = self.leading_until()
        for scope in self._scopes:
            if not scope.expired():  # one that fired is unwinding: it cannot be moved
                scope.reschedule(self._loop_time(until) if leading and until is not None else -1.0)
        if leading == self._reported:
            return
        self._reported = leading
        self.changed.set()
        if leading:
            log.info("%s acquired the lease %s", self.identity, self.name)
        else:
            log.info("%s lost the lease %s: %s", self.identity, self.name, why)

    # ---- running ---------------------------------------------------------------------------

    async def run_forever(self) -> NoReturn:
        while True:
            await self.attempt()
            await self._pause()

    async def attempt(self) -> bool:
        """One bounded try to acquire or renew; whether it wrote our name into the Lease. As
        the leader, the try ends at the renew deadline (then ``is_leader`` is False and
        ``changed`` set); as a standby, after ``renew_deadline``."""
        started = self.clock()
        until = self.leading_until() if self.is_leader else None
        budget = self.renew_deadline if until is None else until - started
        ok = False
        why = "the lease is held by another replica"
        try:
            async with asyncio.timeout(max(budget, 0.0)):
                ok = await self.try_acquire_or_renew(started)
        except TimeoutError:
            why = f"no renewal within the renew deadline of {self.renew_deadline:g} s"
            log.warning("lease %s: no answer within %.3g s", self.name, budget)
        except Exception as exc:  # API restarting: the deadline decides, not one failure
            why = f"no renewal within the renew deadline of {self.renew_deadline:g} s ({exc})"
            log.warning("lease %s: %s", self.name, exc)
        self._report(why)
        return ok

    async def _pause(self) -> None:
        """Until the next try: ``renew_seconds`` (a leader: or its deadline, to say it
        stopped); a standby's is jittered (``JITTER``), and it also wakes when the lease it
        watches is released or expires."""
        now = self.clock()
        until = self.leading_until()
        if self.is_leader and until is not None:
            await asyncio.sleep(min(self.renew_seconds, max(0.0, until - now)))
            self._report(f"no renewal within the renew deadline of {self.renew_deadline:g} s")
            return
        wait = standby_wait(self.renew_seconds, self.observed, now, self.lease_seconds, self.rand)
        if self._seen is None:
            await asyncio.sleep(wait)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._released(self._seen)

    async def _released(self, resource_version: str) -> None:
        """Returns when the Lease, as seen at ``resource_version``, is released or deleted (a
        watch of the one Lease, whose events are observations too); on a watch error, after
        the usual period."""
        try:
            async for event in self.api.watch_once(
                self.collection,
                resource_version,
                timeout_seconds=max(1, math.ceil(self.renew_seconds)),
                fieldSelector=f"metadata.name={self.name}",
            ):
                lease = event.get("object") or {}
                if event.get("type") == "DELETED":
                    return
                if event.get("type") in ("ADDED", "MODIFIED"):
                    spec = lease.get("spec") or {}
                    self.observed = observe(self.observed, spec, self.clock())
                    if released(spec):
                        return
        except Exception as exc:  # the next try says what is wrong, if anything is
            log.debug("watching lease %s: %s", self.name, exc)
        await asyncio.sleep(self.renew_seconds)

    async def try_acquire_or_renew(self, started: float | None = None) -> bool:
        """Read the Lease and, when it is ours or another's has expired (``expired``), write
        our name and a fresh ``renewTime``; whether that write succeeded. ``started``: the
        ``clock`` time before this try sent anything (default: now), which a success makes the
        last renewal. Seeing another holder ends our leadership at once; a conflict or an
        error leaves it to the deadline."""
        started = self.clock() if started is None else started
        wall = _micro(_wall())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.lease_seconds),
            "renewTime": wall,
        }
        self._seen = None
        try:
            lease = await self.api.get(self.path)
        except kube.ApiError as exc:
            if not exc.not_found:
                raise
            self.observed = None
            body: dict[str, Any] = {**spec, "acquireTime": wall, "leaseTransitions": 0}
            try:
                created = await self.api.create(
                    self.collection,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name},
                        "spec": body,
                    },
                )
            except kube.ApiError as create_exc:
                if create_exc.conflict:
                    return False  # another replica created it first
                raise
            return self._renewed(created, started)
        current = lease.get("spec") or {}
        self.observed = observe(self.observed, current, self.clock())
        mine = current.get("holderIdentity") == self.identity
        if not mine:
            self._holding = False  # someone else's now (or released): we do not lead
            if not expired(self.observed, self.clock(), self.lease_seconds):
                self._seen = lease["metadata"].get("resourceVersion")
                return False
            spec["acquireTime"] = wall
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**current, **spec}
        try:
            replaced = await self.api.replace(self.path, lease)  # resourceVersion: optimistic
        except kube.ApiError as exc:
            if exc.conflict:
                return False
            raise
        return self._renewed(replaced, started)

    def _renewed(self, lease: dict[str, Any], started: float) -> bool:
        """Our write landed: we lead until ``started + renew_deadline``."""
        self._holding = True
        self._renewed_at = started
        if isinstance(lease, dict) and isinstance(lease.get("spec"), dict):
            self.observed = observe(self.observed, lease["spec"], self.clock())
        self._report("renewed")
        return True

    async def release(self) -> None:
        """On a clean stop: step down (at once: nothing more is written as the leader), then
        empty ``holderIdentity`` so a standby takes over at once. Bounded by the renew
        deadline; on failure the lease simply expires."""
        held = self._holding
        self._holding = False
        self._renewed_at = None
        self._report("released on stop")
        if not held:
            return
        try:
            async with asyncio.timeout(self.renew_deadline):
                lease = await self.api.get(self.path)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") == self.identity:
                    now = _micro(_wall())
                    # As client-go releases: no holder, 1 s, so its standbys also move at once.
                    lease["spec"] = {
                        **spec,
                        "holderIdentity": "",
                        "leaseDurationSeconds": 1,
                        "renewTime": now,
                        "acquireTime": now,
                    }
                    await self.api.replace(self.path, lease)
        except Exception as exc:
            log.warning("releasing lease %s: %s", self.name, exc)

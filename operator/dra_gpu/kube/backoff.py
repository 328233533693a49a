"""Exponential back-off with jitter: how every retry loop of the package waits between tries,
modelled on apimachinery's ``wait.Backoff`` (``pkg/util/wait/backoff.go``: ``Step``, ``delay``,
``DelayWithReset``; ``wait.go``: ``Jitter``).

Why our own and not a library: none of tenacity, stamina or backoff is a dependency
(pyproject.toml), and the loops that need one are not functions to decorate: a watch that yields
events between its tries, a file lock polled on the event loop, a readiness wait that also ends
when the process stops, a request whose server says how long to wait (``Retry-After``). They need
the delays themselves, raised to what the server asks for, with the clock, the sleep and the
randomness injectable so that tests never wait; that is ``wait.Backoff``'s forty lines, not a
retry framework.

- ``Backoff`` is the policy, ``wait.Backoff``'s fields: ``duration`` (the first delay),
  ``factor`` (each delay is the one before times this), ``jitter`` (a delay ``d`` is waited as
  ``d + random() * jitter * d``, ``wait.Jitter``; the jitter never compounds into the next
  delay), ``steps`` (how many times the delay may still grow; None: until ``cap``) and ``cap``
  (growth stops there; the jittered delay may exceed it, as in Go: the reflector's 30 s cap
  waits 30-60 s).
- ``Delays`` is one loop's state: ``next`` the delay before the next try, ``wait`` sleeps it
  (at least what the server asked for), ``reset`` after a success. With ``reset_after``, a loop
  that has not backed off for that long starts again from ``duration``: the reflector's
  ``DelayWithReset(clock, 2*time.Minute)``, "if we don't backoff for 2min, assume API server is
  healthy". (Go's backoffManager resets every ``resetInterval`` since its last reset, even in
  the middle of an outage; we reset after that long without a delay asked for, which is what
  the reflector's comment says it wants, and keeps an outage at the capped delay.)
- ``Timing``: the clock, the sleep and the random source a loop uses: ``REAL``, or a test's.

Owns: computing delays and sleeping them. Must not: decide whether to try again, or know what is
tried (the caller does both).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable


@dataclasses.dataclass(frozen=True)
class Timing:
    """How a loop tells the time, waits and draws its jitter: the real ones, or a test's."""

    clock: Callable[[], float] = time.monotonic
    """Seconds, monotonic (the event loop's clock is the same one)."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    random: Callable[[], float] = random.random
    """Uniform in [0, 1)."""


REAL = Timing()


@dataclasses.dataclass(frozen=True)
class Backoff:
    """``wait.Backoff``: the first delay, how it grows, its jitter and where growth stops."""

    duration: float
    """The first delay, in seconds."""
    factor: float = 2.0
    """Each delay is the one before times this (0 or 1: always ``duration``)."""
    jitter: float = 1.0
    """A delay ``d`` is waited as ``d + random() * jitter * d`` (0: no jitter)."""
    steps: int | None = None
    """How many times the delay may grow; None: until ``cap``."""
    cap: float | None = None
    """The delay grows no further than this, in seconds (before its jitter)."""

    def __post_init__(self) -> None:
        if self.duration < 0 or self.factor < 0 or self.jitter < 0:
            raise ValueError(f"{self}: duration, factor and jitter must not be negative")
        if self.cap is not None and self.cap < self.duration:
            raise ValueError(f"{self}: the cap is below the first delay")

    def delays(self, timing: Timing = REAL, *, reset_after: float | None = None) -> Delays:
        """A loop's delays under this policy (``Delays``)."""
        return Delays(self, timing, reset_after=reset_after)


def jittered(duration: float, jitter: float, rand: Callable[[], float]) -> float:
    """``wait.Jitter``: ``duration`` plus up to ``jitter`` times itself, drawn uniformly."""
    return duration + rand() * jitter * duration if jitter > 0 else duration


class Delays:
    """The delays of one loop: each ``next`` one grows as ``policy`` says (``wait.Backoff.Step``);
    ``reset`` starts again from the first."""

    def __init__(
        self, policy: Backoff, timing: Timing = REAL, *, reset_after: float | None = None
    ) -> None:
        self.policy, self.timing, self.reset_after = policy, timing, reset_after
        self.taken = 0
        """Delays taken since the last reset."""
        self.base = 0.0
        """The last delay taken, before its jitter (for messages: "next in 4 s")."""
        self._duration, self._steps = policy.duration, policy.steps
        self._last: float | None = None

    def reset(self) -> None:
        """The next delay is the first again (a try succeeded)."""
        self._duration, self._steps, self.taken = self.policy.duration, self.policy.steps, 0

    def next(self) -> float:
        """The delay before the next try, jittered; the one after it grows."""
        now = self.timing.clock()
        quiet = None if self._last is None else now - self._last
        if self.reset_after is not None and quiet is not None and quiet > self.reset_after:
            self.reset()
        self._last = now
        delay = self._duration
        if self._steps is None or self._steps > 0:
            grown = delay * self.policy.factor if self.policy.factor else delay
            if self._steps is not None:
                self._steps -= 1
            if self.policy.cap is not None and grown > self.policy.cap:
                grown, self._steps = self.policy.cap, 0
            self._duration = grown
        self.taken += 1
        self.base = delay
        return jittered(delay, self.policy.jitter, self.timing.random)

    async def wait(self, at_least: float = 0.0) -> float:
        """Sleep the next delay, or ``at_least`` (a server's ``Retry-After``) if that is longer;
        returns the seconds slept."""
        delay = max(self.next(), at_least)
        await self.timing.sleep(delay)
        return delay

"""The client-side rate limit of a process: a token bucket in front of every request but watches,
as client-go's ``flowcontrol.NewTokenBucketRateLimiter(qps, burst)`` (``rest/config.go``,
``util/flowcontrol/throttle.go``; golang.org/x/time/rate underneath).

``burst`` requests go at once; after that, one every ``1/qps`` seconds. Each request takes a
token when it asks, in the order they ask, and waits until its token is due (``rate.Reservation``
semantics: no lock, no polling, first come first served); a request cancelled while it waits
gives its token back. client-go does not throttle watches (``Request.Watch``: "We specifically
don't want to rate limit watches"); ``client.Kube`` skips the bucket for them too, and backs its
watch loop off instead (``watch``).

Owns: ``TokenBucket`` and how long requests waited for it (``waited_seconds``).
Must not: send anything, or know what a request is.
"""

from __future__ import annotations

import logging

from dra_gpu.kube import backoff

log = logging.getLogger(__name__)

LONG_WAIT = 1.0
"""A wait at least this long is logged (client-go's ``longThrottleLatency`` is 50 ms at V(3);
its throttled logger speaks at 1 s), so that a limit set too low shows in the log."""


class TokenBucket:
    """At most ``burst`` requests at once and ``qps`` a second on average."""

    def __init__(
        self,
        qps: float,
        burst: int,
        timing: backoff.Timing = backoff.REAL,
        flags: str = "--api-qps, --api-burst",
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(
                f"a rate limit of {qps:g} requests a second with a burst of {burst}: both must "
                "be positive (no limit at all: no TokenBucket)"
            )
        self.qps, self.burst, self.timing = qps, burst, timing
        self.flags = flags
        """The settings that set this limit, for the log."""
        self.waited_seconds = 0.0
        """How long requests waited for a token, in all."""
        self._tokens = float(burst)
        self._at = timing.clock()

    async def wait(self) -> float:
        """Take a token, waiting until it is due; returns the seconds waited."""
        now = self.timing.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0
        delay = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if delay <= 0:
            return 0.0
        try:
            await self.timing.sleep(delay)
        except BaseException:
            self._tokens += 1.0  # not sent: the token goes back to the next in line
            raise
        self.waited_seconds += delay
        if delay >= LONG_WAIT:
            log.info(
                "waited %.1f s before sending a request: client-side rate limit of %g requests "
                "a second, burst %d (%s)",
                delay,
                self.qps,
                self.burst,
                self.flags,
            )
        return delay

"""Which failed requests ``client.Kube`` sends again, and after how long: client-go's rules, pure.

Followed from client-go's ``rest/with_retry.go`` (``withRetry.IsNextRetry``, ``checkWait``,
``retryAfterResponse``) and ``rest/request.go`` (``Request.request``, ``Request.Watch``,
``retryAfterSeconds``, ``maxRetries: 10``):

- An answer is tried again when its status is 429 or any 5xx **and** it carries a
  ``Retry-After`` header that is a whole number of seconds (``strconv.Atoi``): the wait is that
  many seconds. Without the header (or with an HTTP date, which client-go does not read either)
  it is not tried again: the error goes to the caller at once. This holds for every verb,
  writes included, as in client-go: the API server sends ``Retry-After`` with a 429 that
  priority and fairness, max-in-flight or a server still starting (KEP-3028) rejected before
  doing anything, and client-go sends a write again after a 5xx with the header as well; our
  writes are idempotent or carry a resourceVersion or UID precondition, so a repeat of one that
  did land answers 409 or 404, which their callers handle already.
- A request that got no answer is tried again only when it is a read: a ``GET`` whose
  connection was reset or closed before the answer ended (client-go's ``IsConnectionReset``,
  ``IsProbableEOF``), and a watch whose connection was closed or timed out (``Request.Watch``:
  ``IsProbableEOF || IsTimeout``), each after 1 s (client-go's artificial ``Retry-After: 1``).
  A refused connection, a TLS failure or a write without an answer is not: a write may have
  been done.
- At most ``MAX_RETRIES`` tries after the first (client-go's default ``maxRetries``).

One difference: a ``Retry-After`` longer than ``MAX_RETRY_AFTER`` is not slept inside the
request (client-go would sleep it, bounded only by its context): the ``ApiError`` goes to the
caller with ``retry_after`` set, and a loop that retries (a watch) waits that long itself.
Nothing here blocks a prepare for minutes on one header.

Owns: ``after_answer``, ``after_error`` and the limits. Must not: send or sleep (``client``
does), or know the caller's loops (``watch`` backs off on its own, above these retries).
"""

from __future__ import annotations

import re
from typing import Final

from dra_gpu.kube import transport

MAX_RETRIES: Final = 10
"""Tries after the first one (client-go ``Request.maxRetries``)."""
MAX_RETRY_AFTER: Final = 60.0
"""The longest ``Retry-After`` waited inside one request, in seconds."""
NO_ANSWER_WAIT: Final = 1.0
"""The wait before a read that got no answer is sent again (client-go's artificial
``Retry-After: 1``)."""

_SECONDS = re.compile(r"[+-]?[0-9]+")
"""What Go's ``strconv.Atoi`` takes."""


def retry_after(header: str | None) -> float | None:
    """A ``Retry-After`` header's seconds, as client-go reads it (a whole number, negative
    read as 0), or None for none or another form."""
    if header is None or not _SECONDS.fullmatch(header.strip()):
        return None
    return float(max(0, int(header.strip())))


def after_answer(status: int, header: str | None) -> float | None:
    """How long to wait before sending again a request answered ``status`` with this
    ``Retry-After`` header; None: do not send it again (``checkWait``)."""
    if status != 429 and status < 500:
        return None
    return retry_after(header)


def after_error(verb: str, exc: BaseException) -> float | None:
    """How long to wait before sending again a request of ``verb`` (``GET``, ``WATCH``, ...)
    that got no answer and raised ``exc``; None: do not send it again."""
    eof = isinstance(exc, transport.ConnectionClosed | ConnectionResetError | BrokenPipeError)
    if verb == "GET" and eof:
        return NO_ANSWER_WAIT
    if verb == "WATCH" and (eof or isinstance(exc, TimeoutError)):
        return NO_ANSWER_WAIT
    return None


def status_retry_after(body: object) -> float | None:
    """A ``Status`` body's ``details.retryAfterSeconds`` (what a watch's ERROR event carries in
    place of a header), or None."""
    details = body.get("details") if isinstance(body, dict) else None
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(seconds, int) and not isinstance(seconds, bool):
        return float(max(0, seconds))
    return None

"""How the API client fails, each way its own exception, in words; and the JSON it speaks.

Owns: ``ApiError`` (the API server answered non-2xx, and how long it asked us to wait before
trying again), ``ConfigError`` (no usable kubeconfig or service account: which file, from which
flag or variable, how to fix it), ``Unreachable`` (the API server gives no usable answer: which
address, why), ``Refused`` (it rejects our credentials or permissions), ``CONNECTION_ERRORS``
(what a request that got no answer raises), ``Body`` (a JSON object as the API server takes and
gives it) and ``words``, an exception's message on one line for the messages built above it.

Must not: send, read a file, or know where the credentials came from; the modules above build
the messages (``client`` for ``Unreachable`` and ``Refused``, ``kubeconfig`` for
``ConfigError``).
"""

from __future__ import annotations

from typing import Any

Body = dict[str, Any]
"""A JSON object as the API server takes and gives it: the client speaks plain dicts."""


class ApiError(Exception):
    """The API server answered with a non-2xx status (or a watch sent an ERROR event)."""

    def __init__(
        self,
        method: str,
        path: str,
        status: int,
        body: Body | str,
        retry_after: float | None = None,
    ) -> None:
        self.method, self.path, self.status, self.body = method, path, status, body
        self.retry_after = retry_after
        """The seconds the server asked us to wait before trying again (``Retry-After``, or a
        Status's ``details.retryAfterSeconds``), if it said."""
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {self.reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class ConfigError(Exception):
    """No usable credentials: the kubeconfig is missing or invalid, or a pod's service account
    token is. The message names the file, where its name came from and the fix; nothing was
    sent to any server."""


class Unreachable(Exception):
    """The API server gave no usable answer: no connection, TLS failure, timeout, not ready."""

    def __init__(self, server: str, origin: str, reason: str) -> None:
        self.server, self.origin, self.reason = server, origin, reason
        super().__init__(f"the API server at {server} ({origin}) does not answer: {reason}")


class Refused(Exception):
    """The API server answered and rejected our credentials (401) or permissions (403)."""

    def __init__(self, message: str, status: int) -> None:
        self.status = status
        super().__init__(message)


CONNECTION_ERRORS: tuple[type[OSError], ...] = (OSError,)
"""What a request raises when no answer came: every failure of ``transport`` to get one is an
``OSError`` (``TimeoutError``, ``ssl.SSLError``, ``transport.ConnectionClosed`` ...)."""


def words(exc: BaseException) -> str:
    """An exception's message on one line, without kubernetes-asyncio's boilerplate."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.removeprefix("Invalid kube-config file. ").removesuffix(".")

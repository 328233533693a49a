"""Waiting for conditions with a deadline, never for a fixed time."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = ...,  # noqa: ASYNC109 - a deadline for the whole wait
    interval: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None],
    *,
    timeout: float = ...,  # noqa: ASYNC109 - a deadline for the whole wait
    interval: float = ...,
    what: str = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], object],
    *,
    timeout: float = 60.0,  # noqa: ASYNC109 - a deadline for the whole wait
    interval: float = 0.5,
    what: str = "condition",
) -> object:
    """Call ``probe`` (a plain function or one returning an awaitable) until it returns
    something truthy; return that (never None: hence the overloads' ``T | None``). On timeout
    raise ``TimeoutError`` naming ``what`` and the last value or exception seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = None
    while True:
        try:
            result = probe()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = result
        except AssertionError as exc:
            last = exc
        if loop.time() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s; last: {last!r}")
        await asyncio.sleep(interval)

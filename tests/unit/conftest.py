"""Rules every unit test keeps, checked for each one.

Unit tests are grouped by behaviour area (``agent/``, ``cel/``, ``controller/``, ``devices/``,
``kube/``, ``commands/``, ``monitoring/``, ``testkit/``, ``image/``, ``fuzz/``); each file runs
alone and in any order. Most need nothing but the venv (``make unit``); a file that runs a built
tool (an oracle, helm, promtool) says so with ``pytestmark = pytest.mark.binaries``
(``tests/support/lanes.py``). Fakes and builders more than one folder uses: ``tests/support/``.

A test that leaves an asyncio task running fails: the task would go on in the session's loop
and act in the tests that follow (a publisher still writing, a server still bound), which is
how one test comes to depend on another's order. Stop what you start (``async with``,
``aclose``, cancel and await) before the test returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

SETTLE_ROUNDS = 3
"""Loop iterations a finishing task gets after the test (a cancelled task needs one or two to
run its ``finally``); a task that needs more is still running, not finishing."""


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def no_tasks_left_behind(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    for _ in range(SETTLE_ROUNDS):
        await asyncio.sleep(0)
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    if not left:
        return
    names = ", ".join(sorted(f"{t.get_name()} ({t.get_coro()!r})" for t in left))
    for task in left:  # so that the next test starts clean, whatever this one did
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)
    pytest.fail(f"{request.node.nodeid} left {len(left)} asyncio task(s) running: {names}")

"""The session's rules, for every folder: the lanes tests run in and the order they run in.

Lanes (``tests.support.lanes``): every test under ``tests/e2e`` is marked ``cluster`` and every
test under ``tests/chart`` ``binaries``; elsewhere a test that runs a built tool carries
``pytestmark = pytest.mark.binaries``, and one that forgets fails where it asks for the tool.
``make unit`` runs ``-m "not binaries and not cluster"``: no Go, no build cache needed.

Order: tests marked ``session_end`` run after every other test of the session, whatever their
file is called (``tests/e2e/test_objects_left_alone.py`` checks what the whole suite left).
Otherwise files run in pytest's order, and each test must pass alone and in any order.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.support import lanes


def pytest_configure(config: pytest.Config) -> None:
    lanes.enforce()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lanes.mark_by_folder(items)
    last = {item for item in items if item.get_closest_marker(lanes.SESSION_END)}
    items[:] = [item for item in items if item not in last] + [i for i in items if i in last]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    lanes.running(item)
    try:
        return (yield)
    finally:
        lanes.running(None)

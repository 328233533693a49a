"""The test lanes: what a test needs, said by its markers, and kept by refusing what it lacks.

Three lanes. No marker: the test needs nothing but the venv (``make unit``). ``binaries``: it
runs built tools (``binaries.helm``, ``binaries.prometheus_bin``, the oracles ``binaries.built``
finds). ``cluster``: it runs against the real control plane and real nodes (every test under
``tests/e2e``; ``tests/conftest.py`` marks them), which needs every built tool too.

Owns: the marker names, which folder implies which marker, the session's current test, and
``require``, which every helper that hands out a built tool calls: a test without the marker
fails there, loudly, instead of passing on a machine that happens to have the tool and failing
on one without it. Nothing is ever skipped.
Must not: locate or build tools (``binaries``), or order tests (``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

BINARIES = "binaries"
CLUSTER = "cluster"
SESSION_END = "session_end"

TESTS = Path(__file__).resolve().parents[1]
FOLDER_MARKERS = {TESTS / "e2e": CLUSTER, TESTS / "chart": BINARIES}
"""Every test under one of these folders carries its marker (``mark_by_folder``)."""

ACCEPTED = {BINARIES: (BINARIES, CLUSTER), CLUSTER: (CLUSTER,)}
"""The markers that let a test have what each marker stands for: a cluster test has every
built tool as well."""

_enforcing = False
_current: pytest.Item | None = None


def enforce() -> None:
    """From now on (a pytest session), ``require`` checks the running test's markers; before
    it (a helper run by hand, ``python -m tests.unit.cel.celref``) it allows everything."""
    global _enforcing
    _enforcing = True


def running(item: pytest.Item | None) -> None:
    """The test whose setup, call and teardown run now (None between tests)."""
    global _current
    _current = item


def mark_by_folder(items: list[pytest.Item]) -> None:
    """Adds each folder's marker (``FOLDER_MARKERS``) to the tests under it."""
    for item in items:
        for folder, marker in FOLDER_MARKERS.items():
            if item.path.is_relative_to(folder):
                item.add_marker(marker)


def require(what: str, needs: str = BINARIES) -> None:
    """Fails the running test unless it carries ``needs`` (or a marker that implies it);
    ``what`` names the tool in the message."""
    if not _enforcing:
        return
    if _current is None:
        pytest.fail(
            f"{what} was asked for outside a test (at import or collection): ask for it in a "
            f"fixture or test marked `{needs}`",
            pytrace=False,
        )
    if not any(_current.get_closest_marker(name) for name in ACCEPTED[needs]):
        pytest.fail(
            f"{_current.nodeid} uses {what} but is not marked `{needs}`: add "
            f"`pytestmark = pytest.mark.{needs}` to its module (`make unit` runs the unmarked "
            f"tests, on machines where nothing is built)",
            pytrace=False,
        )

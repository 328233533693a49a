"""Class checks: a DeviceClass whose selectors cannot compile, or that no published device
satisfies, gets one Warning Event (again only when the reason changes).

Owns: which classes to check (edited ones; after a change of pools, those that admitted nothing
and those it warned about), the check itself (pure: ``class_problem``), and the last warning per
class. Other drivers' classes (their selectors name only other drivers) are not ours to judge.
The leader's job: ``sweep`` when it takes over, ``note`` every batch of changes, ``run_once``.

Must not: read the API (the view and the tallies say what is published and admitted).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dra_gpu import cel
from dra_gpu.controller import published
from dra_gpu.controller.posting import Reporter
from dra_gpu.controller.selectors import class_drivers
from dra_gpu.controller.tallies import Tally
from dra_gpu.controller.view import Changes, ClusterView

log = logging.getLogger(__name__)


class ClassChecks:
    def __init__(self, view: ClusterView, tally: Tally, reporter: Reporter, driver: str) -> None:
        self.view = view
        self.tally = tally
        self.reporter = reporter
        self.driver = driver
        self._to_check: set[str] = set()
        self.warnings: dict[str, str] = {}
        """Class -> the message last posted on it."""

    def sweep(self) -> None:
        """Check every class on the next run (this replica now leads)."""
        self._to_check = set(self.view.classes)

    def note(self, changes: Changes) -> None:
        self._to_check |= changes.classes
        if changes.pools:  # what no device satisfies may now be satisfied, and vice versa
            self._to_check |= {
                name for name, counts in self.tally.admitted.items() if not counts[2]
            }
            self._to_check |= set(self.warnings)

    async def run_once(self) -> None:
        found: tuple[int, published.PublishedDevice | None] | None = None
        for name in sorted(self._to_check):
            self._to_check.discard(name)
            device_class = self.view.classes.get(name)
            if device_class is None:
                self.warnings.pop(name, None)
                continue
            drivers = class_drivers(device_class)
            if drivers and self.driver not in drivers:
                continue  # another driver's class: not ours to judge
            if found is None:
                found = published_devices(self.view)
            admitted = self.tally.admitted.get(name, [0, 0, 0])[2]
            problem = class_problem(device_class, admitted, *found)
            if problem is None:
                self.warnings.pop(name, None)
                continue
            reason, message = problem
            if self.warnings.get(name) == message:
                continue
            self.warnings[name] = message
            log.warning("DeviceClass %s: %s", name, message)
            await self.reporter.warn(device_class, "DeviceClass", reason, message)


def _selectors(device_class: Mapping[str, Any]) -> list[str]:
    return [
        s["cel"]["expression"]
        for s in device_class.get("spec", {}).get("selectors") or []
        if "cel" in s
    ]


def published_devices(view: ClusterView) -> tuple[int, published.PublishedDevice | None]:
    """How many devices (any driver) complete pools hold, and the first of them, in the
    order of ``published.current_pools``."""
    count, first = 0, None
    for key in sorted(view.pools):
        pool = view.pools[key]
        if pool.complete and pool.devices:
            count += len(pool.devices)
            first = first or pool.devices[0]
    return count, first


def class_problem(
    device_class: Mapping[str, Any],
    admitted: int,
    total: int,
    first: published.PublishedDevice | None,
) -> tuple[str, str] | None:
    """The reason and message of a Warning on the class, or None. ``admitted``: devices of
    complete pools (any driver) the class admits; ``total``: all of them, ``first`` the
    first."""
    name = device_class["metadata"]["name"]
    for index, expression in enumerate(_selectors(device_class)):
        compiled = cel.compile_selector(expression)
        if compiled.error:  # the API server checks syntax; this catches what it cannot
            return "InvalidSelector", (
                f"DeviceClass {name}: spec.selectors[{index}].cel.expression "
                f"{' '.join(expression.split())!r} does not compile: {compiled.error}"
            )
    if not total or admitted or first is None:
        return None
    why = ""
    for index, expression in enumerate(_selectors(device_class)):
        verdict = cel.evaluate(cel.compile_selector(expression), first.driver, first.body)
        if verdict.error:
            why = f"; e.g. {first.node}/{first.body['name']}: selector #{index}: "
            why += verdict.error
            break
    return "NoDeviceMatches", (
        f"DeviceClass {name}: none of the {total} published devices satisfies its "
        f"selectors; claims of this class cannot be allocated{why}"
    )

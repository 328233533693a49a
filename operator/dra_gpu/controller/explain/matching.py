"""One exactly-request (or subrequest) against every published device: the request check.

Owns: ``RequestCheck``: per device the class does not rule out, its verdict (error, mismatch,
too small a share, allocated, counters used up, shared and full, tainted, on an excluded node,
fits), counted per verdict and per node; the nodes on which the request fits; and the
request's explanation from those counts, naming only the first few devices of each group
(``wording.LIST_LIMIT``), whose words alone are written (``Checked``).

Partitions and shares (``partitions``): a device whose counters the allocated partitions used
up, or a shared device without room for the request's share, is not free; the message says
which counters of which set are short and who holds them, or how much of the shared capacity
is left ("node-01/gpu-0 needs memory-slice 8 of gpu-0-counters, 4 free (held by ns/a)",
"node-01/gpu-1 shared: 30Gi of 80Gi memory free, the request asks 40Gi"). Such a request is
explained as ``DevicesAllocated``: other claims hold what the device needs.
Must not: evaluate CEL itself (the Layout's outcomes are read), allocate, or look at other
requests (constraints such as ``matchAttribute`` are not modelled).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dra_gpu import cel
from dra_gpu.controller import partitions, published, selections
from dra_gpu.controller.explain import mismatches, taints, wording
from dra_gpu.controller.explain.mismatches import Selector
from dra_gpu.controller.explain.results import (
    DeviceVerdict,
    Piece,
    Reason,
    RequestExplanation,
    Verdict,
)
from dra_gpu.controller.explain.world import IncompletePool, Scope
from dra_gpu.resource import names

Body = Mapping[str, Any]
_UNKNOWN: Any = object()


class Checked:
    """One device as one request sees it; its text is written only when read."""

    __slots__ = ("_text", "_why", "device", "passed", "verdict")

    def __init__(
        self,
        device: published.PublishedDevice,
        verdict: Verdict,
        passed: bool,
        text: str | None = None,
        why: tuple[Selector, cel.Evaluation] | None = None,
    ) -> None:
        self.device = device
        self.verdict = verdict
        self.passed = passed
        """Whether every selector accepted the device (whatever its allocation or node)."""
        self._text = text
        self._why = why

    @property
    def text(self) -> str:
        if self._text is None:
            assert self._why is not None
            selector, evaluation = self._why
            self._text = mismatches.rejection_text(selector, evaluation, self.device)
        return self._text

    def public(self) -> DeviceVerdict:
        d = self.device
        return DeviceVerdict(d.driver, d.pool, d.name, d.node, self.verdict, self.text)


_FITS, _PASSING, _FREE = range(3)
"""Which passing devices ``_fitting_nodes`` counts: those that fit, all, those not allocated."""

# What the hot loop finds for each candidate device: small ints, cheap to compare and count.
(
    _C_ERROR,
    _C_MISMATCH,
    _C_EXCLUDED_ERROR,
    _C_TOO_SMALL,
    _C_ALLOCATED,
    _C_COUNTERS,
    _C_CAPACITY,
    _C_TAINTED,
    _C_EXCLUDED,
    _C_FITS,
) = range(10)
_C_PASSED = _C_ALLOCATED  # this code and those above: every selector accepted the device
_VERDICT_OF = (
    Verdict.ERROR,
    Verdict.MISMATCH,
    Verdict.EXCLUDED,  # a selector failed with an error, on a node the pod cannot use
    Verdict.MISMATCH,  # the request's capacity never fits it (``partitions.ShareMiss``)
    Verdict.ALLOCATED,
    Verdict.COUNTERS,
    Verdict.CAPACITY,
    Verdict.TAINTED,
    Verdict.EXCLUDED,
    Verdict.FITS,
)


class _Group:
    """A group of devices as messages read it: how many, and the first ``wording.LIST_LIMIT``."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first: list[int] = []  # positions among the candidates


class RequestCheck:
    """One exactly-request (or subrequest) against every published device.

    Only the devices the class does not rule out with a plain "no" (``Layout.candidates``) are
    looked at one by one, and only to count them: per verdict, per node, and the first few of
    each group, which alone get their words written (``Checked``). The others are all
    ``OTHER_CLASS``, listed only when the class has no candidate at all. ``detail`` writes out
    every device.
    """

    def __init__(
        self,
        name: str,
        class_name: str,
        spec: Body,
        scope: Scope,
        class_selectors: tuple[Selector, ...],
        request_selectors: tuple[Selector, ...],
    ) -> None:
        self.name = name
        self.class_name = class_name
        self.scope = scope
        self.class_selectors = class_selectors
        self.request_selectors = request_selectors
        self.all_mode = spec.get("allocationMode") == "All"
        count = spec.get("count")
        self.count = count if isinstance(count, int) and count > 0 and not self.all_mode else 1
        layout = scope.world.layout
        self._layout = layout
        self._class_compiled = tuple(s.compiled for s in class_selectors)
        self._class_outcomes = layout.outcomes(self._class_compiled)
        self._request_outcomes = (
            layout.outcomes([s.compiled for s in request_selectors]) if request_selectors else None
        )
        self._indexes = layout.candidates(self._class_compiled)
        self._groups = {v: _Group() for v in Verdict}
        self._excluded = _Group()  # passing devices on nodes the pod cannot use
        self._free = _Group()  # passing devices not allocated
        self._local: dict[str, list[int]] = {}  # node -> passing, fitting, allocated
        self._anywhere = [0, 0, 0]  # the same for devices of allNodes/nodeSelector slices
        self._fit_drivers: set[str] = set()
        self._tolerations = tuple(
            t for t in spec.get("tolerations") or () if isinstance(t, Mapping)
        )
        self._capacity = partitions.capacity_requests(spec)
        self._codes = self._check_candidates()
        self.passing = sum(self._local_totals()) + self._anywhere[0]
        self.notes = tuple(p.note for p in scope.world.incomplete if self._may_hold_class(p))

    def _local_totals(self) -> Iterator[int]:
        return (row[0] for row in self._local.values())

    # Per device.

    def _check_candidates(self) -> list[int]:
        """Each device the class does not rule out, in order: the hot loop of a check (tens of
        thousands of devices), hence the local names and no objects per device."""
        devices, class_outcomes = self._layout.devices, self._class_outcomes
        request_outcomes = self._request_outcomes
        exclusion = self.scope.exclusions.get
        held = self.scope.held
        tolerations, untolerated = self._tolerations, taints.untolerated
        local, anywhere = self._local, self._anywhere
        special, capacity, usage = self._layout.special, self._capacity, self.scope.usage
        limit = wording.LIST_LIMIT
        # Per code: the group it counts in (EXCLUDED has two codes), its count, its first few.
        group_of = [self._groups[v] for v in _VERDICT_OF]
        counts = dict.fromkeys(map(id, group_of), 0)
        excluded_positions: list[int] = []
        free_positions: list[int] = []
        excluded_count = free_count = 0
        codes: list[int] = []
        last_node: Any = _UNKNOWN  # no device's node
        excluded: str | None = None
        row = anywhere
        for position, i in enumerate(self._indexes):
            device = devices[i]
            node = device.node
            if node != last_node:
                last_node = node
                excluded = exclusion(node) if node else None
                row = (local.get(node) or local.setdefault(node, [0, 0, 0])) if node else anywhere
            failed = class_outcomes[i]
            if failed is None and request_outcomes is not None:
                failed = request_outcomes[i]
            miss = None
            if failed is None and (capacity is not None or i in special):
                miss = self._share_miss(device)
            if failed is not None:
                if failed[1].error is None:
                    code = _C_MISMATCH
                else:
                    # The scheduler filters the node out first and never evaluates its devices.
                    code = _C_ERROR if excluded is None else _C_EXCLUDED_ERROR
            elif miss is not None and miss.intrinsic:
                code = _C_TOO_SMALL
            else:
                row[0] += 1
                if held(device.key):
                    code = _C_ALLOCATED
                    row[2] += 1
                elif i in special and not usage.counters_fit(device):
                    code = _C_COUNTERS
                    row[2] += 1
                elif miss is not None:
                    code = _C_CAPACITY
                    row[2] += 1
                elif device.taints and untolerated(device.taints, tolerations):
                    code = _C_TAINTED
                    row[2] += 1  # not free, as if allocated: the scheduler skips it
                else:
                    if excluded is not None:
                        code = _C_EXCLUDED
                        if excluded_count < limit:
                            excluded_positions.append(position)
                        excluded_count += 1
                    else:
                        code = _C_FITS
                        row[1] += 1
                        self._fit_drivers.add(device.driver)
                    if free_count < limit:
                        free_positions.append(position)
                    free_count += 1
            codes.append(code)
            group = group_of[code]
            if len(group.first) < limit:
                group.first.append(position)
            counts[id(group)] += 1
        for group in group_of:
            group.count = counts[id(group)]
        self._excluded.first, self._excluded.count = excluded_positions, excluded_count
        self._free.first, self._free.count = free_positions, free_count
        return codes

    def _share_miss(self, device: published.PublishedDevice) -> partitions.ShareMiss | None:
        """Why the request's capacity does not fit ``device`` (None: it does, or the device is
        not shared and the request asks no capacity)."""
        if not device.shared and self._capacity is None:
            return None
        used = self.scope.usage.consumed(device.key) if device.shared else {}
        return partitions.check_share(device, self._capacity, used)

    def _checked(self, position: int) -> Checked:
        """The candidate at ``position``, in words."""
        index = self._indexes[position]
        device = self._layout.devices[index]
        code = self._codes[position]
        verdict = _VERDICT_OF[code]
        usage = self.scope.usage
        if code in (_C_TOO_SMALL, _C_CAPACITY):
            miss = self._share_miss(device)
            assert miss is not None
            owners = self.scope.holders(device.key) if code == _C_CAPACITY else ()
            text = partitions.share_text(device.label, miss, owners)
            return Checked(device, verdict, code == _C_CAPACITY, text)
        if code == _C_COUNTERS:
            counters = usage.counters(device)
            short = [c for c in counters if c.free < c.needs]
            owners = usage.counter_holders(device, short)
            text = partitions.counters_text(device.label, counters, owners)
            return Checked(device, verdict, True, text)
        if code in (_C_ERROR, _C_MISMATCH):
            failed = self._class_outcomes[index]
            selectors = self.class_selectors
            if failed is None:
                failed, selectors = self._request_outcomes[index], self.request_selectors  # type: ignore[index]
            assert failed is not None
            return Checked(device, verdict, False, why=(selectors[failed[0]], failed[1]))
        passed = code >= _C_PASSED
        if code == _C_ALLOCATED:
            text = f"{device.label} is allocated to {', '.join(self.scope.holders(device.key))}"
        elif code == _C_TAINTED:
            untolerated = taints.untolerated(device.taints, self._tolerations)
            shown = ", ".join(map(taints.device_taint_text, untolerated))
            text = f"{device.label} is tainted {shown}"
        elif code == _C_FITS:
            text = f"{device.label} fits"
        else:
            text = f"{device.label}: {self.scope.exclusions.get(device.node or '')}"
        return Checked(device, verdict, passed, text)

    def _head(self, group: _Group) -> _Head:
        return _Head([self._checked(p) for p in group.first], group.count)

    def group(self, verdict: Verdict) -> _Head:
        return self._head(self._groups[verdict])

    def _other(self, index: int) -> Checked:
        """A device the class rules out."""
        outcome = self._class_outcomes[index]
        assert outcome is not None
        selector = self.class_selectors[outcome[0]]
        device = self.scope.world.devices[index]
        return Checked(device, Verdict.OTHER_CLASS, False, why=(selector, outcome[1]))

    @functools.cached_property
    def checked(self) -> list[Checked]:
        """Every device in natural order (for ``detail``)."""
        positions = {index: position for position, index in enumerate(self._indexes)}
        return [
            self._checked(positions[index]) if index in positions else self._other(index)
            for index in range(len(self._class_outcomes))
        ]

    def _may_hold_class(self, pool: IncompletePool) -> bool:
        # An incomplete pool of another driver is no business of this request; an empty one
        # may be half written, so it is mentioned.
        if not pool.devices:
            return True
        outcomes = self.scope.world.layout.selections.outcomes(self._class_compiled, pool.source)
        return any(selections.admits(o) for o in outcomes)

    # The request as a whole.

    def explain(self) -> RequestExplanation:
        if not self._indexes:
            return self._nothing_published()
        if self._groups[Verdict.ERROR].count:
            listing = _listing([(self.group(Verdict.ERROR), "more fail")])
            return self._failure(Reason.SELECTOR_ERROR, f"selector error: {listing}")
        if not self.passing:
            return self._failure(Reason.NO_DEVICE_FITS, f"no device fits: {self._all_items()}")
        nodes = self._fitting_nodes(_FITS, respect_exclusion=True)
        if nodes:
            return self._fits(nodes)
        if not self._fitting_nodes(_PASSING, respect_exclusion=False):
            reason = Reason.NOT_ENOUGH_DEVICES
        elif not self._fitting_nodes(_FREE, respect_exclusion=False):
            allocated = sum(
                self._groups[v].count
                for v in (Verdict.ALLOCATED, Verdict.COUNTERS, Verdict.CAPACITY)
            )
            tainted = self._groups[Verdict.TAINTED].count
            reason = Reason.DEVICES_TAINTED if tainted > allocated else Reason.DEVICES_ALLOCATED
        else:
            reason = Reason.NODE_EXCLUDED
        return self._failure(reason, f"{self._headline()}: {self._all_items()}")

    def _fitting_nodes(self, usable: int, *, respect_exclusion: bool) -> list[str]:
        """Nodes where enough passing devices are ``usable`` (``_FITS``, ``_PASSING`` or
        ``_FREE``; for All: every one of them)."""
        local, anywhere = self._local, self._anywhere
        exclusions = self.scope.exclusions
        candidates = {n for n, row in local.items() if row[0]}
        if anywhere[0]:
            candidates |= set(exclusions)
        if respect_exclusion:
            candidates = {n for n in candidates if exclusions.get(n) is None}
        fitting = []
        none = (0, 0, 0)
        for node in sorted(candidates, key=names.natural):
            row = local.get(node, none)
            total = row[0] + anywhere[0]
            if usable == _FITS:
                good = row[1] + anywhere[1]
            elif usable == _PASSING:
                good = total
            else:
                good = total - row[2] - anywhere[2]
            ok = (total > 0 and good == total) if self.all_mode else good >= self.count
            if ok:
                fitting.append(node)
        return fitting

    def _headline(self) -> str:
        if self.all_mode:
            return "needs every matching device of one node, free"
        if self.count == 1:
            return "no device fits"
        most = max([row[1] for row in self._local.values()] + [self._anywhere[1]])
        return f"needs {self.count} devices on one node, at most {most} available"

    def _all_items(self) -> str:
        groups = [
            (self.group(Verdict.MISMATCH), "more do not match"),
            (self.group(Verdict.ALLOCATED), "more are allocated"),
            (self.group(Verdict.COUNTERS), "more have their counters used up"),
            (self.group(Verdict.CAPACITY), "more are shared and full"),
            (self.group(Verdict.TAINTED), "more are tainted"),
            (self.group(Verdict.EXCLUDED), "more are on excluded nodes"),
            (self.group(Verdict.FITS), "more fit"),
        ]
        return "; ".join(filter(None, [_listing(groups), *self.notes]))

    def _nothing_published(self) -> RequestExplanation:
        devices = self.scope.world.devices
        if not devices and not self.notes:
            return self._failure(Reason.NO_DEVICES_PUBLISHED, "no devices published")
        headline = (
            f"no device of class {self.class_name} published" if devices else "no devices published"
        )
        # No candidate: every device is of another class.
        others = _Head(
            [self._other(i) for i in range(min(wording.LIST_LIMIT, len(devices)))], len(devices)
        )
        listing = _listing([(others, "more are of other classes")])
        details = "; ".join(filter(None, [*self.notes, listing]))
        reason = Reason.POOL_INCOMPLETE if self.notes else Reason.NO_DEVICES_PUBLISHED
        return self._failure(reason, f"{headline}: {details}")

    def _failure(self, reason: Reason, text: str) -> RequestExplanation:
        message = wording.bounded(f"request {self.name}: {text}")
        devices_piece = Piece("devices", False, message)
        node_piece = (
            self._node_piece() if self.passing else Piece("node", None, wording.NOT_CHECKED)
        )
        if reason == Reason.NODE_EXCLUDED:
            # Enough free devices pass, on nodes the pod cannot use: the devices are there.
            # Tainted ones first: on a node the pod may use, they are why it cannot go there
            # (a DeviceTaintRule of a node whose agent is gone, say).
            devices_piece = Piece("devices", True, self._free_text())
            node_piece = Piece("node", False, self._exclusions_text(tainted=True))
        return self._result(reason, message, devices_piece, node_piece, driver_ok=None)

    def _fits(self, nodes: list[str]) -> RequestExplanation:
        bound = self.scope.bound_node
        node_reason = (
            f"the pod is bound to {bound}"
            if bound
            else f"{wording.node_list(nodes)} can run the pod"
        )
        drivers = sorted(self._fit_drivers)
        driver_reason = f"{', '.join(drivers)} published devices for {wording.node_list(nodes)}"
        return self._result(
            Reason.FITS,
            f"request {self.name}: fits on {wording.node_list(nodes)}",
            Piece("devices", True, self._free_text()),
            Piece("node", True, node_reason),
            driver_ok=driver_reason,
            nodes=tuple(nodes),
        )

    def _free_text(self) -> str:
        free = self._free
        shown = ", ".join(self._checked(p).device.label for p in free.first)
        more = (
            f" and {free.count - wording.LIST_LIMIT} more"
            if free.count > wording.LIST_LIMIT
            else ""
        )
        return f"{shown}{more} {'fits' if free.count == 1 else 'fit'}"

    def _node_piece(self) -> Piece:
        """Whether a node the pod may use holds a device that passes the selectors."""
        nodes = {n for n, row in self._local.items() if row[0]}
        exclusions = self.scope.exclusions
        if self._anywhere[0]:
            nodes |= set(exclusions)
        eligible = sorted((n for n in nodes if exclusions.get(n) is None), key=names.natural)
        if eligible:
            return Piece("node", True, f"{wording.node_list(eligible)} can run the pod")
        return Piece("node", False, self._exclusions_text())

    def _exclusions_text(self, *, tainted: bool = False) -> str:
        groups = [(self.group(Verdict.TAINTED), "more are tainted")] if tainted else []
        groups.append((self._head(self._excluded), "more are on excluded nodes"))
        listing = _listing(groups)
        return wording.bounded(f"request {self.name}: {listing or 'no node can run the pod'}")

    def _result(
        self,
        reason: Reason,
        message: str,
        devices_piece: Piece,
        node_piece: Piece,
        *,
        driver_ok: str | None,
        nodes: tuple[str, ...] = (),
    ) -> RequestExplanation:
        driver_piece = (
            Piece("driver", True, driver_ok)
            if driver_ok
            else Piece("driver", None, wording.NOT_CHECKED)
        )
        return RequestExplanation(
            request=self.name,
            device_class=self.class_name,
            reason=reason,
            message=message,
            pieces=(
                Piece("class", True, f"device class {self.class_name} exists"),
                devices_piece,
                node_piece,
                driver_piece,
            ),
            devices=tuple(c.public() for c in self.checked) if self.scope.detail else (),
            notes=self.notes,
            nodes=nodes,
        )


class _Head(Sequence[Checked]):
    """The first few of a group whose other members were never built, and its size."""

    def __init__(self, first: list[Checked], size: int) -> None:
        self._first = first
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: Any) -> Any:
        if (
            isinstance(index, slice)
            and (index.start or 0) == 0
            and index.step is None
            and index.stop is not None
            and min(index.stop, self._size) <= len(self._first)
        ):
            return self._first[: index.stop]
        raise IndexError("only the first items of a _Head are known")


def _listing(groups: Sequence[tuple[Sequence[Checked], str]]) -> str:
    """Each group's first ``wording.LIST_LIMIT`` texts, then "and N <phrase>"; groups in order."""
    parts: list[str] = []
    for checked, phrase in groups:
        parts.extend(c.text for c in checked[: wording.LIST_LIMIT])
        if len(checked) > wording.LIST_LIMIT:
            parts.append(f"and {len(checked) - wording.LIST_LIMIT} {phrase}")
    return "; ".join(parts)

"""The cluster as every claim's check reads it: a ``Layout`` of the slices, a ``World`` per pass.

Owns: the ``Layout`` (devices of complete pools at their newest generation, in natural order,
the incomplete pools, and per list of selectors the outcome on every device), the ``Checks``
kept from one World to the next, the ``World`` (a Layout with the holders, the Nodes and the
counters and shares in use) and one claim's ``Scope`` of it (holders other than the claim, the
pod's node exclusions, worked out per node when first asked).

``build_world`` builds one from lists for one claim; the controller keeps a Layout until a
pool changes and builds a World per pass over its view's indexes.
Must not: do any I/O or change its inputs; it reads ``holders``, ``nodes`` and ``usage`` as
they are when a check runs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from dra_gpu import cel
from dra_gpu.controller import claimed, partitions, published, selections
from dra_gpu.controller.explain import node_filters, results
from dra_gpu.controller.published import DeviceKey
from dra_gpu.controller.selections import ListKey, Outcome, Selections
from dra_gpu.resource import bodies, names

Body = Mapping[str, Any]


def build_world(
    slices: Iterable[Body],
    claims: Iterable[Body],
    nodes: Mapping[str, Body],
    *,
    selections: Selections | None = None,
) -> World:
    """The World of ``explain_claim``: all ResourceSlices, all claims, Nodes by name."""
    slices = list(slices)
    layout = Layout(published.read_pools(slices), selections)
    return World(layout, claimed.HolderIndex.of(claims), nodes, slices)


@dataclasses.dataclass(frozen=True)
class IncompletePool:
    """A pool not (yet) complete at its newest generation: its devices are not candidates,
    but a request's message notes it (``note``)."""

    driver: str
    pool: str
    generation: int
    present: int
    expected: int
    source: published.Pool

    @property
    def devices(self) -> tuple[published.PublishedDevice, ...]:
        return self.source.devices

    @property
    def note(self) -> str:
        return self.source.why_incomplete


class Layout:
    """The slices as every check reads them: the devices of complete pools at their newest
    generation, in natural order, and the incomplete pools.

    Built from the pools (once per change of any pool: the controller keeps one until then).
    Per list of selectors, the outcome on every device, in that order, is computed on first
    use from ``Selections`` (per pool, kept across Layouts) and kept here.
    """

    def __init__(
        self, pools: Iterable[published.Pool], selections: Selections | None = None
    ) -> None:
        self.selections = selections if selections is not None else Selections()
        placed: list[tuple[published.PublishedDevice, published.Pool, int]] = []
        incomplete: list[IncompletePool] = []
        pools_placed: dict[tuple[str, str], published.Pool] = {}
        for pool in sorted(pools, key=lambda p: p.key):
            if pool.complete:
                pools_placed[pool.key] = pool
                placed.extend((d, pool, i) for i, d in enumerate(pool.devices))
            else:
                incomplete.append(
                    IncompletePool(
                        pool.driver, pool.pool, pool.generation, pool.present, pool.expected, pool
                    )
                )
        placed.sort(key=lambda entry: entry[0].order)  # stable: pool order, then slice order
        self.devices: tuple[published.PublishedDevice, ...] = tuple(d for d, _, _ in placed)
        """Devices of complete pools at their newest generation, in natural order."""
        where: dict[tuple[str, str], tuple[published.Pool, list[int]]] = {}
        for index, (_, pool, position) in enumerate(placed):
            where.setdefault(pool.key, (pool, [0] * len(pool.devices)))[1][position] = index
        self._where = list(where.values())
        self.incomplete: tuple[IncompletePool, ...] = tuple(
            sorted(incomplete, key=lambda p: (names.natural(p.pool), p.driver))
        )
        self.device_nodes = frozenset(d.node for d in self.devices if d.node)
        self.pools = pools_placed
        """The complete pools, by (driver, pool)."""
        self.special = frozenset(i for i, d in enumerate(self.devices) if d.consumes or d.shared)
        """Indexes of the devices that consume counters or are shared (``partitions``)."""
        self._outcomes: dict[ListKey, list[Outcome]] = {}
        self._candidates: dict[ListKey, tuple[int, ...]] = {}

    def outcomes(self, selectors: Sequence[cel.Compiled]) -> list[Outcome]:
        """Each device's outcome (see ``selections``), aligned with ``devices``."""
        key = selections.list_key(selectors)
        found = self._outcomes.get(key)
        if found is None:
            found = [None] * len(self.devices)
            for pool, indexes in self._where:
                for index, outcome in zip(
                    indexes, self.selections.outcomes(selectors, pool), strict=True
                ):
                    if outcome is not None:
                        found[index] = outcome
            self._outcomes[key] = found
        return found

    def warming(self, selectors: Sequence[cel.Compiled]) -> Iterator[None]:
        """Work out ``selectors``' outcome on every device, pool by pool, yielding after each
        pool: a caller on an event loop takes its breaks in between (a selector nobody used
        before costs a CEL evaluation per distinct device); ``outcomes`` then reads the
        cache."""
        if selections.list_key(selectors) in self._outcomes:
            return
        for pool, _indexes in self._where:
            self.selections.outcomes(selectors, pool)
            yield

    def candidates(self, selectors: Sequence[cel.Compiled]) -> tuple[int, ...]:
        """Indexes of the devices a class's selectors do not rule out with a plain "no"."""
        key = selections.list_key(selectors)
        found = self._candidates.get(key)
        if found is None:
            outcomes = self.outcomes(selectors)
            found = tuple(i for i, o in enumerate(outcomes) if selections.candidate(o))
            self._candidates[key] = found
        return found


class Checks:
    """Request checks kept from one World to the next (the controller's, pass after pass).

    A check is reused while the Layout is the same one and the ``versions`` of the request's
    classes have not moved: the caller bumps a class's version whenever anything its requests
    could read changes (see ``explainer``). Within one World, checks are shared anyway.
    """

    LIMIT = 20_000

    def __init__(self, versions: Callable[[str], Hashable]) -> None:
        self.versions = versions
        self._layout: Layout | None = None
        self._found: dict[tuple[Any, ...], results.RequestExplanation] = {}

    def table(self, layout: Layout) -> dict[tuple[Any, ...], results.RequestExplanation]:
        if layout is not self._layout or len(self._found) > self.LIMIT:
            self._layout, self._found = layout, {}
        return self._found


class World:
    """The cluster as each claim's check reads it: built once (per pass), read by every check.

    ``holders``, ``nodes`` and ``usage`` (counters and shares in use; by default worked out from
    ``holders`` over the layout's pools) are read as they are when a check runs (the controller
    passes its view's live indexes and builds a new World for each pass, with ``checks`` kept
    between).
    """

    def __init__(
        self,
        layout: Layout,
        holders: claimed.HolderIndex,
        nodes: Mapping[str, Body],
        slices: Sequence[Body] | Callable[[], Sequence[Body]],
        *,
        checks: Checks | None = None,
        usage: partitions.Usage | None = None,
    ) -> None:
        self.layout = layout
        self.holders = holders
        self.usage = usage if usage is not None else partitions.Usage(holders, layout.pools)
        self.nodes = nodes
        self._slices = slices
        self._exclusions: dict[str, _Exclusions] = {}
        self.request_checks = checks.table(layout) if checks is not None else {}
        """Checks shared by requests alike (``requests``), kept across Worlds by ``checks``."""
        self.versions = checks.versions if checks is not None else None

    @property
    def devices(self) -> tuple[published.PublishedDevice, ...]:
        return self.layout.devices

    @property
    def incomplete(self) -> tuple[IncompletePool, ...]:
        return self.layout.incomplete

    def slice_list(self) -> Sequence[Body]:
        """All ResourceSlices (allocated claims name their devices' nodes from them)."""
        return self._slices() if callable(self._slices) else self._slices

    def has_node(self, name: str) -> bool:
        return name in self.nodes or name in self.layout.device_nodes

    def node_names(self) -> list[str]:
        return sorted(set(self.nodes) | self.layout.device_nodes)

    def scope(self, claim: Body, pod: Body | None, *, detail: bool) -> Scope:
        """What one claim's check reads: holders other than the claim, the pod's exclusions."""
        name, uid = claimed.owner(claim), bodies.claim_uid(claim)
        signature = _pod_signature(pod)
        exclusions = self._exclusions.get(signature)
        if exclusions is None:
            exclusions = self._exclusions[signature] = _Exclusions(self, pod)
        bound = ((pod or {}).get("spec") or {}).get("nodeName") or None
        if self.holders.involves(name, uid):  # it holds devices itself: its own view
            owners = functools.partial(self.holders.owners_excluding, name=name, uid=uid)
            usage = self.usage.excluding(name, uid)
            return Scope(self, exclusions, bound, owners, usage.taken(), usage, None, detail)
        return Scope(
            self,
            exclusions,
            bound,
            self.holders.owners,
            self.usage.taken(),
            self.usage,
            (signature, detail),
            detail,
        )


def _pod_signature(pod: Body | None) -> str:
    """What of the pod its checks read (``node_filters.node_exclusion``, the bound node)."""
    if pod is None:
        return "-"
    spec = pod.get("spec") or {}
    read = [spec.get(f) for f in ("nodeName", "tolerations", "nodeSelector", "affinity")]
    return json.dumps(read, sort_keys=True, default=str)


_UNKNOWN: Any = object()


class _Exclusions(Mapping[str, str | None]):
    """Node -> why the pod cannot run there (None: it can), for every node we know of;
    worked out for a node when first asked."""

    def __init__(self, world: World, pod: Body | None) -> None:
        self._world = world
        self._pod = pod
        self._known: dict[str, str | None] = {}

    def __getitem__(self, name: str) -> str | None:
        try:
            return self._known[name]
        except KeyError:
            pass
        if not self._world.has_node(name):
            raise KeyError(name)
        found = node_filters.node_exclusion(name, self._world.nodes.get(name), self._pod)
        self._known[name] = found
        return found

    def get(self, name: str, default: Any = None) -> Any:
        found = self._known.get(name, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        try:
            return self[name]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[str]:
        return iter(self._world.node_names())

    def __len__(self) -> int:
        return len(self._world.node_names())


@dataclasses.dataclass(frozen=True)
class Scope:
    """One claim's view of the World."""

    world: World
    exclusions: Mapping[str, str | None]
    bound_node: str | None
    holders: Callable[[DeviceKey], tuple[str, ...]]
    """Device -> ``ns/name`` of the other claims that hold it (admin access does not count)."""
    held: Callable[[DeviceKey], bool]
    """Whether another claim holds the device alone (a shared device's shares do not)."""
    usage: partitions.Usage
    """Counters and shares the other claims use."""
    shared: tuple[str, bool] | None
    """How checks of this scope may be shared with other claims'; None: they may not."""
    detail: bool

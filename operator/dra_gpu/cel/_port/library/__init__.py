"""The functions of the scheduler's CEL environment, by overload, with cel-go's runtime rules.

One module per library, as upstream keeps them. cel-go: ``standard`` (the operators, ``size``,
``matches``, ``type``, ``dyn``), ``conversions``, ``timestamps`` (the getters), ``strings`` and
``formatting`` (ext strings and ``string.format``), ``lists``, ``sets``, ``comprehensions``
(``@mapInsert``), ``optionals``. Kubernetes: ``quantity``, ``semver``, ``ip``, ``cidr``, ``url``,
``regex`` (``find``/``findAll``), ``format`` (named formats), and its lists in ``lists``.

Operators and ``size``/``matches``/``in``/``type``/``dyn`` dispatch on the runtime type of their
first operand, as cel-go's "singleton" bindings do. Every other function has one implementation
per overload id (see ``declarations``); a call runs the overload the checker resolved, guarded
by its declared argument types, or, when several matched, the first in declaration order whose
guard the arguments pass, else "no such overload" (cel-go's ``FunctionDecl.Bindings``, in
``dispatch``).

A function here raises ``CelError`` for every failure cel-go reports as an error value. An
overload with no implementation is refused when an expression is compiled (see ``runtime``).

Owns: ``SINGLETONS`` and ``IMPLEMENTATIONS``, every library's joined, and ``dispatcher``; the
face re-exports what the planner and the environment use of the libraries.
Must not: implement a function (each library module does) or reach the planner above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import checker
from dra_gpu.cel._port.library import (
    cidr,
    comprehensions,
    conversions,
    dispatch,
    format,
    formatting,
    ip,
    lists,
    optionals,
    quantity,
    regex,
    semver,
    sets,
    standard,
    strings,
    timestamps,
    url,
)
from dra_gpu.cel._port.library.formatting import UNSUPPORTED_SCIENTIFIC, format_clauses
from dra_gpu.cel._port.library.runtime_types import (
    EMPTY_MAP,
    DefaultMap,
    no_such_overload,
    type_name,
)
from dra_gpu.cel._port.library.standard import op_in

__all__ = [
    "EMPTY_MAP",
    "IMPLEMENTATIONS",
    "SINGLETONS",
    "UNSUPPORTED_SCIENTIFIC",
    "DefaultMap",
    "dispatcher",
    "format_clauses",
    "no_such_overload",
    "op_in",
    "type_name",
]

SINGLETONS: Final[dict[str, Callable[..., Any]]] = {**standard.SINGLETONS, **lists.SINGLETONS}
"""The functions that dispatch on their first operand's runtime type, by name."""

IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    **conversions.IMPLEMENTATIONS,
    **strings.IMPLEMENTATIONS,
    **formatting.IMPLEMENTATIONS,
    **regex.IMPLEMENTATIONS,
    **lists.IMPLEMENTATIONS,
    **sets.IMPLEMENTATIONS,
    **comprehensions.IMPLEMENTATIONS,
    **optionals.IMPLEMENTATIONS,
    **quantity.IMPLEMENTATIONS,
    **semver.IMPLEMENTATIONS,
    **ip.IMPLEMENTATIONS,
    **cidr.IMPLEMENTATIONS,
    **url.IMPLEMENTATIONS,
    **format.IMPLEMENTATIONS,
    **timestamps.IMPLEMENTATIONS,
}
"""Every other function's implementations, by overload id."""


def dispatcher(function: str, overloads: tuple[str, ...]) -> Callable[..., Any] | None:
    """The callable for a checked call; None when an overload it may need is not implemented."""
    singleton = SINGLETONS.get(function)
    if singleton is not None:
        return singleton
    declared = checker.FUNCTIONS[function]
    if len(overloads) == 1:
        (only,) = [o for o in declared if o.id == overloads[0]]
        fn = IMPLEMENTATIONS.get(only.id)
        if fn is None:
            return None
        guards = tuple(dispatch.guard(t) for t in only.args)
        return dispatch.guarded(fn, guards)
    candidates = []
    for overload in declared:
        fn = IMPLEMENTATIONS.get(overload.id)
        if fn is None:
            if overload.id in overloads:
                return None
            continue
        candidates.append((tuple(dispatch.guard(t) for t in overload.args), fn))
    return dispatch.dispatching(tuple(candidates))

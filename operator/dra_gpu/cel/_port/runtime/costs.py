"""The evaluation cost of a planned CEL program, counted as it runs and bounded.

Comprehension steps cost what their condition and step cost at least in cel-go's model, and
``+``, ``lists.range``, ``replace`` and ``join`` what they build or read; the count lives in the
frame (``frame[1]``) and past ``COST_LIMIT``, Kubernetes' ``CELSelectorExpressionMaxCost``,
evaluation stops with cel-go's error. cel-go counts every node, so this count never exceeds
upstream's.

Owns: ``COST_LIMIT``, ``Fn`` (a planned closure over the frame), ``charge``, ``static_cost``,
``SIZE_COST`` (the calls whose cost depends on their arguments' sizes).
Must not: plan or evaluate anything but the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.syntax import (
    Call,
    Comprehension,
    CreateList,
    CreateMap,
    Expr,
    Ident,
    Select,
)
from dra_gpu.cel._port.values import CelError

__all__ = ["COST_LIMIT", "SIZE_COST", "Fn", "charge", "cost_exceeded", "static_cost"]

COST_LIMIT: Final = 1_000_000
"""resource.k8s.io ``CELSelectorExpressionMaxCost``: the runtime cost limit DRA sets."""

Fn = Callable[[list[Any]], Any]
"""A planned expression: the frame (device, cost so far, then the variables' slots) to a value."""


def cost_exceeded() -> CelError:
    return CelError("operation cancelled: actual cost limit exceeded")


def charge(frame: list[Any], amount: int) -> None:
    frame[1] += amount
    if frame[1] > COST_LIMIT:
        raise cost_exceeded()


_FREE_CALLS: Final = frozenset({"_&&_", "_||_", "_?_:_"})


def static_cost(expr: Expr) -> int:
    """What one evaluation of ``expr`` costs at least in cel-go's model, never more than its
    estimate: 1 per identifier, selection and call (``&&``, ``||`` and ``?:`` are free), 1 per
    list or map literal (cel-go: 10). An accepted selector's estimate is at most the limit, so
    this count of a run of it stays under the limit too."""
    cost = 0
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Ident | Select | CreateList | CreateMap):
            cost += 1
        if isinstance(e, Select):
            stack.append(e.operand)
        elif isinstance(e, Call):
            cost += e.function not in _FREE_CALLS
            if e.target is not None:
                stack.append(e.target)
            stack.extend(e.args)
        elif isinstance(e, CreateList):
            stack.extend(e.elements)
        elif isinstance(e, CreateMap):
            for k, v, _ in e.entries:
                stack += [k, v]
        elif isinstance(e, Comprehension):
            stack += [e.iter_range, e.accu_init, e.loop_condition, e.loop_step, e.result]
    return max(cost, 1)


def _size_of(value: Any) -> int:
    t = type(value)
    if t is str or t is bytes or t is list or isinstance(value, dict):
        return len(value)
    return 1


def _concat_cost(fn: Callable[..., Any], args: list[Fn]) -> Fn:
    a0, a1 = args

    def concat(f: list[Any]) -> Any:
        left = a0(f)
        right = a1(f)
        if type(left) in (str, bytes, list):
            charge(f, (_size_of(left) + _size_of(right)) // 10)
        return fn(left, right)

    return concat


def _range_cost(fn: Callable[..., Any], args: list[Fn]) -> Fn:
    (a0,) = args

    def lists_range(f: list[Any]) -> Any:
        n = a0(f)
        if type(n) is int and n > 0:
            charge(f, n)
        return fn(n)

    return lists_range


def _repeat_cost(fn: Callable[..., Any], args: list[Fn]) -> Fn:
    # replace/join/format build strings from strings: charge what they read
    def call(f: list[Any]) -> Any:
        values = [a(f) for a in args]
        charge(f, sum(_size_of(v) for v in values) // 10)
        return fn(*values)

    return call


SIZE_COST: Final[dict[str, Callable[[Callable[..., Any], list[Fn]], Fn]]] = {
    "_+_": _concat_cost,
    "lists.range": _range_cost,
    "replace": _repeat_cost,
    "join": _repeat_cost,
}

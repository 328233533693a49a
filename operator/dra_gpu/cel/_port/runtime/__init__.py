"""A checked CEL tree turned into Python closures that evaluate it as cel-go's interpreter does.

Follows cel-go's ``interpreter`` package: ``&&``/``||`` absorb errors in either operand (an error
only when no operand decides); ``?:`` fails on an erroneous condition; a comprehension's
accumulator is computed when first read, an error in a loop step is kept as the accumulator's
value (so a later ``||`` can still absorb it), and the loop stops only on a definite ``false``
condition; selection and indexing follow its attribute qualifiers (``has()`` of a map key,
optional chains ``a.?b.c``, numeric map keys, list indexes given as ``1u`` or ``1.0``);
constant lists in ``in`` use its set-membership lookup; conversions and regular expressions
with constant arguments are computed, or fail, when the program is built.

Evaluation cost is counted (comprehension steps, and the size of what concatenation builds) and
bounded by ``COST_LIMIT``, Kubernetes' ``CELSelectorExpressionMaxCost``, so no selector runs
unbounded; cel-go counts every node, so this count never exceeds upstream's.

The face of ``planner`` (the tree to closures, ``plan``), ``attributes`` (selection, indexing,
equality and membership on runtime values) and ``costs`` (the count and its limit).
"""

from dra_gpu.cel._port.runtime.costs import COST_LIMIT
from dra_gpu.cel._port.runtime.planner import PlanError, Program, plan

__all__ = ["COST_LIMIT", "PlanError", "Program", "plan"]

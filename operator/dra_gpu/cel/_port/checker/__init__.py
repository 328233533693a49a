"""Type-checking a CEL tree exactly as cel-go's checker does, in the scheduler's environment.

What an expression means depends on the checker: which overloads a call may dispatch to, whether
a list or map literal is homogeneous, what may be selected from what, and whether the result
may be a selector's (bool, or dyn for an attribute). Compile errors upstream are compile errors
here. A port of cel-go ``checker/checker.go`` and ``checker/types.go`` (type parameters,
substitutions, assignability, "most general" joins), with the declarations of ``declarations``
and the ``device`` variable of DRA's stored-expressions environment. Pure; no I/O.

The face of ``types`` (``Type`` and the named types), ``assignability`` (checker/types.go),
``declared`` (what the environment declares: functions by overload, ``device``, type names) and
``checking`` (the checker itself and the homogeneous-literal validator).
"""

from dra_gpu.cel._port.checker.checking import CheckError, Unsupported, check
from dra_gpu.cel._port.checker.declared import FUNCTIONS, Overload
from dra_gpu.cel._port.checker.types import Type

__all__ = ["FUNCTIONS", "CheckError", "Overload", "Type", "Unsupported", "check"]

"""A Python port of cel-go and Kubernetes' CEL libraries: the stack kube-scheduler evaluates
device selectors with, piece by piece, private to ``dra_gpu.cel``.

Top to bottom (the import contract "cel/_port/" in pyproject.toml keeps it so): ``runtime``
(the planner: a checked tree to closures), ``library`` (every function, one module per library),
``checker`` (cel-go's type checker, over ``declarations``, the environment's overloads),
``syntax`` (the parser and its macros); beneath them the ports of Go and of Kubernetes' value
types (``golang``, ``regex`` with ``regex_classes``, ``formats``, ``urls``, ``network``), and
``values``, the runtime values and ``CelError``.

Owns: nothing itself; ``dra_gpu.cel.environment`` is the one caller from outside.
Must not: reach ``dra_gpu.cel`` above it, or any I/O.
"""

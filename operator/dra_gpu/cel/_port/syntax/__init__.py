"""CEL source text to an abstract syntax tree, as github.com/google/cel-go's parser builds it.

The grammar, the token rules (numbers, the string and bytes literal forms and their escapes,
reserved words), the limits (250 levels of recursion, 100,000 code points) and the macros of the
Kubernetes environment are cel-go's: ``has``, ``all``/``exists``/``exists_one``/``existsOne``
(one and two variables), ``map``/``filter``, ``transformList``/``transformMap``/
``transformMapEntry``, ``cel.bind``, ``optMap``/``optFlatMap`` and ``sortBy``, each expanded into
the same comprehension cel-go produces, so evaluation can follow cel-go's folding rules exactly.
``&&`` and ``||`` chains become one n-ary call (cel-go balances them into a tree; the result and
the error absorption are the same). Raises SyntaxError_ with cel-go's wording; no I/O.

The face of ``tree`` (the nodes), ``lexer`` (tokens and literal values), ``macros`` (their
expansions) and ``parser`` (the grammar, ``parse``); callers read ``syntax.parse``,
``syntax.Call`` ...
"""

from dra_gpu.cel._port.syntax.lexer import SyntaxError_
from dra_gpu.cel._port.syntax.macros import ACCUMULATOR
from dra_gpu.cel._port.syntax.parser import parse
from dra_gpu.cel._port.syntax.tree import (
    Call,
    Comprehension,
    CreateList,
    CreateMap,
    CreateStruct,
    Expr,
    Ident,
    Literal,
    Select,
)

__all__ = [
    "ACCUMULATOR",
    "Call",
    "Comprehension",
    "CreateList",
    "CreateMap",
    "CreateStruct",
    "Expr",
    "Ident",
    "Literal",
    "Select",
    "SyntaxError_",
    "parse",
]

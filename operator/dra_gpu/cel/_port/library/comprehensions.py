"""cel-go's ext two-variable comprehensions: ``cel.@mapInsert``, which ``transformMap`` and
``transformMapEntry`` expand to (the macros themselves are the parser's).

Owns: ``IMPLEMENTATIONS`` of ``@mapInsert``.
Must not: mutate a map it is given (CEL values are never changed once built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port.values import MISSING, CelError, from_key, map_find, to_key

__all__ = ["IMPLEMENTATIONS"]


def map_insert(target: Any, key: Any, value: Any = MISSING) -> dict[Any, Any]:
    if value is MISSING:
        result = dict(target)
        for k, v in key.items():
            result = map_insert(result, from_key(k), v)
        return result
    if map_find(target, key) is not MISSING:
        raise CelError(f"insert failed: key {key} already exists")
    result = dict(target)
    result[to_key(key)] = value
    return result


IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "@mapInsert_map_key_value": map_insert,
    "@mapInsert_map_map": map_insert,
}

"""Strict reading of node configuration that people write: the simulated profile and faults
file, and the agent's ``--shared-gpus`` setting.

This module owns a YAML loader that refuses duplicate keys (PyYAML would keep the last one) and
the checks of plain data's shape that name the field (``nodes.node-01.devices[1].memory``). A
``FieldError`` keeps the field's path apart from the message, so each caller puts in front what
it was reading (``profile p.yaml: ``, ``--shared-gpus / DRA_GPU_SHARED_GPUS: ``). Pure: it
parses text it is given and reads no file.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import yaml

from dra_gpu.devices import model


class FieldError(model.InventoryError):
    """A value that cannot be used, at ``path`` (``""``: the whole document)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def kind(value: object) -> str:
    """What a value is, in words, for "expected ..., got a list"."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "a mapping", type(None): "nothing"}
    return names.get(type(value), type(value).__name__)


def child(path: str, key: object) -> str:
    """The path of a field below ``path``: ``devices[1]`` + ``memory``."""
    return f"{path}.{key}" if path else str(key)


def mapping(value: object, path: str, known: Collection[str] | None) -> dict[Any, Any]:
    """The mapping at ``path`` (nothing: an empty one); ``known`` lists its allowed keys, None
    allows any key."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(path, f"expected a mapping, got {kind(value)}")
    for key in value:
        if known is not None and key not in known:
            raise FieldError(child(path, key), f"unknown field (known: {', '.join(sorted(known))})")
    return value


def load_yaml(text: str) -> object:
    """Plain data (a SafeLoader builds nothing else) from YAML or JSON; a FieldError for the
    whole document says where it broke (``line 3, column 5: ...``)."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise FieldError("", f"{where}{err.problem or err}") from None
    except yaml.YAMLError as err:
        raise FieldError("", f"not valid YAML: {err}") from None


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML would silently resolve to the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: list[object] = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.append(key)
        return super().construct_mapping(node, deep=deep)

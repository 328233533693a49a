"""How the commands print, by kubectl's habits (pure: strings in, a string out).

Owns: ``table`` (``kubectl get``'s columns: upper-case headers, each column as wide as its
widest cell plus three spaces, ``<none>`` for an empty cell) and ``dump`` (``-o json``: four
spaces of indent, as kubectl; ``-o yaml``: block style, keys in the document's order).
Must not: know what is printed (``command``, ``status``) or do any I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

NONE = "<none>"
FORMATS = ("wide", "json", "yaml")
"""``-o``'s choices; without ``-o``, the table (or the text) for people."""


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The rows under their headers, one line each, every line ending in a newline."""
    cells = [[h.upper() for h in headers]] + [[c or NONE for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "".join(
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in cells
    )


def dump(document: Mapping[str, Any], output: str) -> str:
    """``document`` as ``-o json`` or ``-o yaml`` prints it."""
    if output == "json":
        return json.dumps(document, indent=4, ensure_ascii=False) + "\n"
    if output == "yaml":
        return str(yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True))
    raise ValueError(f"output {output!r}: expected json or yaml")

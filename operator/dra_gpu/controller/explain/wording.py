"""How the explanations' messages are cut to size: the limits, and the small formatters.

Owns: how many devices, requests and nodes a message names before it counts the rest, the
API's cap on an Event message, and how a CEL expression or error is shortened to fit one line.
Must not: decide anything about a claim; it only shapes text it is given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

LIST_LIMIT = 3
"""Devices named per kind of problem in a message; the rest are counted ("and 7 more ...")."""
REQUEST_LIMIT = 3
"""Failing requests named in a claim's message; the rest are counted."""
MESSAGE_LIMIT = 1000
"""Event messages are capped at 1024 bytes by the API; longer ones are cut, ending in "…"."""
NOT_CHECKED = "not checked (an earlier piece is missing)"


def join_messages(messages: Sequence[str]) -> str:
    """Requests' messages, the first ``REQUEST_LIMIT`` of them, then "and N more requests"."""
    shown = list(messages[:REQUEST_LIMIT])
    if len(messages) > REQUEST_LIMIT:
        shown.append(f"and {len(messages) - REQUEST_LIMIT} more requests")
    return bounded(" | ".join(shown))


def node_list(nodes: Sequence[str]) -> str:
    """``node-01, node-02, node-03 and 4 more``."""
    shown = ", ".join(nodes[:LIST_LIMIT])
    return f"{shown} and {len(nodes) - LIST_LIMIT} more" if len(nodes) > LIST_LIMIT else shown


def short(expression: str, limit: int = 80) -> str:
    """A CEL expression on one line, whitespace collapsed, cut at ``limit``."""
    collapsed = " ".join(expression.split())
    return collapsed if len(collapsed) <= limit else collapsed[: limit - 1] + "…"


def one_line(error: str, limit: int = 200) -> str:
    """A CEL error fit for a one-line message: the parser's caret drawing ("| ...") and its
    copy of the expression (quoted separately) dropped, whitespace collapsed, cut."""
    kept = " ".join(line for line in error.splitlines() if not line.lstrip().startswith("|"))
    text = _PARSE_PREFIX.sub("", " ".join(kept.split()), count=1)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PARSE_PREFIX = re.compile(r"^Failed to parse expression '.*?': ")


def bounded(text: str) -> str:
    """``text``, cut to ``MESSAGE_LIMIT`` characters."""
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"

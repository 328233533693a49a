"""A fake of the API server's Events, for the controller's Reporter in unit tests: what it creates
is kept, and listed back as the API server lists Events (core/v1 shape), by the field selectors
the Reporter sends."""

from __future__ import annotations

import copy
from typing import Any

Body = dict[str, Any]


class FakeEvents:
    """Keeps Events as the API server would (events.k8s.io create) and lists them back in the
    core/v1 shape, by the field selectors the controller uses (``involvedObject.uid``,
    ``involvedObject.kind``, ``reportingComponent``), in one page."""

    def __init__(self) -> None:
        self.events: list[Body] = []
        self.lists: list[str] = []
        """The field selector of each list."""

    async def create(self, path: str, body: Body) -> Body:
        self.events.append(copy.deepcopy(body))
        return body

    async def get(self, path: str, **query: Any) -> Body:
        selector = str(query.get("fieldSelector", ""))
        self.lists.append(selector)
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        listed = [
            {
                "metadata": e["metadata"],
                "involvedObject": e["regarding"],
                "reason": e["reason"],
                "message": e["note"],
                "eventTime": e["eventTime"],
                "reportingComponent": e["reportingController"],
            }
            for e in self.events
        ]
        fields = {
            "involvedObject.uid": lambda e: e["involvedObject"]["uid"],
            "involvedObject.kind": lambda e: e["involvedObject"]["kind"],
            "reportingComponent": lambda e: e["reportingComponent"],
        }
        return {
            "items": [e for e in listed if all(fields[f](e) == v for f, v in wanted.items())],
            "metadata": {},
        }

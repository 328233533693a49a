"""Crash injection for the crash-consistency tests, off unless ``DRA_GPU_FAILPOINTS`` is set.

``DRA_GPU_FAILPOINTS="cdi-spec-written=0.05,checkpoint-written=0.05"`` makes the process
SIGKILL itself at a named point with that probability: the windows between two durable
writes are too short to hit by killing from outside. Points are named where they are reached
(``reach("...")``); an unknown name stops the process at start instead of testing nothing.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from collections.abc import Mapping

log = logging.getLogger(__name__)

ENV = "DRA_GPU_FAILPOINTS"
POINTS = (
    "cdi-spec-written",  # prepare: the claim's CDI spec is on disk
    "checkpoint-written",  # prepare or unprepare: the checkpoint change is on disk
    "cdi-spec-deleted",  # unprepare: the spec is gone, the checkpoint entry not yet
    "before-answer",  # prepare: both are on disk, the kubelet has no answer yet
    "mig-instance-created",  # prepare: a MIG instance exists, nothing records it yet
)


def parse(text: str) -> dict[str, float]:
    """``name=probability,...`` → probabilities; raises ``ValueError`` naming the bad part."""
    chances: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in POINTS:
            raise ValueError(f"{ENV}: unknown point {name!r}; known: {', '.join(POINTS)}")
        try:
            chance = float(value)
        except ValueError:
            raise ValueError(f"{ENV}: {name}: {value!r} is not a probability") from None
        if not 0.0 <= chance <= 1.0:
            raise ValueError(f"{ENV}: {name}: {chance} is not between 0 and 1")
        chances[name] = chance
    return chances


_chances: Mapping[str, float] = {}


def configure(environ: Mapping[str, str] = os.environ) -> None:
    global _chances
    _chances = parse(environ.get(ENV, ""))
    if _chances:
        log.warning("crash injection on: %s", _chances)


def reach(name: str) -> None:
    chance = _chances.get(name)
    if chance and random.random() < chance:
        log.warning("crash injection: killed at %s", name)
        os.kill(os.getpid(), signal.SIGKILL)

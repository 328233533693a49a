"""Exit codes of every dra-gpu command (``dra-gpu ...``, ``kubectl dra-gpu ...`` and
``python -m dra_gpu.testing``).

A failure at the edges — a flag, a file, the API server — ends a command with one line on
stderr that says what is wrong and how to fix it, and one of these codes; the traceback only
with ``--log-level DEBUG``. docs/troubleshooting.md's table is this one.
"""

from __future__ import annotations

import argparse
import enum
from typing import NoReturn

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


class ExitCode(enum.IntEnum):
    OK = 0
    """Done, or stopped by SIGTERM/SIGINT."""
    FAILED = 1
    """The command ran and failed: explain's pod or claim does not exist, the API server
    answered with an error, or a long-running component hit an unrecoverable error (logged)."""
    USAGE = 2
    """A flag (or its ``DRA_GPU_<FLAG>`` twin) or an argument is missing or invalid."""
    CONFIG = 3
    """A file it needs is missing or invalid: the kubeconfig (or, in a pod, the service
    account token), the agent's simulated profile, the test kit's control plane binaries."""
    UNREACHABLE = 4
    """The API server does not answer (refused, timeout, TLS, not ready). The controller and
    the agent wait instead; ``explain`` and the test kit stop."""
    REFUSED = 5
    """The API server rejected our credentials (401) or our permissions (403)."""
    NOT_SATISFIED = 6
    """``explain`` answered, and a claim it explained misses a piece (class, devices, node or
    driver): a script's ``if dra-gpu explain ...`` is true only when nothing is missing."""
    INTERRUPTED = 130
    """``explain`` interrupted (Ctrl-C) before it answered (128 + SIGINT, as shells count)."""


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line, naming where to read more, and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def add_log_level(self) -> None:
        self.add_argument(
            "--log-level",
            default="INFO",
            type=str.upper,
            choices=LOG_LEVELS,
            help="DEBUG (also prints the traceback of a failure), INFO, WARNING or ERROR",
        )
        self.add_argument(
            "--log-format",
            default="text",
            choices=LOG_FORMATS,
            help="text (one line a record, for people) or json (one JSON object a line, for "
            "log pipelines: time, level, logger, message and the record's fields)",
        )

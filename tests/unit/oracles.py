"""Upstream oracles run as subprocesses: a Go program built by a script under ``hack/``.

Each oracle (``cel/celref.py``: kube-scheduler's CEL; ``devices/nvmlref.py``: NVIDIA's go-nvml
mock machines) is built, or found in the cache, by its ``hack/build-<name>.sh``, which prints the
binary's path on its last line, and then answers one JSON line for each line it is sent. The
tests that use one are marked ``binaries`` (``tests.support.lanes``); ``built`` refuses the
oracle to any other.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Self

from tests.support import binaries

BUILD_SECONDS = 1800
"""How long an oracle's first build (a Go module download and compile) may take."""


def built(script: str) -> Path:
    """The binary ``hack/<script>`` builds (or finds in the cache)."""
    return binaries.built(script, timeout=BUILD_SECONDS)


class LineOracle:
    """One running oracle process; ``round_trip`` sends a request and reads its answer."""

    def __init__(self, binary: Path, *args: str) -> None:
        self.name = binary.name
        self._process = subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )

    def round_trip(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

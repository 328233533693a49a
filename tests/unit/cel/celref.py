"""The differential CEL tests' oracle: kube-scheduler's own CEL, as a subprocess.

``hack/build-celref.sh`` builds ``hack/celref`` (upstream's k8s.io/dynamic-resource-allocation/cel
at the pinned Kubernetes version) into the cache and prints its path; ``Oracle`` keeps one
process running and asks it one case at a time (one JSON line each way). ``verdict`` reduces an
answer, and ``ours`` an evaluation by ``dra_gpu.cel``, to what is compared: "true", "false" or
"error" (an error of any kind matches an error of any kind; messages are not compared).

Run alone: ``.venv/bin/python -m tests.unit.cel.celref 'expression' ...`` prints both verdicts for
the tutorial's gpu-0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dra_gpu import cel

ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = ROOT / "hack" / "build-celref.sh"


def build_oracle() -> Path:
    """The oracle binary, built (or found in the cache) by hack/build-celref.sh."""
    result = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, check=False, timeout=1800
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/build-celref.sh failed:\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


class Oracle:
    """One running celref; ``judge`` is a round trip of one line."""

    def __init__(self, binary: Path, *args: str) -> None:
        self._process = subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )

    def judge(self, expression: str, driver: str, device: dict[str, Any] | None) -> dict[str, Any]:
        case: dict[str, Any] = {"expression": expression, "driver": driver}
        if device is not None:
            case["device"] = device
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(json.dumps(case) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("celref exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def verdict(answer: dict[str, Any]) -> str | None:
    """The scheduler's verdict; None when the device could not be decoded (not a device)."""
    if answer.get("compileError"):
        return "error"
    if answer.get("deviceError"):
        return None
    if answer.get("error"):
        return "error"
    return "true" if answer.get("result") else "false"


def ours(expression: str, driver: str, device: dict[str, Any]) -> tuple[str, str | None]:
    """dra_gpu.cel's verdict, and its message when it is an error."""
    evaluation = cel.evaluate(cel.compile_selector(expression), driver, device)
    if evaluation.error is not None:
        return "error", evaluation.error
    return ("true" if evaluation.matched else "false"), None


def main(argv: list[str]) -> None:
    device = {
        "name": "gpu-0",
        "attributes": {
            "index": {"int": 0},
            "productName": {"string": "NVIDIA L4"},
            "driverVersion": {"version": "550.54.15"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        },
        "capacity": {"memory": {"value": "24Gi"}},
    }
    with Oracle(build_oracle()) as oracle:
        for expression in argv:
            answer = oracle.judge(expression, "gpu.example.com", device)
            mine, message = ours(expression, "gpu.example.com", device)
            upstream = verdict(answer)
            flag = "  " if mine == upstream else "!!"
            accepted = "accepted" if answer["accepted"] else "rejected by the API server"
            detail = answer.get("compileError") or answer.get("error") or ""
            print(f"{flag} {expression}\n   upstream {upstream} ({accepted}) {detail}")
            print(f"   ours     {mine} {message or ''}")


if __name__ == "__main__":
    main(sys.argv[1:])

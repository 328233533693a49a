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

import sys
from pathlib import Path
from typing import Any

from dra_gpu import cel
from tests.unit import oracles


def build_oracle() -> Path:
    """The oracle binary, built (or found in the cache) by hack/build-celref.sh."""
    return oracles.built("build-celref.sh")


class Oracle(oracles.LineOracle):
    """One running celref; ``judge`` is a round trip of one line."""

    def judge(self, expression: str, driver: str, device: dict[str, Any] | None) -> dict[str, Any]:
        case: dict[str, Any] = {"expression": expression, "driver": driver}
        if device is not None:
            case["device"] = device
        return self.round_trip(case)


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

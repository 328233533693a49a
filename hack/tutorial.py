"""Plays the user's tutorial on the local cluster (``make run``), step by step.

Runs the same kubectl commands the tutorial gives its reader, against ``$KUBECONFIG``, and
prints each with what the cluster answered. It waits for each answer instead of sleeping, and
starts by removing what an earlier run left, so it can be run again and again.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

EXAMPLES = Path(__file__).resolve().parents[1] / "crds-examples"
BOLD, DIM, GREEN, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[0m") if sys.stdout.isatty() else ("",) * 4
)
T = TypeVar("T")


def kubectl(*args: str, show: bool = True, check: bool = True) -> str:
    if show:
        print(f"{BOLD}$ kubectl {' '.join(shlex.quote(a) for a in args)}{RESET}")
    result = subprocess.run(["kubectl", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
    if show:
        print(result.stdout.rstrip() or result.stderr.rstrip())
        print()
    return result.stdout


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json", show=False))


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120) -> T:
    deadline = time.monotonic() + timeout
    print(f"{DIM}... waiting for {what}{RESET}", flush=True)
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.5)
    sys.exit(f"timed out after {timeout:.0f}s waiting for {what}")


def step(title: str) -> None:
    print(f"\n{GREEN}{BOLD}== {title}{RESET}\n")


def pod_event(reason: str, text: str) -> str | None:
    events = kubectl_json("get", "events", "--field-selector", "involvedObject.kind=Pod")
    for event in events["items"]:
        if event.get("reason") == reason and text in event.get("message", ""):
            return f"{event['type']}  {reason}  {event['message']}"
    return None


def reset() -> None:
    step("Clean slate: remove what an earlier run left")
    kubectl(
        "delete",
        "deployment/recomendador",
        "resourceclaimtemplate/gpu-24gb",
        "--ignore-not-found",
        "--wait=true",
    )
    kubectl(
        "delete",
        "deviceclass/gpu-inferencia",
        "resourceslice/nodo-simulado-gpu",
        "--ignore-not-found",
    )
    wait_for(
        "the old pods and claims to go",
        lambda: (
            not kubectl_json("get", "pods,resourceclaims", "-l", "app=recomendador")["items"]
            and not kubectl_json("get", "resourceclaims")["items"]
        ),
    )
    kubectl("delete", "events", "--field-selector", "involvedObject.kind=Pod", show=False)


def main() -> int:
    if not os.environ.get("KUBECONFIG"):
        sys.exit("KUBECONFIG is not set: run `make run` (or `eval $(make cluster-up)`) first")
    reset()

    step("Step 1: the types are already there")
    kubectl("api-resources", "--api-group=resource.k8s.io")
    kubectl("apply", "-f", str(EXAMPLES / "recomendador.yaml"))
    wait_for(
        "the pod and its claim",
        lambda: (
            kubectl_json("get", "pods", "-l", "app=recomendador")["items"]
            and kubectl_json("get", "resourceclaims")["items"]
        ),
    )
    kubectl("get", "pods", "-l", "app=recomendador")
    kubectl("get", "resourceclaim")
    kubectl(
        "get", "resourceclaim", "-o", 'jsonpath={.items[0].metadata.ownerReferences[0].kind}{"\\n"}'
    )

    step("Step 2: the first message - the class is missing")
    print(
        wait_for("the scheduler's answer", lambda: pod_event("FailedScheduling", "does not exist")),
        "\n",
    )
    kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    print(
        wait_for(
            "the scheduler to retry the untouched pod",
            lambda: pod_event("FailedScheduling", "cannot allocate all claims"),
        ),
        "\n",
    )

    step("Step 3: publish a GPU that does not exist")
    kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))
    wait_for(
        "the claim to be allocated and the pod bound",
        lambda: pod_event("Scheduled", "Successfully assigned"),
    )
    kubectl("get", "resourceclaim")
    kubectl("get", "pods", "-l", "app=recomendador", "-o", "wide")
    kubectl(
        "get",
        "resourceclaim",
        "-o",
        'jsonpath={range .items[*]}{.status.allocation.devices.results[0].device}{end}{"\\n"}',
    )

    step("The events in a row, in order")
    kubectl(
        "get", "events", "--field-selector", "involvedObject.kind=Pod", "--sort-by=.lastTimestamp"
    )
    print(
        "Step 4 (the kubelet prepares gpu-0 and the pod starts) needs a DRA driver on node-01:\n"
        "that is the dra-gpu node agent. Explore the cluster with the exports from\n"
        "`make cluster-up`; stop it with `make cluster-down`."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

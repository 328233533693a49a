"""Plays the user's tutorial on the local cluster (``make run``), step by step.

Runs the same kubectl commands the tutorial gives its reader, against ``$KUBECONFIG``, and
prints each with what the cluster answered. Where the tutorial publishes a hand-made
ResourceSlice, this run installs the driver instead: it starts the dra-gpu node agents (the
simulated tutorial profile: gpu-0 24Gi and gpu-1 8Gi on node-01), which publish the devices,
prepare gpu-0 when the pod lands on node-01 and let it start. It waits for each answer instead
of sleeping, and starts by removing what an earlier run left, so it can be run again and again.
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

from dra_gpu.testing import agents_down, agents_up, controller_up

EXAMPLES = Path(__file__).resolve().parents[1] / "crds-examples"
PROFILE = EXAMPLES / "profile-tutorial.yaml"
NODES = ("node-01", "node-02", "node-03")
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


def controller_says(text: str) -> str | None:
    """The controller's explanation on the claim, as `kubectl describe resourceclaim` shows."""
    events = kubectl_json("get", "events", "--field-selector", "involvedObject.kind=ResourceClaim")
    for event in events["items"]:
        if event.get("reportingComponent") == "dra-gpu-controller" and text in event.get(
            "message", ""
        ):
            return f"{event['type']}  {event['reason']}  {event['message']}"
    return None


def explain(pod: str) -> None:
    print(f"{BOLD}$ dra-gpu explain pod/{pod}{RESET}")
    result = subprocess.run(
        [sys.executable, "-m", "dra_gpu", "explain", f"pod/{pod}"], capture_output=True, text=True
    )
    print((result.stdout or result.stderr).rstrip() + "\n")


def pod_name() -> str:
    return str(
        kubectl_json("get", "pods", "-l", "app=recomendador")["items"][0]["metadata"]["name"]
    )


def reset(state_dir: Path) -> None:
    step("Clean slate: remove what an earlier run left")
    # Workloads go first, while the agents run: a pod that used a GPU only goes once the
    # driver unprepared its claim (a real kubelet keeps it Terminating until then).
    agents_up(state_dir, NODES, PROFILE)
    kubectl(
        "delete",
        "deployment/recomendador",
        "resourceclaimtemplate/gpu-24gb",
        "--ignore-not-found",
        "--wait=true",
    )
    wait_for(
        "the old pods and claims to go",
        lambda: (
            not kubectl_json("get", "pods", "-l", "app=recomendador")["items"]
            and not kubectl_json("get", "resourceclaims")["items"]
        ),
    )
    print("stopped the node agents of", ", ".join(agents_down(state_dir)))
    kubectl("delete", "resourceslices", "-l", "app.kubernetes.io/managed-by=dra-gpu")
    kubectl(
        "delete",
        "deviceclass/gpu-inferencia",
        "resourceslice/nodo-simulado-gpu",
        "--ignore-not-found",
    )
    kubectl("delete", "events", "--field-selector", "involvedObject.kind=Pod", show=False)
    kubectl("delete", "events", "--field-selector", "involvedObject.kind=ResourceClaim", show=False)


def main() -> int:
    if not os.environ.get("KUBECONFIG"):
        sys.exit("KUBECONFIG is not set: run `make run` (or `eval $(make cluster-up)`) first")
    state_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".run/cluster")
    reset(state_dir)
    controller = controller_up(state_dir)
    print(f"dra-gpu controller running (pid {controller.pid}, log {controller.log_file})")

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
    print("What the dra-gpu controller says on the claim itself:")
    print(wait_for("the controller's explanation", lambda: controller_says("does not exist")), "\n")
    explain(pod_name())
    kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    print(
        wait_for(
            "the scheduler to retry the untouched pod",
            lambda: pod_event("FailedScheduling", "cannot allocate all claims"),
        ),
        "\n",
    )

    print("And the controller, on the claim:")
    print(wait_for("the controller's explanation", lambda: controller_says("no devices")), "\n")
    explain(pod_name())

    step("Step 3: install the driver instead of describing a GPU by hand")
    print("Starting the dra-gpu node agent on each node, as the chart's DaemonSet does ...")
    agents = agents_up(state_dir, NODES, PROFILE)
    for agent in agents:
        print(f"  {agent.node}: pid {agent.pid}, log {agent.log_file}")
    print()
    wait_for(
        "the scheduler to place the pod", lambda: pod_event("Scheduled", "Successfully assigned")
    )
    kubectl("get", "resourceslices", "-o", "wide")
    kubectl("get", "resourceclaim")
    kubectl(
        "get",
        "resourceclaim",
        "-o",
        'jsonpath={range .items[*]}{.status.allocation.devices.results[0].device}{end}{"\\n"}',
    )

    step("Step 4: the driver prepares gpu-0 and the pod starts")
    wait_for(
        "the pod to run",
        lambda: [
            p
            for p in kubectl_json("get", "pods", "-l", "app=recomendador")["items"]
            if p["status"].get("phase") == "Running"
        ],
    )
    kubectl("get", "pods", "-l", "app=recomendador", "-o", "wide")
    kubectl(
        "get",
        "resourceclaim",
        "-o",
        "jsonpath={range .items[*].status.devices[*]}{.device}: {.conditions[0].type}="
        '{.conditions[0].status} {.data}{"\\n"}{end}',
    )
    claim = kubectl_json("get", "resourceclaims")["items"][0]
    uid = claim["metadata"]["uid"]
    spec = state_dir / "kubelet" / "node-01" / "cdi" / f"k8s.gpu.example.com-gpu_{uid}.json"
    print(f"{BOLD}$ cat {spec}{RESET}\n{spec.read_text()}")

    explain(pod_name())

    step("The events in a row, in order")
    kubectl(
        "get", "events", "--field-selector", "involvedObject.kind=Pod", "--sort-by=.lastTimestamp"
    )
    step("Metrics (Prometheus): the controller's view of node-01, and node-01's agent")
    wanted = (
        "dra_gpu_devices{",
        "dra_gpu_memory_bytes{",
        "dra_gpu_claims{",
        "dra_gpu_explain_events_total{",
        "dra_gpu_prepare_claims_total{",
        "dra_gpu_prepared_devices ",
    )
    agent_metrics = next(a for a in agents if a.node == "node-01").metrics()
    for line in (controller.metrics() + agent_metrics).splitlines():
        if line.startswith(wanted) and ('node="node-0' not in line or "node-01" in line):
            print("  " + line)
    print()
    print(
        "The class, the device, the node and the driver: all four pieces in place.\n"
        "Explore with the exports `make cluster-up` prints; stop everything with\n"
        "`make cluster-down`."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

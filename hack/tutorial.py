"""Plays the user's tutorial on the local cluster (``make run``), step by step, then installs
the driver.

Runs the same kubectl commands the tutorial gives its reader, against ``$KUBECONFIG`` (real
nodes: the upstream kubelet on containerd), and prints each with what the cluster answered:
the four messages, the last one from the real kubelet. Then it installs dra-gpu as a platform
team does, ``helm install`` of charts/dra-gpu (its images were imported into each node, no
registry; simulated tutorial profile: gpu-0 24Gi and gpu-1 8Gi on node-01) in place of the
tutorial's hand-made slice: the agents publish the devices, the kubelet's next retry prepares
gpu-0, and the pod runs with the GPU in its environment. Last, the cluster's Prometheus (``make
cluster-up`` runs one beside it) is pointed at the controller and every agent, through
``kubectl port-forward`` into their pods (pods live in the nodes' networks; the forwards end
with the cluster), and answers the tutorial's questions in PromQL. Act two (``act_two``): a
``helm upgrade`` makes node-02's GPU shared by memory shares and node-03's an A100 in MIG
partitions; pods take shares and partitions, and one share too many is explained. It waits for
each answer instead of sleeping, and starts by removing what an earlier run left, so it can be
run again and again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dra_gpu.testing import ScrapeTarget, prometheus_of

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "crds-examples"
RELEASE, RELEASE_NS = "dra-gpu", "dra-gpu"
ACT_TWO = ("compartido.yaml", "particionado.yaml", "compartido-grande.yaml")
"""The second act's manifests: a GPU shared by memory shares, another in MIG partitions, and a
share that no longer fits (applied last)."""
GONE = ("--ignore-not-found", "--wait=true")
BOLD, DIM, GREEN, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[0m") if sys.stdout.isatty() else ("",) * 4
)
T = TypeVar("T")


def run(tool: str, *args: str, show: bool = True, check: bool = True) -> str:
    if show:
        print(f"{BOLD}$ {tool} {' '.join(shlex.quote(a) for a in args)}{RESET}")
    result = subprocess.run([tool, *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        sys.exit(f"{tool} {' '.join(args)} failed:\n{result.stderr}")
    if show:
        print(result.stdout.rstrip() or result.stderr.rstrip())
        print()
    return result.stdout


def kubectl(*args: str, show: bool = True, check: bool = True) -> str:
    return run("kubectl", *args, show=show, check=check)


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


def pod_event(reason: str, text: str, pod: str | None = None) -> str | None:
    only = f",involvedObject.name={pod}" if pod else ""
    events = kubectl_json("get", "events", "--field-selector", f"involvedObject.kind=Pod{only}")
    for event in events["items"]:
        if event.get("reason") == reason and text in event.get("message", ""):
            return f"{event['type']}  {reason}  {event['message']}"
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


def installed() -> bool:
    listing = run("helm", "list", "-n", RELEASE_NS, "-q", show=False, check=False)
    return RELEASE in listing.split()


def reset() -> None:
    step("Clean slate: remove what an earlier run left")
    # Workloads go first, while the driver runs: a pod that used a GPU only goes once the
    # driver unprepared its claim (the kubelet keeps it Terminating until then).
    kubectl("delete", "-f", str(EXAMPLES / "recomendador.yaml"), *GONE)
    for act_two in ACT_TWO:
        kubectl("delete", "-f", str(EXAMPLES / act_two), *GONE)
    wait_for(
        "the old pods and claims to go",
        lambda: (
            not kubectl_json("get", "pods")["items"]
            and not kubectl_json("get", "resourceclaims")["items"]
        ),
    )
    if installed():
        run("helm", "uninstall", RELEASE, "-n", RELEASE_NS, "--wait")
    kubectl("delete", "resourceslices", "-l", "app.kubernetes.io/managed-by=dra-gpu")
    kubectl(
        "delete",
        "deviceclass/gpu-inferencia",
        "resourceslice/nodo-simulado-gpu",
        "--ignore-not-found",
    )
    kubectl("delete", "events", "--field-selector", "involvedObject.kind=Pod", show=False)
    kubectl("delete", "events", "--field-selector", "involvedObject.kind=ResourceClaim", show=False)


def metrics_of(pod: str, port: int) -> str:
    """A component's /metrics, read inside its pod (pods live in the nodes' networks)."""
    read = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
    return kubectl("exec", "-n", RELEASE_NS, pod, "--", "python", "-c", read, show=False)


QUESTIONS = (
    (
        "which node has a free 24Gi GPU?",
        'max by (node) (dra_gpu_memory_bytes{state="free"}) >= 24 * 2^30',
    ),
    ("free GPUs per node", 'max by (node) (dra_gpu_devices{state="free"})'),
    ("claims waiting for a device", 'max(dra_gpu_claims{state="pending"})'),
)


def forward(pod: str, port: int, log: Path) -> str:
    """``kubectl port-forward`` to ``port`` of ``pod``, left running (it ends when the cluster
    stops); the local ``host:port``."""
    with log.open("wb") as out:
        subprocess.Popen(
            ["kubectl", "port-forward", "-n", RELEASE_NS, f"pod/{pod}", f":{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def address() -> str | None:
        found = re.search(r"Forwarding from (127\.0\.0\.1:\d+)", log.read_text())
        return found.group(1) if found else None

    return wait_for(f"port-forward to {pod}:{port}", address, timeout=30)


def scrape_targets(state_dir: Path, controller: str) -> list[ScrapeTarget]:
    """The controller leader and every agent, labelled as the chart's monitors label them."""
    logs = state_dir / "port-forwards"
    logs.mkdir(exist_ok=True)
    common = {"namespace": RELEASE_NS, "endpoint": "metrics"}
    targets = [
        ScrapeTarget(
            forward(controller, 9400, logs / f"{controller}.log"),
            {**common, "job": f"{RELEASE}-controller-metrics", "pod": controller},
        )
    ]
    for pod in kubectl_json("get", "pods", "-n", RELEASE_NS)["items"]:
        name = pod["metadata"]["name"]
        if "agent" in name:
            targets.append(
                ScrapeTarget(
                    forward(name, 9402, logs / f"{name}.log"),
                    {**common, "job": f"{RELEASE_NS}/{RELEASE}-agent", "pod": name},
                )
            )
    return targets


def ask_prometheus(state_dir: Path, controller: str) -> None:
    prometheus = prometheus_of(state_dir)
    if prometheus is None:
        return
    step("Prometheus: the controller and every agent scraped (kubectl port-forward into pods)")
    prometheus.set_targets(scrape_targets(state_dir, controller))

    def scraped() -> bool:
        return bool(prometheus.query('max(dra_gpu_devices{state="published"})'))

    wait_for("the first scrape", scraped, timeout=60)
    for question, promql in QUESTIONS:
        print(f"{BOLD}# {question}{RESET}\n{promql}")
        samples = prometheus.query(promql)
        for sample in samples:
            labels = ",".join(f"{k}={v}" for k, v in sample["metric"].items())
            print(f"  {{{labels}}} {sample['value'][1]}")
        if not samples:
            print("  (no node: the only 24Gi GPU, gpu-0, is the recomendador's)")
    print(f"\nPrometheus: {prometheus.url} (try the queries above in {prometheus.url}/graph)")


def running(app: str, count: int) -> list[str] | None:
    pods = kubectl_json("get", "pods", "-l", f"app={app}")["items"]
    names = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
    return names if len(names) == count else None


def pod_of(app: str) -> str | None:
    """The name of ``app``'s pod, once there is one."""
    pods = kubectl_json("get", "pods", "-l", f"app={app}")["items"]
    return str(pods[0]["metadata"]["name"]) if pods else None


def act_two(controller: str) -> None:
    """One GPU shared by memory shares, another in MIG partitions: node configuration in the
    chart's values, then the claims the scheduler fits onto them."""
    step("Act two: a GPU shared by memory shares, another in MIG partitions")
    print("node-02 gets an H100 shared by memory shares (MPS), node-03 an A100 40GB in MIG")
    print("partitions: node configuration is the chart's values (a changed profile rolls the")
    print("agents).")
    run(
        "helm",
        *("upgrade", RELEASE, str(REPO / "charts" / "dra-gpu"), "-n", RELEASE_NS),
        *("--reuse-values", "-f", str(REPO / "hack" / "act-two-values.yaml")),
        *("--wait", "--timeout=180s"),
    )
    kubectl("rollout", "status", "-n", RELEASE_NS, "daemonset/dra-gpu-agent", "--timeout=180s")
    wait_for(
        "node-03's partitions published",
        lambda: any(
            d["name"].startswith("gpu-0-mig-")
            for s in kubectl_json("get", "resourceslices")["items"]
            if s["spec"].get("nodeName") == "node-03"
            for d in s["spec"].get("devices", [])
        ),
    )
    kubectl("get", "resourceslices", "-o", "wide")
    for manifest in ACT_TWO[:2]:
        kubectl("apply", "-f", str(EXAMPLES / manifest))
    shared = wait_for("two pods sharing node-02's GPU", lambda: running("compartido", 2))
    partitioned = wait_for("three pods on node-03's partitions", lambda: running("particionado", 3))
    kubectl("apply", "-f", str(EXAMPLES / ACT_TWO[2]))
    waiting = wait_for("the third share's pod", lambda: pod_of("compartido-grande"))
    print(
        wait_for(
            "the scheduler to refuse it",
            lambda: pod_event("FailedScheduling", "cannot allocate all claims", pod=waiting),
        ),
        "\n",
    )
    kubectl("get", "pods", "-o", "wide")
    kubectl(
        "get",
        "resourceclaims",
        "-o",
        "custom-columns=CLAIM:.metadata.name,NODE:.status.allocation.devices.results[0].pool,"
        "DEVICE:.status.allocation.devices.results[0].device,"
        "SHARE:.status.allocation.devices.results[0].consumedCapacity.memory",
    )
    print("What each container was given, from inside it:")
    for pod in (*shared, partitioned[0]):
        kubectl("exec", pod, "--", "sh", "-c", "env | grep -E '^(GPU_|DRA_GPU_|CUDA_)' | sort")
    explain(waiting)
    wanted = ("dra_gpu_counters{", "dra_gpu_shared_memory_bytes{", "dra_gpu_shares{")
    print("The controller's view of both GPUs (Prometheus metrics):")
    for line in metrics_of(controller, 9400).splitlines():
        if line.startswith(wanted) and ("memory-slice" not in line or 'state="used"' in line):
            print("  " + line)
    print()


def main() -> int:
    if not os.environ.get("KUBECONFIG"):
        sys.exit("KUBECONFIG is not set: run `make run` (or `eval $(make cluster-up)`) first")
    nodes_dir = Path(os.environ.get("DRA_GPU_NODES_DIR", ".run/cluster/nodes"))
    state_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".run/cluster")
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
    explain(pod_name())
    kubectl("apply", "-f", str(EXAMPLES / "deviceclass.yaml"))
    print(
        wait_for(
            "the scheduler to retry the untouched pod",
            lambda: pod_event("FailedScheduling", "cannot allocate all claims"),
        ),
        "\n",
    )
    explain(pod_name())

    step("Step 3: describe a GPU by hand, as the tutorial does")
    kubectl("apply", "-f", str(EXAMPLES / "resourceslice.yaml"))
    print(
        wait_for(
            "the scheduler to place the pod",
            lambda: pod_event("Scheduled", "Successfully assigned"),
        ),
        "\n",
    )
    kubectl(
        "get",
        "resourceclaim",
        "-o",
        'jsonpath={range .items[*]}{.status.allocation.devices.results[0].device}{end}{"\\n"}',
    )

    step("Step 4: the fourth message - the kubelet has no driver")
    print(
        wait_for(
            "the kubelet on node-01",
            lambda: pod_event("FailedPrepareDynamicResources", "is not registered"),
        ),
        "\n",
    )
    explain(pod_name())

    step("The driver: helm install dra-gpu, in place of the hand-made slice")
    kubectl("delete", "resourceslice/nodo-simulado-gpu")
    run(
        "helm",
        *("install", RELEASE, str(REPO / "charts" / "dra-gpu")),
        *("-n", RELEASE_NS, "--create-namespace", "--wait", "--timeout=180s"),
    )
    wait_for(
        "an agent Ready on every node",
        lambda: (
            (ds := kubectl_json("get", "daemonset", "-n", RELEASE_NS, "dra-gpu-agent"))[
                "status"
            ].get("numberReady")
            == ds["status"].get("desiredNumberScheduled")
        ),
    )
    kubectl("get", "pods", "-n", RELEASE_NS, "-o", "wide")
    kubectl("get", "resourceslices", "-o", "wide")
    print("The kubelet retries the prepare at the pod's next sync ...")
    pod = wait_for(
        "the pod to run",
        lambda: next(
            (
                p["metadata"]["name"]
                for p in kubectl_json("get", "pods", "-l", "app=recomendador")["items"]
                if p["status"].get("phase") == "Running"
            ),
            None,
        ),
    )
    kubectl("get", "pods", "-l", "app=recomendador", "-o", "wide")
    print("The GPU the claim gave the container, from inside it:")
    kubectl("exec", pod, "--", "sh", "-c", "env | grep ^GPU_")
    wait_for(
        "the agent's status.devices on the claim",
        lambda: kubectl_json("get", "resourceclaims")["items"][0]["status"].get("devices"),
    )
    kubectl(
        "get",
        "resourceclaim",
        "-o",
        "jsonpath={range .items[*].status.devices[*]}{.device}: {.conditions[0].type}="
        '{.conditions[0].status} {.data}{"\\n"}{end}',
    )
    claim = kubectl_json("get", "resourceclaims")["items"][0]
    uid = claim["metadata"]["uid"]
    spec = nodes_dir / "node-01" / "root" / "run" / "cdi" / f"k8s.gpu.example.com-gpu_{uid}.json"
    print(f"{BOLD}$ cat {spec}{RESET}  (node-01's /var/run/cdi){RESET}\n{spec.read_text()}")
    explain(pod)

    step("The events in a row, in order")
    kubectl(
        "get", "events", "--field-selector", "involvedObject.kind=Pod", "--sort-by=.lastTimestamp"
    )
    step("Metrics (Prometheus): the controller's view of node-01, and node-01's agent")
    wanted = (
        "dra_gpu_devices{",
        "dra_gpu_memory_bytes{",
        "dra_gpu_claims{",
        "dra_gpu_prepare_claims_total{",
        "dra_gpu_prepared_devices ",
    )
    pods = kubectl_json("get", "pods", "-n", RELEASE_NS)["items"]
    leader = kubectl_json("get", "lease", "-n", RELEASE_NS, "dra-gpu-controller")
    controller = leader["spec"]["holderIdentity"]
    agent = next(
        p["metadata"]["name"]
        for p in pods
        if p["spec"].get("nodeName") == "node-01" and "agent" in p["metadata"]["name"]
    )
    for line in (metrics_of(controller, 9400) + metrics_of(agent, 9402)).splitlines():
        if line.startswith(wanted) and ('node="node-0' not in line or "node-01" in line):
            print("  " + line)
    print()
    ask_prometheus(state_dir, controller)
    print()
    act_two(controller)
    print(
        "The class, the device, the node and the driver: all four pieces in place.\n"
        "Explore with the exports `make cluster-up` prints; stop everything with\n"
        "`make cluster-down`."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

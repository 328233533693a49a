"""A driver that is gone is marked (controller.driverGone): the controller's settings, its
DeviceTaintRule permissions, the values' schema and the alert, as `helm template` renders them."""

from __future__ import annotations

from dra_gpu.controller import agents
from tests.chart.template import CHART, container, find, helm, render


def _controller_env(*args: str) -> dict[str, str]:
    deployment = find(render(*args), "Deployment", "-controller")
    return {e["name"]: e.get("value", "") for e in container(deployment)["env"]}


def _rules(*args: str) -> list[dict[str, object]]:
    role = find(render(*args), "ClusterRole", "-controller")
    return [r for r in role["rules"] if "devicetaintrules" in r["resources"]]


def test_the_controller_watches_the_agent_daemonsets_pods_by_its_selector() -> None:
    docs = render()
    env = _controller_env()
    daemonset = find(docs, "DaemonSet", "-agent")
    labels = daemonset["spec"]["selector"]["matchLabels"]
    selector = agents.AgentSelector(env["DRA_GPU_AGENT_POD_SELECTOR"], "dra")
    assert selector.labels == labels
    pod = {"metadata": {"namespace": "dra", **daemonset["spec"]["template"]["metadata"]}}
    assert selector(pod)  # the DaemonSet's own pods
    assert env["DRA_GPU_AGENT_NAMESPACE"] == "dra"
    assert env["DRA_GPU_DRIVER_GONE_SECONDS"] == "60"


def test_grace_is_a_value_and_the_feature_can_be_turned_off() -> None:
    assert (
        _controller_env("--set", "controller.driverGone.graceSeconds=10")[
            "DRA_GPU_DRIVER_GONE_SECONDS"
        ]
        == "10"
    )
    off = _controller_env("--set", "controller.driverGone.enabled=false")
    assert not {"DRA_GPU_AGENT_POD_SELECTOR", "DRA_GPU_DRIVER_GONE_SECONDS"} & set(off)
    # Without the chart's agents there is nothing to watch.
    no_agents = _controller_env("--set", "agent.enabled=false")
    assert "DRA_GPU_AGENT_POD_SELECTOR" not in no_agents


def test_devicetaintrules_are_read_always_and_written_only_when_enabled() -> None:
    assert _rules() == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["devicetaintrules"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["devicetaintrules"],
            "verbs": ["create", "delete"],
        },
    ]
    assert _rules("--set", "controller.driverGone.enabled=false") == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["devicetaintrules"],
            "verbs": ["list", "watch"],
        },
    ]


def test_the_schema_refuses_a_bad_grace() -> None:
    for bad in ("controller.driverGone.graceSeconds=-1", "controller.driverGone.grace=5"):
        done = helm("template", "rel", str(CHART), "--set", bad)
        assert done.returncode != 0, bad
        assert "driverGone" in done.stderr, done.stderr


def test_the_alert_fires_on_the_gauge_after_its_for() -> None:
    docs = render(
        *("--set", "metrics.prometheusRule.enabled=true"),
        *("--set", "metrics.prometheusRule.for.driverGone=3m"),
    )
    rules = {r["alert"]: r for r in find(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]}
    alert = rules["DraGpuDriverGone"]
    assert alert["expr"].strip() == (
        'max(dra_gpu_nodes_driver_gone{job="rel-dra-gpu-controller-metrics"}) > 0'
    )
    assert alert["for"] == "3m"
    assert alert["labels"] == {"severity": "warning"}

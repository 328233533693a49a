"""The chart's monitoring objects as `helm template` renders them: the PrometheusRule and the
Grafana dashboard ConfigMap, both opt-in. The rules' behaviour is unit-tested with promtool
(tests/unit/monitoring/); they and the dashboard's queries run on a real Prometheus in
tests/e2e/test_prometheus.py.
"""

from __future__ import annotations

import json

import pytest

from tests.chart.template import CHART, find, helm, render


def test_alerts_and_dashboard_only_when_enabled() -> None:
    kinds = [d["kind"] for d in render()]
    assert "PrometheusRule" not in kinds
    assert not [d for d in render() if d["metadata"]["name"].endswith("-dashboard")]


def test_rules_select_the_jobs_of_the_charts_monitors() -> None:
    docs = render("--set", "metrics.prometheusRule.enabled=true")
    rule = find(docs, "PrometheusRule")
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert sorted(rules) == [
        "DraGpuAdmissionErrors",
        "DraGpuAdmissionRefusalsHigh",
        "DraGpuAgentDown",
        "DraGpuCheckpointCorrupted",
        "DraGpuClaimsPendingWhileDevicesFree",
        "DraGpuControllerNoLeader",
        "DraGpuDeviceDegraded",
        "DraGpuDeviceFatal",
        "DraGpuDriverGone",
        "DraGpuInconsistentPools",
        "DraGpuNoFreeDeviceInClass",
        "DraGpuPluginNotRegistered",
        "DraGpuPrepareFailures",
    ]
    # The ServiceMonitor's job is its Service's name; the PodMonitor's <namespace>/<name>.
    assert 'job="rel-dra-gpu-controller-metrics"' in rules["DraGpuControllerNoLeader"]["expr"]
    assert 'job="dra/rel-dra-gpu-agent"' in rules["DraGpuAgentDown"]["expr"]
    assert find(docs, "Service", "-controller-metrics")["metadata"]["name"] == (
        "rel-dra-gpu-controller-metrics"
    )
    for name, body in rules.items():
        assert body["labels"]["severity"] in {"warning", "critical"}, name
        assert set(body["annotations"]) == {"summary", "description"}, name


def test_rule_jobs_durations_and_runbook_are_values() -> None:
    docs = render(
        *("--set", "metrics.prometheusRule.enabled=true"),
        *("--set", "metrics.prometheusRule.controllerJob=ctl"),
        *("--set", "metrics.prometheusRule.agentJob=agents"),
        *("--set", "metrics.prometheusRule.for.agentDown=1h"),
        *("--set", "metrics.prometheusRule.runbookUrl=https://example.invalid/docs/operations.md"),
        *("--set", "metrics.prometheusRule.labels.release=prometheus"),
    )
    rule = find(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert rules["DraGpuAgentDown"]["expr"].strip() == (
        'up{job="agents"} == 0 or absent(up{job="agents"}) == 1'
    )
    assert rules["DraGpuAgentDown"]["for"] == "1h"
    assert 'job="ctl"' in rules["DraGpuInconsistentPools"]["expr"]
    assert rules["DraGpuAgentDown"]["annotations"]["runbook_url"] == (
        "https://example.invalid/docs/operations.md#dragpuagentdown"
    )


def test_dashboard_config_map_carries_the_sidecar_label_and_the_json() -> None:
    docs = render(
        *("--set", "metrics.dashboard.enabled=true"),
        *("--set", "metrics.dashboard.folder=GPUs"),
    )
    config_map = find(docs, "ConfigMap", "-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    shipped = json.loads((CHART / "dashboards" / "dra-gpu.json").read_text())
    assert json.loads(config_map["data"]["dra-gpu.json"]) == shipped
    other = render(
        *("--set", "metrics.dashboard.enabled=true"),
        *("--set", "metrics.dashboard.sidecarLabel=dashboards"),
        *("--set", "metrics.dashboard.sidecarLabelValue=gpu"),
    )
    labels = find(other, "ConfigMap", "-dashboard")["metadata"]["labels"]
    assert labels["dashboards"] == "gpu"
    assert "grafana_dashboard" not in labels


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ("metrics.prometheusRule.for.agentDown=soon", "/metrics/prometheusRule/for/agentDown"),
        ("metrics.prometheusRule.bogus=1", "additional properties 'bogus' not allowed"),
        ("metrics.dashboard.enabled=yes", "/metrics/dashboard/enabled"),
    ],
)
def test_bad_monitoring_values_are_refused_naming_the_key(values: str, named: str) -> None:
    done = helm("template", "rel", str(CHART), "--set-string", values)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr

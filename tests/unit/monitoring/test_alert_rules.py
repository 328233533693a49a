"""The chart's alerts, unit-tested with ``promtool test rules`` on synthetic series.

The rules are rendered from the chart as a platform team installs them (``helm template``,
defaults but ``metrics.prometheusRule.enabled``), so the test sees the job selectors and
``for:`` durations that ship. The cases are promtool's own format, one entry per alert in
``alert_cases.yaml``: every alert has a case where it fires and one where it does not.
Needs the built helm (``make kubebins``) and promtool (``hack/build-prometheus.sh``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.testing import default_bin_dir
from tests.support.binaries import prometheus_bin as _prometheus_bin

pytestmark = pytest.mark.binaries

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "dra-gpu"
CASES: dict[str, list[dict[str, Any]]] = yaml.safe_load(
    (Path(__file__).with_name("alert_cases.yaml")).read_text()
)


@pytest.fixture(scope="module")
def promtool() -> Path:
    return _prometheus_bin() / "promtool"


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm = default_bin_dir() / "helm"
    assert helm.exists(), f"{helm} is missing: build it with `make kubebins`"
    done = subprocess.run(
        [
            *(str(helm), "template", "dra-gpu", str(CHART), "--namespace", "dra-gpu"),
            *("--set", "metrics.prometheusRule.enabled=true"),
            *("--show-only", "templates/prometheusrule.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rule = yaml.safe_load(done.stdout)
    path = tmp_path_factory.mktemp("rules") / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def _alerts(rules_file: Path) -> list[str]:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_rules_pass_promtool_check(promtool: Path, rules_file: Path) -> None:
    done = subprocess.run(
        [str(promtool), "check", "rules", str(rules_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_silent_case(rules_file: Path) -> None:
    assert sorted(_alerts(rules_file)) == sorted(CASES)
    for alert, groups in CASES.items():
        checks = [
            check
            for group in groups
            for check in group["alert_rule_test"]
            if check["alertname"] == alert
        ]
        assert any(check["exp_alerts"] for check in checks), f"{alert} never fires"
        assert any(not check["exp_alerts"] for check in checks), f"{alert} is never silent"


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_fires_exactly_when_its_cases_say(
    alert: str, promtool: Path, rules_file: Path, tmp_path: Path
) -> None:
    tests = tmp_path / f"{alert}.yml"
    tests.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": CASES[alert]},
            sort_keys=False,
        )
    )
    done = subprocess.run(
        [str(promtool), "test", "rules", str(tests)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr

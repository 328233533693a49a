"""The chart as ``helm template`` renders it, and the objects found in what it renders.

Owns: running the built helm on ``charts/dra-gpu`` (``helm``; ``render`` parses the documents)
and picking objects out of them (``find``, ``container``, ``env_of``), for the render tests
here and the e2e tests that compare a rendered object with a running one.
Must not: judge what it renders (the tests do).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support import binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dra-gpu"
FULL_VALUES = CHART / "ci" / "full-values.yaml"


Manifest = dict[str, Any]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries.helm()), *args], capture_output=True, text=True, timeout=60, check=False
    )


def render(*args: str) -> list[Manifest]:
    done = helm("template", "rel", str(CHART), "--namespace", "dra", *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def refusal(values: Manifest, tmp_path: Path) -> str:
    """What ``helm template`` says when it refuses ``values`` (it must refuse them)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(values))
    done = helm("template", "rel", str(CHART), "--values", str(bad))
    assert done.returncode != 0, "rendered"
    return done.stderr


def find(docs: list[Manifest], kind: str, suffix: str = "") -> Manifest:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(workload: Manifest) -> Manifest:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Manifest = containers[0]
    return result


def env_of(workload: Manifest, downward: dict[str, str]) -> dict[str, str]:
    """The container's environment, with downward-API fields replaced by stand-in values."""
    env = {}
    for item in container(workload)["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = downward[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env

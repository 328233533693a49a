"""dra_gpu.cel gives kube-scheduler's verdicts: a differential test against upstream's own CEL.

The oracle is hack/celref, upstream's k8s.io/dynamic-resource-allocation/cel at the Kubernetes
version the project tests (built by hack/build-celref.sh, cached; see tests/unit/cel/celref.py).
Every case is an expression and a device; both sides give a verdict, true, false or error
(an error of any kind matches an error of any kind), and they must agree. The oracle also says
whether the API server would store the selector at all ("accepted"): what it would reject may
be refused here with any message, so those cases are counted apart.

Run alone: ``.venv/bin/pytest tests/unit/cel/test_upstream.py -s`` (prints the counts).
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from dra_gpu.cel._port import declarations
from tests.unit.cel import celgen
from tests.unit.cel.celref import Oracle, build_oracle, ours, verdict
from tests.unit.cel.upstream_table import BOTH, CASES

pytestmark = pytest.mark.binaries

GENERATED_CASES = int(os.environ.get("DRA_GPU_CEL_CASES", "10000"))
# kube-apiserver 1.37's default gates: DRAConsumableCapacity is beta, DRAListTypeAttributes alpha.
DEFAULT_FEATURES = {"EnableConsumableCapacity": True, "EnableListTypeAttributes": False}


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    with Oracle(build_oracle()) as running:
        yield running


def test_declarations_are_the_schedulers_environment() -> None:
    binary = build_oracle()
    import subprocess

    dump = subprocess.run([str(binary), "-decls"], capture_output=True, text=True, check=True)
    upstream = []
    for line in dump.stdout.splitlines():
        entry = json.loads(line)
        if entry.get("env") == "stored" and "function" in entry:
            upstream.append(
                (entry["function"], entry["id"], entry["member"], tuple(entry["args"]),
                 entry["result"])
            )  # fmt: skip
    assert list(declarations.OVERLOADS) == upstream


@pytest.mark.parametrize("name", sorted(CASES))
def test_upstream_table_case_gives_the_schedulers_verdict(oracle: Oracle, name: str) -> None:
    """Every case of upstream's TestCEL: our verdict is the scheduler's, and what upstream
    expects of it. A case upstream runs only against the API server's environment ("new"
    scope) is checked there through the oracle when its feature gates are 1.37's defaults;
    with other gates it cannot arise on a default 1.37 cluster."""
    case = CASES[name]
    answer = oracle.judge(case["expression"], case["driver"], case["device"])
    mine, message = ours(case["expression"], case["driver"], case["device"])
    upstream = verdict(answer)
    assert mine == upstream, (message, answer)
    kind, expected = case["expect"]
    if case["scope"] == BOTH:
        if kind == "match":
            assert mine == ("true" if expected else "false"), message
        else:
            assert mine == "error"
            assert expected in str(answer.get("compileError") or answer.get("error")), answer
    elif all(DEFAULT_FEATURES[k] == v for k, v in case["features"].items()):
        assert answer["accepted"] == (kind != "compile_error"), answer


def test_generated_selectors_agree_with_the_scheduler(oracle: Oracle) -> None:
    counts: collections.Counter[str] = collections.Counter()
    mismatches: list[dict[str, Any]] = []

    @settings(
        max_examples=GENERATED_CASES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(celgen.cases())
    def check(case: tuple[str, str, dict[str, Any]]) -> None:
        expression, driver, device = case
        answer = oracle.judge(expression, driver, device)
        upstream = verdict(answer)
        if upstream is None:
            counts["not a device upstream"] += 1
            return
        mine, message = ours(expression, driver, device)
        scope = "accepted" if answer["accepted"] else "rejected by the API server"
        counts[f"{scope}: {upstream}"] += 1
        if mine != upstream:
            counts[f"{scope}: mismatch"] += 1
            mismatches.append(
                {
                    "expression": expression,
                    "driver": driver,
                    "device": device,
                    "accepted": answer["accepted"],
                    "upstream": upstream,
                    "upstream_message": answer.get("compileError") or answer.get("error"),
                    "ours": mine,
                    "our_message": message,
                }
            )

    check()
    print("\ndifferential CEL test:", json.dumps(dict(sorted(counts.items())), indent=1))
    accepted = [m for m in mismatches if m["accepted"]]
    shown = "\n".join(json.dumps(m, ensure_ascii=False) for m in mismatches[:20])
    assert not accepted, f"{len(accepted)} mismatches on accepted selectors:\n{shown}"
    assert not mismatches, f"{len(mismatches)} mismatches:\n{shown}"

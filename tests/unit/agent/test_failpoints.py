"""Crash injection: parsed strictly, off by default, and a reached point really kills."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from dra_gpu.agent import failpoints


def test_points_and_probabilities_are_parsed() -> None:
    assert failpoints.parse("") == {}
    assert failpoints.parse(" cdi-spec-written=0.5, before-answer=1 ,") == {
        "cdi-spec-written": 0.5,
        "before-answer": 1.0,
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("cdi-spec-writen=0.5", "unknown point 'cdi-spec-writen'; known: cdi-spec-written"),
        ("before-answer", "before-answer: '' is not a probability"),
        ("before-answer=often", "before-answer: 'often' is not a probability"),
        ("before-answer=2", "before-answer: 2.0 is not between 0 and 1"),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_part(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        failpoints.parse(text)


def run_point(setting: str) -> subprocess.CompletedProcess[str]:
    code = (
        "from dra_gpu.agent import failpoints\n"
        f"failpoints.configure({{'DRA_GPU_FAILPOINTS': {setting!r}}})\n"
        "failpoints.reach('before-answer')\n"
        "print('survived')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_reached_point_kills_the_process_and_an_unset_one_does_nothing() -> None:
    assert run_point("before-answer=1").returncode == -signal.SIGKILL
    survived = run_point("")
    assert (survived.returncode, survived.stdout) == (0, "survived\n")

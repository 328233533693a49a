"""Failures at the edges, as a user meets them: the real commands (``python -m dra_gpu ...``,
``python -m dra_gpu.testing ...``) in a subprocess, no cluster. Each ends with one line on stderr
that names the file, flag or address and the fix, and its own exit code (``dra_gpu.exits``);
the traceback only with ``--log-level DEBUG``. The controller waits for its API server instead.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gpu.exits import ExitCode
from dra_gpu.testing import eventually
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "charts" / "dra-gpu" / "profiles" / "tutorial.yaml"


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """Our environment without any kubeconfig, in-cluster or DRA_GPU_ setting, HOME empty."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DRA_GPU_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    return {**env, "HOME": str(home), **extra}


def run(
    home: Path, *argv: str, module: str = "dra_gpu", **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        env=clean_env(home, **env),
        timeout=120,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str], code: ExitCode, prefix: str) -> str:
    """The failure's single stderr line, after checking the exit code and that it is alone."""
    assert result.returncode == code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix + ": "), lines[0]
    return lines[0]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, never listening, so nobody takes it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', insecure-skip-tls-verify: 1}}}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: ctx, context: {cluster: c, user: u}}]\n"
    )
    return path


# ---- kubeconfig ----------------------------------------------------------------------------


def test_explain_with_kubeconfig_naming_a_missing_file_says_which_variable(tmp_path: Path) -> None:
    result = run(tmp_path, "explain", "pod/x", KUBECONFIG="/nonexistent")
    line = one_line(result, ExitCode.CONFIG, "dra-gpu explain")
    assert "kubeconfig /nonexistent (from KUBECONFIG) does not exist" in line
    assert "point KUBECONFIG at your cluster's kubeconfig file" in line


def test_explain_without_any_kubeconfig_names_the_flag_and_the_variable(tmp_path: Path) -> None:
    line = one_line(run(tmp_path, "explain", "pod/x"), ExitCode.CONFIG, "dra-gpu explain")
    assert "no kubeconfig: pass one with --kubeconfig or KUBECONFIG" in line
    assert "~/.kube/config does not exist" in line


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("clusters: [oops\n", "is not valid YAML at line 2"),
        ("", "is not a kubeconfig: expected a YAML mapping"),
        ("apiVersion: v1\nkind: Config\n", "has no current-context: choose one with `kubectl"),
        (
            "apiVersion: v1\ncurrent-context: gone\ncontexts: []\n",
            "is not usable: Expected object with name gone in",
        ),
    ],
    ids=["not-yaml", "empty", "no-current-context", "unknown-context"],
)
def test_explain_with_an_invalid_kubeconfig_says_what_is_wrong_with_the_file(
    tmp_path: Path, content: str, problem: str
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(content)
    result = run(tmp_path, "explain", "pod/x", "--kubeconfig", str(config))
    line = one_line(result, ExitCode.CONFIG, "dra-gpu explain")
    assert f"kubeconfig {config} (from --kubeconfig) {problem}" in line


def test_in_a_pod_without_a_service_account_token_says_how_to_mount_it(tmp_path: Path) -> None:
    result = run(
        tmp_path, "controller", KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443"
    )
    line = one_line(result, ExitCode.CONFIG, "dra-gpu controller")
    assert "in-cluster service account is not usable" in line
    assert "automountServiceAccountToken" in line
    assert "--kubeconfig, DRA_GPU_KUBECONFIG" in line


@pytest.mark.parametrize("command", ["agent", "controller"])
def test_a_component_names_the_env_twin_its_missing_kubeconfig_came_from(
    tmp_path: Path, command: str
) -> None:
    result = run(
        tmp_path,
        command,
        DRA_GPU_KUBECONFIG="/nonexistent",
        DRA_GPU_NODE_NAME="node-01",
        DRA_GPU_PROFILE=str(PROFILE),
    )
    line = one_line(result, ExitCode.CONFIG, f"dra-gpu {command}")
    assert "kubeconfig /nonexistent (from DRA_GPU_KUBECONFIG) does not exist" in line


def test_controller_with_a_missing_kubeconfig_flag_names_the_flag(tmp_path: Path) -> None:
    result = run(tmp_path, "controller", "--kubeconfig", str(tmp_path / "nope"))
    line = one_line(result, ExitCode.CONFIG, "dra-gpu controller")
    assert f"kubeconfig {tmp_path / 'nope'} (from --kubeconfig) does not exist" in line


def test_agent_with_a_missing_profile_names_the_file_and_the_flag(
    tmp_path: Path, closed_port: int
) -> None:
    short_dir = tempfile.mkdtemp(prefix="k-", dir="/tmp")
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    result = run(
        tmp_path,
        "agent",
        "--node-name=node-01",
        f"--profile={tmp_path / 'nope.yaml'}",
        f"--kubeconfig={config}",
        f"--kubelet-dir={short_dir}",  # unix socket paths: tmp_path is too long
        f"--cdi-dir={tmp_path / 'cdi'}",
        f"--checkpoint-dir={tmp_path / 'checkpoint'}",
    )
    shutil.rmtree(short_dir, ignore_errors=True)
    line = one_line(result, ExitCode.CONFIG, "dra-gpu agent")
    assert f"profile {tmp_path / 'nope.yaml'}: cannot be read" in line
    assert "fix --profile (or DRA_GPU_PROFILE)" in line


# ---- flags ---------------------------------------------------------------------------------


def test_agent_without_node_name_names_the_flag_and_its_env_twin(tmp_path: Path) -> None:
    line = one_line(run(tmp_path, "agent"), ExitCode.USAGE, "dra-gpu agent")
    assert line == (
        "dra-gpu agent: --node-name is required (or set DRA_GPU_NODE_NAME): "
        "the Node this agent serves (downward API spec.nodeName in the chart)"
    )


def test_a_bad_value_in_an_env_twin_names_the_variable(tmp_path: Path) -> None:
    result = run(tmp_path, "controller", DRA_GPU_LEASE_SECONDS="soon")
    line = one_line(result, ExitCode.USAGE, "dra-gpu controller")
    assert line.endswith("DRA_GPU_LEASE_SECONDS: 'soon' is not a valid int")


@pytest.mark.parametrize(
    ("argv", "prefix", "says"),
    [
        (["explain", "-o", "xml"], "dra-gpu explain", "argument -o/--output: invalid choice"),
        (["explain", "claim-x"], "dra-gpu explain", "'claim-x': expected pod/NAME or"),
        (["explain", "pod/x", "-A"], "dra-gpu explain", "across all namespaces"),
        (["--log-level", "loud", "agent"], "dra-gpu", "argument --log-level: invalid choice"),
        (["--log-format", "xml", "agent"], "dra-gpu", "argument --log-format: invalid choice"),
        (["agent", "--node"], "dra-gpu agent", "argument --node-name: expected one argument"),
    ],
    ids=[
        "bad-output",
        "bad-target",
        "target-with-all-namespaces",
        "bad-log-level",
        "bad-log-format",
        "flag-without-value",
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], prefix: str, says: str
) -> None:
    assert says in one_line(run(tmp_path, *argv), ExitCode.USAGE, prefix)


# ---- the API server ------------------------------------------------------------------------


def test_explain_against_an_unreachable_api_server_names_the_address(
    tmp_path: Path, closed_port: int
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    result = run(tmp_path, "explain", "pod/x", "--kubeconfig", str(config))
    line = one_line(result, ExitCode.UNREACHABLE, "dra-gpu explain")
    assert (
        f"the API server at https://127.0.0.1:{closed_port} (kubeconfig {config}, context ctx) "
        "does not answer: connection refused; is the cluster up" in line
    )


def test_debug_log_level_adds_the_traceback_before_the_line(
    tmp_path: Path, closed_port: int
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    result = run(tmp_path, "--log-level", "DEBUG", "explain", "pod/x", "--kubeconfig", str(config))
    assert result.returncode == ExitCode.UNREACHABLE
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("dra-gpu explain: the API server at")


def test_json_logs_are_one_object_a_line_with_the_traceback_inside(
    tmp_path: Path, closed_port: int
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    argv = ("--log-level", "DEBUG", "--log-format", "json", "explain", "pod/x")
    result = run(tmp_path, *argv, "--kubeconfig", str(config))
    assert result.returncode == ExitCode.UNREACHABLE
    *records, last = result.stderr.splitlines()
    assert last.startswith("dra-gpu explain: the API server at")  # the verdict stays a line
    parsed = [json.loads(line) for line in records]  # every other line is one JSON object
    failure = next(r for r in parsed if r["message"] == "the failure in full:")
    assert (failure["level"], failure["logger"]) == ("DEBUG", "dra_gpu")
    assert "Traceback (most recent call last)" in failure["exc_info"]
    assert datetime.datetime.fromisoformat(failure["time"]).utcoffset() == datetime.timedelta(0)


def test_json_logs_name_the_claim_a_line_is_about() -> None:
    # The agent logs a claim's lines with ClaimRef.log_fields: in JSON, one object a pipeline
    # can select on, named as klog names an object.
    script = (
        "import logging; from dra_gpu import cli; from dra_gpu.agent.claims import ClaimRef; "
        "cli._configure_logging('INFO', 'json'); ref = ClaimRef('ns', 'c', 'uid-1'); "
        "logging.getLogger('dra_gpu.agent.state').warning('prepare %s: no', ref, "
        "extra=ref.log_fields)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    (record,) = [json.loads(line) for line in done.stderr.splitlines()]
    assert record["message"] == "prepare ns/c: no"
    assert record["claim"] == {"namespace": "ns", "name": "c", "uid": "uid-1"}
    assert (record["level"], record["logger"]) == ("WARNING", "dra_gpu.agent.state")


def readyz(port: int) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


async def test_controller_waits_for_an_unreachable_api_server_and_says_so(
    tmp_path: Path, closed_port: int
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    health = free_port()
    log = tmp_path / "controller.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dra_gpu",
            "controller",
            f"--kubeconfig={config}",
            "--bind-address=127.0.0.1",
            f"--health-port={health}",
            "--metrics-port=0",
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(tmp_path),
        )
    try:
        server = f"the API server at https://127.0.0.1:{closed_port} (kubeconfig {config}"

        def attempts() -> list[str]:
            return [line for line in log.read_text().splitlines() if server in line]

        await eventually(lambda: len(attempts()) >= 2, timeout=60, what="two attempts logged")
        assert proc.returncode is None, log.read_text()
        assert "connection refused; attempt 1, next in 1 s" in attempts()[0]
        assert "connection refused; attempt 2, next in 2 s" in attempts()[1]
        answer = await asyncio.to_thread(readyz, health)
        status, text = answer or (0, "")
        assert status == 503
        assert text.startswith(server)
        assert "connection refused" in text
        assert "Traceback" not in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)  # stops while waiting, not after
    assert code == ExitCode.OK, log.read_text()


# ---- the test kit's CLI --------------------------------------------------------------------


def test_kit_without_a_command_is_one_usage_line(tmp_path: Path) -> None:
    result = run(tmp_path, module="dra_gpu.testing")
    line = one_line(result, ExitCode.USAGE, "python -m dra_gpu.testing")
    assert "the following arguments are required: command" in line


def test_kit_up_without_control_plane_binaries_says_how_to_build_them(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        "up",
        f"--state-dir={tmp_path / 'cluster'}",
        f"--bin-dir={tmp_path / 'bin'}",
        module="dra_gpu.testing",
    )
    line = one_line(result, ExitCode.CONFIG, "python -m dra_gpu.testing up")
    assert f"{tmp_path / 'bin' / 'etcd'} is missing: build the control plane with" in line
    assert "--bin-dir (or DRA_GPU_BIN_DIR)" in line
    assert not (tmp_path / "cluster").exists()  # no supervisor was started for nothing


def test_kit_up_refuses_a_running_cluster_whose_api_server_is_gone(
    tmp_path: Path, closed_port: int
) -> None:
    state = tmp_path / "cluster"
    state.mkdir()
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    (state / "env.sh").write_text(
        f"export KUBECONFIG={config}\nexport DRA_GPU_NODES_DIR={tmp_path}\n"
        f'export PATH={tmp_path}:"$PATH"\n'
    )
    supervisor = subprocess.Popen(["sleep", "120"])  # alive, as a supervisor whose cp died
    try:
        (state / "supervisor.pid").write_text(str(supervisor.pid))
        result = run(tmp_path, "up", f"--state-dir={state}", module="dra_gpu.testing")
    finally:
        supervisor.kill()
        supervisor.wait()
    line = one_line(result, ExitCode.UNREACHABLE, "python -m dra_gpu.testing up")
    assert f"the API server at https://127.0.0.1:{closed_port} (the local cluster of" in line
    assert f"stop it with `python -m dra_gpu.testing down --state-dir {state}`" in line

"""`kubectl dra-gpu` on the real cluster, as a kubectl user runs it: the plugin found on PATH by
the built kubectl, `explain -A -o json` naming a waiting claim's missing piece with exit code 6,
`-n` taken from the kubeconfig context's namespace, and `status` reading the published GPUs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import yaml

from dra_gpu import kube
from dra_gpu.exits import ExitCode
from dra_gpu.testing import ControlPlane, eventually

RESOURCE = "/apis/resource.k8s.io/v1"


def plugin_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has `kubectl-dra_gpu` (what `pip install` puts in a venv's bin)
    first, running this checkout's code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kubectl-dra_gpu"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from dra_gpu.cli import "
                    "kubectl_main; sys.exit(kubectl_main())' \"$@\"\n")  # fmt: skip
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


async def kubectl(
    control_plane: ControlPlane, env: dict[str, str], kubeconfig: Path, *args: str
) -> tuple[int, str, str]:
    # $KUBECONFIG, as a kubectl user has it: kubectl refuses flags before a plugin's name.
    proc = await asyncio.create_subprocess_exec(
        str(control_plane.binary("kubectl")),
        *args,
        env={**env, "KUBECONFIG": str(kubeconfig)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_kubectl_runs_the_plugin_with_kubectls_habits(
    control_plane: ControlPlane, api: kube.Kube, namespace: str, tmp_path: Path
) -> None:
    env = plugin_on_path(tmp_path)
    # A context whose namespace is the test's: `-n` defaults to it, as kubectl's does.
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    (kubeconfig := tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "waits"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": f"no-such-class-{namespace}"}}
                ]
            }
        },
    }
    await api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim)

    listed = await kubectl(control_plane, env, kubeconfig, "plugin", "list")
    assert "kubectl-dra_gpu" in listed[1], listed

    async def explained() -> tuple[int, dict[str, object]] | None:
        code, out, err = await kubectl(
            control_plane, env, kubeconfig, "dra-gpu", "explain", "-A", "-o", "json"
        )
        assert out, f"exit {code}: {err}"
        found = json.loads(out)
        ours = [e for e in found["explanations"] if e["claim"] == f"{namespace}/waits"]
        return (code, ours[0]) if ours else None

    code, explanation = await eventually(explained, what="the claim listed by explain -A")
    assert code == ExitCode.NOT_SATISFIED
    assert explanation["missing"] is True
    pieces = {p["name"]: p["satisfied"] for p in explanation["pieces"]}  # type: ignore[attr-defined]
    assert pieces["class"] is False

    # No -n: the context's namespace, so the table names the claim (and no NAMESPACE column).
    code, out, err = await kubectl(control_plane, env, kubeconfig, "dra-gpu", "explain")
    assert code == ExitCode.NOT_SATISFIED, err
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["CLAIM", "POD"], out
    assert any(row.split()[0] == "waits" for row in rows), out

    code, out, err = await kubectl(control_plane, env, kubeconfig, "dra-gpu", "status")
    assert code == ExitCode.OK, err
    assert out.splitlines()[0].split()[:4] == ["NODE", "DEVICES", "ALLOCATED", "FREE"], out

    code, out, err = await kubectl(control_plane, env, kubeconfig, "dra-gpu", "explain", "-o")
    assert code == ExitCode.USAGE
    assert err.startswith("kubectl dra-gpu"), err

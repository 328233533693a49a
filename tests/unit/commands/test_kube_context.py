"""``--context`` and the context's namespace, as kubectl reads a kubeconfig: the context named
instead of current-context, a context that is not there named in the error, and the namespace
``explain`` defaults ``-n`` to."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu import kube
from dra_gpu.kube.kubeconfig import load_config


def kubeconfig(path: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\n"
        "clusters:\n"
        "- {name: dev, cluster: {server: 'https://dev.example:6443'}}\n"
        "- {name: prod, cluster: {server: 'https://prod.example:6443'}}\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts:\n"
        "- {name: dev, context: {cluster: dev, user: u}}\n"
        "- {name: prod, context: {cluster: prod, user: u, namespace: team-a}}\n"
    )
    return path


async def test_context_picks_that_context_and_its_namespace(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "config")
    current = await load_config(config, source="--kubeconfig", flag="--kubeconfig")
    assert (current.credentials.server, current.namespace) == ("https://dev.example:6443", None)
    chosen = await load_config(config, source="--kubeconfig", flag="--kubeconfig", context="prod")
    assert (chosen.credentials.server, chosen.namespace) == ("https://prod.example:6443", "team-a")
    assert chosen.credentials.origin == f"kubeconfig {config}, context prod"
    async with await kube.Kube.connect(config, context="prod") as api:
        assert (api.server, api.namespace) == ("https://prod.example:6443", "team-a")


async def test_a_context_that_is_not_there_is_named(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "config")
    with pytest.raises(kube.ConfigError) as raised:
        await load_config(config, source="--kubeconfig", flag="--kubeconfig", context="staging")
    assert str(raised.value) == (
        f"context staging (from --context) is not in kubeconfig {config} (from --kubeconfig): "
        "its contexts are dev, prod (`kubectl config get-contexts`)"
    )


async def test_a_context_without_a_kubeconfig_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(kube.ConfigError, match="--context prod needs a kubeconfig"):
        await load_config(None, source="--kubeconfig", flag="--kubeconfig", context="prod")

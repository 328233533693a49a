"""Credentials kept fresh as client-go keeps them, against a real server on loopback that
rejects the tokens each test names: an ``exec`` plugin (a real program) runs again after a 401
and before its credential's expiry, and not otherwise; a token file is read again after a 401;
the request that got the 401 is sent once more, and only once; concurrent 401s run the plugin
once."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dra_gpu import kube
from tests.support.api_servers import Pki, Server, answer, read_request, serving
from tests.unit.kube.test_connect import headers_of, write_kubeconfig

PLUGIN = """
import json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
n = len(runs.read_text().splitlines()) + 1 if runs.exists() else 1
expiries = json.loads(sys.argv[2])
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
status = {"token": f"t{n}"}
if expiries:
    status["expirationTimestamp"] = expiries[min(n, len(expiries)) - 1]
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": status}))
"""


def exec_user(tmp_path: Path, expiries: list[str] | None = None) -> tuple[dict[str, object], Path]:
    """A user whose token comes from a plugin that gives ``t1``, ``t2``, ... (one per run, each
    run a line in the returned file), with the ``n``-th of ``expiries`` if any."""
    script, runs = tmp_path / "plugin.py", tmp_path / "runs"
    script.write_text(PLUGIN)
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(script), str(runs), json.dumps(expiries or [])],
        "interactiveMode": "Never",
    }
    return {"exec": plugin}, runs


def runs_of(runs: Path) -> int:
    return len(runs.read_text().splitlines())


@contextlib.asynccontextmanager
async def rejecting(pki: Pki, *rejected: str, delay: float = 0.0) -> AsyncIterator[Server]:
    """A TLS server that answers 401 to ``Bearer X`` for each ``X`` in ``rejected`` (all with
    ``*``), 200 with ``{}`` otherwise; after ``delay`` seconds."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader, server)
            token = headers_of(request).get("authorization", "").removeprefix("Bearer ")
            await asyncio.sleep(delay)
            if "*" in rejected or token in rejected:
                status = {"kind": "Status", "code": 401, "reason": "Unauthorized"}
                writer.write(answer(json.dumps(status).encode(), "401 Unauthorized"))
            else:
                writer.write(answer(b"{}"))

    async with serving(handler, tls=pki.server_context(pki.server)) as server:
        yield server


def tokens_sent(server: Server) -> list[str]:
    return [headers_of(r).get("authorization", "") for r in server.requests]


def config_for(tmp_path: Path, server: Server, pki: Pki, user: dict[str, object]) -> Path:
    return write_kubeconfig(
        tmp_path / "kubeconfig",
        server.url("https"),
        cluster={"certificate-authority": str(pki.ca)},
        user=user,
    )


async def test_an_exec_token_without_expiry_is_fetched_again_on_401_and_sent_once_more(
    pki: Pki, tmp_path: Path
) -> None:
    user, runs = exec_user(tmp_path)
    async with (
        rejecting(pki, "t1") as server,
        await kube.Kube.connect(config_for(tmp_path, server, pki, user)) as api,
    ):
        assert runs_of(runs) == 1
        assert await api.get("/api") == {}  # t1: 401; the plugin runs; t2: 200
        assert await api.get("/api") == {}  # t2 kept: no expiry, no 401
    assert tokens_sent(server) == ["Bearer t1", "Bearer t2", "Bearer t2"]
    assert runs_of(runs) == 2


async def test_a_request_is_sent_once_more_at_most(pki: Pki, tmp_path: Path) -> None:
    user, runs = exec_user(tmp_path)
    async with (
        rejecting(pki, "*") as server,
        await kube.Kube.connect(config_for(tmp_path, server, pki, user)) as api,
    ):
        with pytest.raises(kube.ApiError) as raised:
            await api.get("/api")
        assert raised.value.status == 401
        with pytest.raises(kube.Refused, match=r"\(401 Unauthorized\)"):
            await api.probe()
    assert tokens_sent(server) == ["Bearer t1", "Bearer t2", "Bearer t2", "Bearer t3"]
    assert runs_of(runs) == 3


async def test_an_exec_token_is_refreshed_before_its_expiry_and_kept_until_then(
    pki: Pki, tmp_path: Path
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    soon = (now + datetime.timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    later = (now + datetime.timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    user, runs = exec_user(tmp_path, [soon, later])
    async with (
        rejecting(pki) as server,
        await kube.Kube.connect(config_for(tmp_path, server, pki, user)) as api,
    ):
        await api.get("/api")  # t1 expires within the margin: t2 is sent instead
        await api.get("/api")
    assert tokens_sent(server) == ["Bearer t2", "Bearer t2"]
    assert runs_of(runs) == 2


async def test_concurrent_401s_run_the_plugin_once(pki: Pki, tmp_path: Path) -> None:
    user, runs = exec_user(tmp_path)
    async with (
        rejecting(pki, "t1", delay=0.2) as server,
        await kube.Kube.connect(config_for(tmp_path, server, pki, user)) as api,
    ):
        await asyncio.gather(api.get("/a"), api.get("/b"), api.get("/c"))
    assert sorted(tokens_sent(server)) == ["Bearer t1"] * 3 + ["Bearer t2"] * 3
    assert runs_of(runs) == 2


async def test_a_401_reads_the_token_file_again(pki: Pki, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    async with rejecting(pki, "old") as server:
        config = config_for(tmp_path, server, pki, {"tokenFile": str(token)})
        async with await kube.Kube.connect(config) as api:
            token.write_text("new\n")  # rotated well within the minute it is cached for
            assert await api.get("/api") == {}
    assert tokens_sent(server) == ["Bearer old", "Bearer new"]


async def test_a_static_token_that_gets_401_is_not_sent_again(pki: Pki, tmp_path: Path) -> None:
    async with (
        rejecting(pki, "*") as server,
        await kube.Kube.connect(config_for(tmp_path, server, pki, {"token": "static"})) as api,
    ):
        with pytest.raises(kube.ApiError):
            await api.get("/api")
    assert tokens_sent(server) == ["Bearer static"]

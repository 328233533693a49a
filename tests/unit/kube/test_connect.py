"""``kube.Kube`` over its own transport, against servers on loopback: what a kubeconfig or the
in-cluster service account turns into on the wire (TLS, client certificates, tokens, a token
rotated in its file), the JSON requests and answers, the watch loop, and the words for every
way a server fails to answer (``Unreachable``) or a kubeconfig fails to load
(``ConfigError``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import kube
from dra_gpu.kube import auth, tokens, transport
from tests.support.api_servers import (
    LAST_CHUNK,
    FakeTime,
    Pki,
    Server,
    answer,
    chunk,
    chunked_head,
    read_request,
    serving,
)


def write_kubeconfig(
    path: Path, server: str, *, cluster: dict[str, Any] | None = None, user: dict[str, Any]
) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


@contextlib.asynccontextmanager
async def tls_echo(pki: Pki) -> AsyncIterator[Any]:
    """A server with the cluster CA's certificate that answers each request with what it got."""
    async with serving(
        lambda r, w, i: echo(server, r, w), tls=pki.server_context(pki.server)
    ) as server:
        yield server


def headers_of(request: bytes) -> dict[str, str]:
    head = request.split(b"\r\n\r\n")[0].decode()
    return {
        name.lower(): value.strip()
        for name, _, value in (line.partition(":") for line in head.split("\r\n")[1:])
    }


async def echo(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer each request with its method, target and JSON body, or 404 for ``/missing``."""
    while True:
        request = await read_request(reader, server)
        line, _, rest = request.partition(b"\r\n")
        method, target, _ = line.decode().split(" ")
        if target.startswith("/missing"):
            status = {"kind": "Status", "reason": "NotFound", "message": "missing not found"}
            writer.write(answer(json.dumps(status).encode(), "404 Not Found"))
            continue
        body = rest.partition(b"\r\n\r\n")[2]
        sent = json.loads(body) if body else None
        writer.write(
            answer(json.dumps({"method": method, "target": target, "sent": sent}).encode())
        )


async def test_json_requests_with_a_token_over_tls_to_the_cluster_ca(
    pki: Pki, tmp_path: Path
) -> None:
    async with tls_echo(pki) as server:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            cluster={"certificate-authority": str(pki.ca)},
            user={"token": "t0k3n"},
        )
        async with await kube.Kube.connect(config) as api:
            assert api.server == server.url("https")
            assert api.origin == f"kubeconfig {config}, context ctx"
            got = await api.get("/api/v1/pods", labelSelector="a in (b,c)", watch=False)
            assert got["target"] == "/api/v1/pods?labelSelector=a+in+%28b%2Cc%29&watch=false"
            created = await api.create("/api/v1/namespaces", {"metadata": {"name": "n"}})
            assert created["sent"] == {"metadata": {"name": "n"}}
            patched = await api.patch("/x", {"a": 1}, "strategic")
            assert patched["method"] == "PATCH"
            with pytest.raises(kube.ApiError) as raised:
                await api.get("/missing")
            assert raised.value.not_found
            assert str(raised.value) == "GET /missing: 404 NotFound: missing not found"
            assert await api.delete("/missing") is None
        assert server.connections == 1
    first, patch = headers_of(server.requests[0]), headers_of(server.requests[2])
    assert first["authorization"] == "Bearer t0k3n"
    assert first["accept"] == "application/json"
    assert first["user-agent"].startswith("dra-gpu/")
    assert patch["content-type"] == "application/strategic-merge-patch+json"


async def test_client_certificate_inline_and_a_server_certificate_for_another_name(
    pki: Pki, tmp_path: Path
) -> None:
    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    async with serving(
        lambda r, w, i: echo(server, r, w), tls=pki.server_context(pki.named, client_ca=True)
    ) as server:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            cluster={
                "certificate-authority-data": data(pki.ca),
                "tls-server-name": "api.example.test",
            },
            user={
                "client-certificate-data": data(pki.client[0]),
                "client-key-data": data(pki.client[1]),
            },
        )
        async with await kube.Kube.connect(config) as api:
            assert (await api.get("/version"))["method"] == "GET"
    assert "authorization" not in headers_of(server.requests[0])


async def test_insecure_skip_tls_verify_and_basic_auth(pki: Pki, tmp_path: Path) -> None:
    async with serving(
        lambda r, w, i: echo(server, r, w), tls=pki.server_context(pki.named)
    ) as server:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            cluster={"insecure-skip-tls-verify": True},
            user={"username": "me", "password": "secret"},
        )
        async with await kube.Kube.connect(config) as api:
            await api.get("/version")
    expected = "Basic " + base64.b64encode(b"me:secret").decode()
    assert headers_of(server.requests[0])["authorization"] == expected


async def test_in_cluster_service_account_and_its_rotated_token(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(pki.ca.read_bytes())
    (account / "token").write_text("first\n")
    monkeypatch.setattr(auth, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    async with tls_echo(pki) as server:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        async with await kube.Kube.connect() as api:
            assert api.origin == kube.IN_CLUSTER
            await api.get("/version")
    assert headers_of(server.requests[0])["authorization"] == "Bearer first"


async def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("first")
    token = tokens.TokenFile(auth.Material("the token", path=path), clock=lambda: now[0])
    path.write_text("second")
    assert await token() == "Bearer first"
    now[0] = 60.0
    assert await token() == "Bearer second"
    path.unlink()  # the kubelet swaps it: the token read before stays in use
    now[0] = 120.0
    assert await token() == "Bearer second"


async def test_a_kubeconfig_user_with_an_exec_plugin_is_loaded_by_kubernetes_asyncio(
    pki: Pki, tmp_path: Path
) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
    }
    async with tls_echo(pki) as server:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            cluster={"certificate-authority": str(pki.ca)},
            user={"exec": plugin},
        )
        async with await kube.Kube.connect(config) as api:
            await api.get("/version")
    assert headers_of(server.requests[0])["authorization"] == "Bearer from-exec"


# ---- watching --------------------------------------------------------------------------------


async def test_watch_forever_relists_after_410_and_says_the_watch_broke() -> None:
    listing = {"kind": "List", "metadata": {"resourceVersion": "5"}, "items": []}
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}},
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader, server)
            if b"watch=true" not in request.split(b"\r\n")[0]:
                writer.write(answer(json.dumps(listing).encode()))
                continue
            writer.write(chunked_head())
            for event in events:
                writer.write(chunk(json.dumps(event).encode() + b"\n"))
            writer.write(LAST_CHUNK)

    breaks: list[str] = []
    time = FakeTime()
    async with (
        serving(handler) as server,
        kube.Kube(transport.Client(server.url()), timing=time.timing) as api,
    ):
        seen = []
        stream = api.watch_forever("/api/v1/pods", on_break=lambda: breaks.append("broke"))
        async for kind, obj in stream:
            seen.append((kind, obj["metadata"].get("name", "")))
            if len(seen) == 3:
                break
        await stream.aclose()
    assert seen == [("SYNC", ""), ("ADDED", "a"), ("SYNC", "")]
    assert breaks == ["broke"]
    assert time.slept == pytest.approx([1.2])  # the relist waited: 0.8 s, jitter drawn 0.5
    watch = server.requests[1].split(b"\r\n")[0].decode()
    assert "resourceVersion=5" in watch
    assert "allowWatchBookmarks=true" in watch


async def test_watch_forever_lists_in_pages_and_watches_from_the_last_pages_version() -> None:
    pages = {
        "": {"metadata": {"continue": "p2", "resourceVersion": "5"}, "items": [{"n": 1}]},
        "p2": {"metadata": {"continue": "p3", "resourceVersion": "5"}, "items": [{"n": 2}]},
        "p3": {"metadata": {"resourceVersion": "5"}, "items": [{"n": 3}]},
    }
    added = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            target = (await read_request(reader, server)).split(b"\r\n")[0].decode()
            if "watch=true" not in target:
                token = target.partition("continue=")[2].partition(" ")[0].partition("&")[0]
                writer.write(answer(json.dumps(pages[token]).encode()))
                continue
            writer.write(chunked_head())
            writer.write(chunk(json.dumps(added).encode() + b"\n"))

    async with (
        serving(handler) as server,
        kube.Kube(transport.Client(server.url())) as api,
    ):
        seen: list[tuple[str, Any]] = []
        stream = api.watch_forever("/api/v1/pods", page_size=1)
        async for kind, obj in stream:
            seen.append((kind, [i["n"] for i in obj["items"]] if "items" in obj else obj))
            if kind == "ADDED":
                break
        await stream.aclose()
    assert seen == [
        ("PAGE", [1]),
        ("PAGE", [2]),
        ("PAGE", [3]),
        ("SYNC", []),
        ("ADDED", added["object"]),
    ]
    lists = [r.split(b"\r\n")[0].decode() for r in server.requests[:3]]
    assert all("limit=1" in target for target in lists)
    assert ["continue=p2" in lists[1], "continue=p3" in lists[2]] == [True, True]
    assert "resourceVersion=5" in server.requests[3].split(b"\r\n")[0].decode()


# ---- no answer, in words ---------------------------------------------------------------------


async def unreachable(server_url: str, tmp_path: Path, **cluster: Any) -> str:
    config = write_kubeconfig(
        tmp_path / "kubeconfig", server_url, cluster=cluster, user={"token": "t"}
    )
    async with await kube.Kube.connect(config) as api:
        with pytest.raises(kube.Unreachable) as raised:
            await api.probe(answer_within=0.5)
    assert str(raised.value).startswith(
        f"the API server at {server_url} (kubeconfig {config}, context ctx) does not answer: "
    )
    return raised.value.reason


async def test_an_untrusted_certificate(pki: Pki, tmp_path: Path) -> None:
    async with tls_echo(pki) as server:
        reason = await unreachable(server.url("https"), tmp_path)
    assert reason.startswith("its TLS certificate is not trusted ([SSL: CERTIFICATE_VERIFY_FAILED]")
    assert reason.endswith("): check the cluster's certificate-authority in the kubeconfig")


async def test_a_tls_handshake_with_a_server_that_speaks_plain_http(tmp_path: Path) -> None:
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.read(1)  # the ClientHello: not HTTP, answered as a Go server answers it
        writer.write(answer(b"Client sent an HTTP request to an HTTPS server.", "400 Bad Request"))

    async with serving(plain) as server:
        reason = await unreachable(server.url("https"), tmp_path)
    assert reason.startswith("TLS handshake failed: ")


async def test_no_answer_in_time(tmp_path: Path) -> None:
    async with serving(lambda r, w, i: r.read()) as server:
        assert await unreachable(server.url(), tmp_path) == "no answer within 0.5 s"


async def test_a_refused_connection(tmp_path: Path) -> None:
    async with serving(lambda r, w, i: r.read()) as server:
        url = server.url()
    assert await unreachable(url, tmp_path) == "connection refused"


async def test_a_server_that_closes_the_connection(tmp_path: Path) -> None:
    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)

    async with serving(close) as server:
        assert await unreachable(server.url(), tmp_path) == "it closed the connection"


async def test_a_host_that_does_not_resolve(tmp_path: Path) -> None:
    reason = await unreachable("https://nowhere.invalid:6443", tmp_path)
    assert reason.startswith("cannot resolve nowhere.invalid: ")


async def test_a_server_that_is_not_ready_says_which_checks_failed(tmp_path: Path) -> None:
    async def not_ready(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        body = b"[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n"
        writer.write(answer(body, "500 Internal Server Error"))

    async with serving(not_ready) as server:
        reason = await unreachable(server.url(), tmp_path)
    assert reason == "it answered 500 (not ready): etcd failed: reason withheld"


# ---- kubeconfigs that cannot be used ---------------------------------------------------------


def config_error(config: Path | None) -> str:
    async def connect() -> None:
        await kube.Kube.connect(config)

    with pytest.raises(kube.ConfigError) as raised:
        asyncio.run(connect())
    return str(raised.value)


def test_a_client_certificate_file_that_does_not_exist(tmp_path: Path) -> None:
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        "https://127.0.0.1:6443",
        user={"client-certificate": "me.crt", "client-key": "me.key"},
    )
    assert config_error(config) == (
        f"kubeconfig {config} (from --kubeconfig) is not usable: "
        f"users[name=u].user.client-certificate in {config}: {tmp_path / 'me.crt'} does not exist"
    )


def test_ca_data_that_holds_no_certificate(tmp_path: Path) -> None:
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        "https://127.0.0.1:6443",
        cluster={"certificate-authority-data": base64.b64encode(b"hello").decode()},
        user={},
    )
    assert config_error(config).startswith(
        f"kubeconfig {config} (from --kubeconfig) is not usable: "
        f"clusters[name=c].cluster.certificate-authority-data in {config}: no CA certificate "
    )


def test_a_certificate_and_a_key_that_do_not_belong_together(pki: Pki, tmp_path: Path) -> None:
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        "https://127.0.0.1:6443",
        user={"client-certificate": str(pki.client[0]), "client-key": str(pki.server[1])},
    )
    assert "not a certificate and its key (" in config_error(config)


def test_in_a_pod_without_its_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (tmp_path / "ca.crt").write_text("")
    assert config_error(None) == (
        "in a pod (KUBERNETES_SERVICE_HOST is set) but its in-cluster service account is not "
        f"usable: the service account's token: {tmp_path / 'token'} does not exist: mount the "
        "service account token (automountServiceAccountToken), or pass a kubeconfig with "
        "--kubeconfig"
    )


# ---- contexts and namespaces (kubectl's --context and -n) -------------------------------------


def two_clusters(path: Path, first: str, second: str) -> Path:
    """Context ``ctx`` (current) on ``first``; context ``other`` on ``second`` with namespace
    ``team-a``."""
    config = json.loads(write_kubeconfig(path, first, user={"token": "t"}).read_text())
    config["clusters"].append({"name": "c2", "cluster": {"server": second}})
    config["contexts"].append(
        {"name": "other", "context": {"cluster": "c2", "user": "u", "namespace": "team-a"}}
    )
    path.write_text(json.dumps(config))
    return path


async def test_a_context_asked_for_is_the_one_used_with_its_namespace(tmp_path: Path) -> None:
    async with serving(lambda r, w, i: echo(server, r, w)) as server:
        config = two_clusters(tmp_path / "kubeconfig", "http://127.0.0.1:1", server.url())
        async with await kube.Kube.connect(config, context="other") as api:
            assert (api.server, api.namespace) == (server.url(), "team-a")
            assert api.origin == f"kubeconfig {config}, context other"
            assert (await api.get("/version"))["method"] == "GET"
        async with await kube.Kube.connect(config) as api:
            assert (api.server, api.namespace) == ("http://127.0.0.1:1", "default")


def test_a_context_that_no_file_has(tmp_path: Path) -> None:
    config = two_clusters(tmp_path / "kubeconfig", "https://a:6443", "https://b:6443")

    async def connect() -> None:
        await kube.Kube.connect(config, context="prod")

    with pytest.raises(kube.ConfigError) as raised:
        asyncio.run(connect())
    assert str(raised.value) == (
        f"kubeconfig {config} (from --kubeconfig) has no context prod: its contexts are ctx, "
        f"other (`kubectl config get-contexts --kubeconfig {config}`)"
    )


async def test_in_a_pod_the_namespace_is_the_pods_own(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.crt").write_bytes(pki.ca.read_bytes())
    (tmp_path / "token").write_text("t")
    (tmp_path / "namespace").write_text("dra-gpu\n")
    monkeypatch.setattr(auth, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    async with await kube.Kube.connect() as api:
        assert api.namespace == "dra-gpu"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    async with await kube.Kube.connect() as api:
        assert api.namespace == "from-env"
    with pytest.raises(kube.ConfigError, match=r"^context other was asked for, but there is no"):
        await kube.Kube.connect(context="other")

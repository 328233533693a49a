"""``kube.Kube`` through a real HTTP proxy on loopback (``servers.proxying``), as kubectl goes:
the cluster's ``proxy-url`` for every request, else ``HTTPS_PROXY`` unless ``NO_PROXY`` or a
loopback server says otherwise; TLS to the API server inside a ``CONNECT`` tunnel, through an
``http://`` or an ``https://`` proxy, with Basic proxy authentication from the URL; and the
words for a proxy that refuses or is not there."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from dra_gpu import kube
from tests.support.api_servers import Pki, proxying, serving
from tests.unit.kube.test_connect import echo, headers_of, tls_echo, write_kubeconfig

SECRET = "Basic " + base64.b64encode(b"me:s3cr@t").decode()
"""What ``http://me:s3cr%40t@...`` sends as ``Proxy-Authorization``."""


async def test_a_clusters_proxy_url_tunnels_tls_with_proxy_authorization(
    pki: Pki, tmp_path: Path
) -> None:
    async with tls_echo(pki) as server, proxying(authorization=SECRET) as proxy:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),  # loopback: a proxy-url applies to it all the same
            cluster={
                "certificate-authority": str(pki.ca),
                "proxy-url": proxy.url("http", "me:s3cr%40t"),
            },
            user={"token": "t0k3n"},
        )
        async with await kube.Kube.connect(config) as api:
            assert (await api.get("/version"))["target"] == "/version"
            assert (await api.get("/api"))["target"] == "/api"
    assert proxy.tunnels == [f"127.0.0.1:{server.port}"]  # one tunnel, kept alive
    assert headers_of(proxy.heads[0])["proxy-authorization"] == SECRET
    sent = headers_of(server.requests[0])
    assert sent["authorization"] == "Bearer t0k3n"
    assert "proxy-authorization" not in sent  # the proxy's credentials stay with the proxy


async def test_https_proxy_from_the_environment_unless_no_proxy_says_otherwise(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        serving(lambda r, w, i: echo(server, r, w), tls=pki.server_context(pki.named)) as server,
        proxying(hosts={"api.example.test": "127.0.0.1"}) as proxy,
    ):
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            f"https://api.example.test:{server.port}",  # a name only the proxy resolves
            cluster={"certificate-authority": str(pki.ca)},
            user={"token": "t"},
        )
        monkeypatch.setenv("https_proxy", proxy.url())
        monkeypatch.setenv("NO_PROXY", "10.0.0.0/8, other.test, .example.test:80")
        async with await kube.Kube.connect(config) as api:
            assert (await api.get("/version"))["method"] == "GET"
        assert proxy.tunnels == [f"api.example.test:{server.port}"]

        monkeypatch.setenv("NO_PROXY", "localhost, .example.test")
        async with await kube.Kube.connect(config) as api:
            with pytest.raises(kube.Unreachable) as raised:
                await api.probe(answer_within=2)
        assert raised.value.reason.startswith("cannot resolve api.example.test")  # direct
        assert "through the proxy" not in raised.value.reason
        assert len(proxy.tunnels) == 1


async def test_a_loopback_server_is_never_proxied_by_the_environment(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with tls_echo(pki) as server, proxying() as proxy:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            cluster={"certificate-authority": str(pki.ca)},
            user={"token": "t"},
        )
        monkeypatch.setenv("HTTPS_PROXY", proxy.url())
        async with await kube.Kube.connect(config) as api:
            await api.get("/version")
    assert (proxy.server.connections, server.connections) == (0, 1)


async def test_tls_inside_tls_through_an_https_proxy(pki: Pki, tmp_path: Path) -> None:
    async with (
        tls_echo(pki) as server,
        proxying(tls=pki.server_context(pki.server)) as proxy,
    ):
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            # the proxy's certificate is checked as the server's is (client-go's TLS config)
            cluster={"certificate-authority": str(pki.ca), "proxy-url": proxy.url("https")},
            user={"token": "t"},
        )
        async with await kube.Kube.connect(config) as api:
            assert (await api.get("/version"))["target"] == "/version"
    assert proxy.tunnels == [f"127.0.0.1:{server.port}"]


async def test_an_http_server_through_http_proxy_is_asked_in_absolute_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with proxying() as proxy:
        config = write_kubeconfig(
            tmp_path / "kubeconfig", "http://api.example.test:8080/prefix", user={}
        )
        monkeypatch.setenv("HTTP_PROXY", proxy.url("http", "me:s3cr%40t"))
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")  # for https:// only
        async with await kube.Kube.connect(config) as api:
            got = await api.get("/version", a="b")
    assert got == {
        "target": "http://api.example.test:8080/prefix/version?a=b",
        "proxy-authorization": SECRET,
    }
    assert proxy.tunnels == []


async def test_a_proxy_that_refuses_the_tunnel_or_is_not_there(pki: Pki, tmp_path: Path) -> None:
    async with tls_echo(pki) as server, proxying(authorization=SECRET) as proxy:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url("https"),
            cluster={
                "certificate-authority": str(pki.ca),
                "proxy-url": proxy.url("http", "me:wrong"),
            },
            user={"token": "t"},
        )
        async with await kube.Kube.connect(config) as api:
            with pytest.raises(kube.Unreachable) as raised:
                await api.probe(answer_within=2)
        port = proxy.server.port
    assert raised.value.reason == (
        f"the proxy http://127.0.0.1:{port} answered 407 Proxy Authentication Required to "
        f"CONNECT 127.0.0.1:{server.port}: check the user and password in its URL"
    )
    async with await kube.Kube.connect(config) as api:  # the proxy is gone now
        with pytest.raises(kube.Unreachable) as raised:
            await api.probe(answer_within=2)
    assert raised.value.reason == (
        f"connection refused (through the proxy http://127.0.0.1:{port} "
        f"(clusters[name=c].cluster.proxy-url in {config}))"
    )
    assert "wrong" not in str(raised.value)


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("proxy-url", "clusters[name=c].cluster.proxy-url in {config} is socks5://127.0.0.1:1080"),
        ("HTTPS_PROXY", "HTTPS_PROXY is socks5://127.0.0.1:1080"),
    ],
)
async def test_a_socks_proxy_is_refused_in_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, says: str
) -> None:
    socks = "socks5://127.0.0.1:1080"
    cluster = {"proxy-url": socks} if where == "proxy-url" else {}
    if where == "HTTPS_PROXY":
        monkeypatch.setenv("HTTPS_PROXY", socks)
    config = write_kubeconfig(
        tmp_path / "kubeconfig", "https://10.0.0.1:6443", cluster=cluster, user={}
    )
    with pytest.raises(kube.ConfigError) as raised:
        await kube.Kube.connect(config)
    assert str(raised.value) == (
        f"kubeconfig {config} (from --kubeconfig) is not usable: {says.format(config=config)}: "
        "dra-gpu goes through HTTP proxies only (http:// or https://, with CONNECT), not SOCKS; "
        "use an HTTP proxy, or run where the server is reachable"
    )

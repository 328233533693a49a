"""Which proxy a request goes through (``proxies``): Go's own table of
``golang.org/x/net/http/httpproxy`` (proxy_test.go: ``proxyForURLTests``, ``UseProxyTests``),
ported case by case, and the proxy URLs the transport refuses, in words."""

from __future__ import annotations

import pytest

from dra_gpu.kube import proxies
from dra_gpu.kube.proxies import Environment


@pytest.mark.parametrize(
    ("environment", "url", "want"),
    [
        (Environment(http_proxy="127.0.0.1:8080"), "", "http://127.0.0.1:8080"),
        (
            Environment(http_proxy="cache.corp.example.com:1234"),
            "",
            "http://cache.corp.example.com:1234",
        ),
        (Environment(http_proxy="cache.corp.example.com"), "", "http://cache.corp.example.com"),
        (Environment(http_proxy="localhost"), "", "http://localhost"),
        (
            Environment(http_proxy="https://cache.corp.example.com"),
            "",
            "https://cache.corp.example.com",
        ),
        (Environment(http_proxy="http://127.0.0.1:8080"), "", "http://127.0.0.1:8080"),
        (Environment(http_proxy="https://127.0.0.1:8080"), "", "https://127.0.0.1:8080"),
        (Environment(http_proxy="socks5://127.0.0.1"), "", "socks5://127.0.0.1"),
        (Environment(http_proxy="foo://host"), "", "foo://host"),
        (
            Environment(http_proxy="http.proxy.tld", https_proxy="secure.proxy.tld"),
            "http://insecure.tld/",
            "http://http.proxy.tld",
        ),
        (
            Environment(http_proxy="http.proxy.tld", https_proxy="secure.proxy.tld"),
            "https://secure.tld/",
            "http://secure.proxy.tld",
        ),
        (
            Environment(http_proxy="http.proxy.tld", https_proxy="https://secure.proxy.tld"),
            "https://secure.tld/",
            "https://secure.proxy.tld",
        ),
        (Environment(http_proxy="http.proxy.tld"), "https://secure.tld/", None),
        (Environment(http_proxy="http.proxy.tld"), "ftp://insecure.tld/", None),
        (
            Environment(https_proxy="https://secure.proxy.tld", cgi=True),
            "https://secure.tld/",
            "https://secure.proxy.tld",
        ),
        (Environment(), "", None),
        (Environment(no_proxy="example.com", http_proxy="proxy"), "http://example.com/", None),
        (
            Environment(no_proxy=".example.com", http_proxy="proxy"),
            "http://example.com/",
            "http://proxy",
        ),
        (
            Environment(no_proxy="ample.com", http_proxy="proxy"),
            "http://example.com/",
            "http://proxy",
        ),
        (Environment(no_proxy="example.com", http_proxy="proxy"), "http://foo.example.com/", None),
        (
            Environment(no_proxy=".foo.com", http_proxy="proxy"),
            "http://example.com/",
            "http://proxy",
        ),
        (Environment(no_proxy=".示例.com", http_proxy="proxy"), "http://www.示例.com", None),
        (Environment(no_proxy="xn--fsq092h.com", http_proxy="proxy"), "http://www.示例.com", None),
        (Environment(no_proxy="示例.com", http_proxy="proxy"), "http://www.xn--fsq092h.com", None),
        (
            Environment(no_proxy="example.com", http_proxy="proxy"),
            "http://[1000::%25.example.com]:123",
            "http://proxy",
        ),
    ],
)
def test_gos_proxy_for_url_table(environment: Environment, url: str, want: str | None) -> None:
    choice = environment.proxy_for(url or "http://example.com")
    assert (choice.url if choice else None) == want


def test_http_proxy_is_refused_under_cgi() -> None:
    with pytest.raises(proxies.CgiRefused, match="refusing to use HTTP_PROXY value in CGI"):
        Environment(http_proxy="http://10.1.2.3:8080", cgi=True).proxy_for("http://example.com")


NO_PROXY = (
    "foobar.com, .barbaz.net, *.wildcard.io, 192.168.1.1, 192.168.1.2:81, 192.168.1.3:80, "
    "10.0.0.0/30, 2001:db8::52:0:1, [2001:db8::52:0:2]:443, [2001:db8::52:0:3]:80, "
    "2002:db8:a::45/64"
)

USE_PROXY = [
    ("localhost", False),  # never proxied
    ("127.0.0.1", False),
    ("127.0.0.2", False),
    ("::1", False),
    ("::2", True),  # not a loopback address
    ("192.168.1.1", False),  # matches exact IPv4
    ("192.168.1.2", True),  # ports do not match
    ("192.168.1.3", False),  # matches exact IPv4:port
    ("192.168.1.4", True),
    ("10.0.0.2", False),  # matches IPv4/CIDR
    ("2001:db8::52:0:1", False),  # matches exact IPv6
    ("2001:db8::52:0:2", True),
    ("2001:db8::52:0:3", False),  # matches exact [IPv6]:port
    ("2002:db8:a::123", False),  # matches IPv6/CIDR
    ("fe80::424b:c8be:1643:a1b6", True),
    ("barbaz.net", True),  # does not match as .barbaz.net
    ("www.barbaz.net", False),
    ("foobar.com", False),
    ("www.foobar.com", False),  # foobar.com matches its subdomains
    ("foofoobar.com", True),
    ("baz.com", True),
    ("localhost.net", True),
    ("local.localhost", True),
    ("barbarbaz.net", True),
    ("wildcard.io", True),  # *.wildcard.io: subdomains only
    ("nested.wildcard.io", False),
    ("awildcard.io", True),
]


@pytest.mark.parametrize(("host", "proxied"), USE_PROXY)
def test_gos_use_proxy_table(host: str, proxied: bool) -> None:
    assert Environment(no_proxy=NO_PROXY).use_proxy(host, "80") is proxied


@pytest.mark.parametrize(("host", "proxied"), USE_PROXY)
def test_an_asterisk_proxies_nothing(host: str, proxied: bool) -> None:
    assert Environment(no_proxy="*").use_proxy(host, "80") is False


def test_a_malformed_entry_is_ignored() -> None:
    assert Environment(no_proxy=":1").use_proxy("example.com", "80") is True


def test_an_ip_host_is_matched_by_ip_entries_only_and_a_mapped_ipv4_is_its_ipv4() -> None:
    environment = Environment(no_proxy="10.0.0.1, 10.0.0.0.example")
    assert environment.use_proxy("::ffff:10.0.0.1", "443") is False
    assert environment.use_proxy("10.0.0.2", "443") is True


def test_upper_case_names_first_and_empty_values_unset() -> None:
    read = Environment.read(
        {
            "HTTPS_PROXY": "",
            "https_proxy": "lower:3128",
            "HTTP_PROXY": "upper:8080",
            "http_proxy": "lower:8080",
            "NO_PROXY": ".corp",
            "no_proxy": "ignored",
        }
    )
    assert read == Environment(
        http_proxy="upper:8080",
        https_proxy="lower:3128",
        no_proxy=".corp",
        sources=("HTTP_PROXY", "https_proxy"),
    )
    choice = read.proxy_for("https://api.example.test:6443")
    assert choice == proxies.Choice("http://lower:3128", "https_proxy")
    assert read.proxy_for("https://api.corp:6443") is None
    assert Environment.read({"REQUEST_METHOD": "GET"}).cgi


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("socks5://127.0.0.1:1080", "not SOCKS"),
        ("ftp://proxy", "unsupported scheme 'ftp', must be http or https"),
        ("proxy:3128", "unsupported scheme 'proxy', must be http or https"),
        ("http://", "the proxy's host is missing"),
        ("http://proxy:port", "not a URL"),
        ("socks5://me:secret@proxy", "not SOCKS"),
    ],
)
def test_proxy_urls_the_transport_cannot_use(url: str, says: str) -> None:
    with pytest.raises(proxies.Unsupported) as raised:
        proxies.check(url, "the proxy-url")
    assert str(raised.value).startswith(f"the proxy-url is {url.replace('secret', 'xxxxx')}")
    assert says in str(raised.value)
    assert "secret" not in str(raised.value)
    assert proxies.check("https://u:p@proxy:3128", "x") == "https://u:p@proxy:3128"

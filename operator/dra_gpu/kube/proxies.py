"""Which proxy a request to the API server goes through, as client-go decides it: pure logic.

Owns: ``Environment`` (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY`` and their lower-case twins,
read and matched as Go's ``net/http.ProxyFromEnvironment`` does: a port of
``golang.org/x/net/http/httpproxy``, whose rules are these) and ``check`` (a proxy URL the
transport can use: ``http://`` or ``https://``; ``socks5://`` is refused in words).

Go's rules, followed exactly:

- ``HTTPS_PROXY`` for an ``https://`` server, ``HTTP_PROXY`` for an ``http://`` one (never the
  other); the upper-case name first, an empty value counts as unset. A value without a scheme
  (``proxy:3128``) is ``http://``; one that does not parse is ignored.
- ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``) are never proxied.
- ``NO_PROXY`` is a comma-separated list, each entry trimmed and compared in lower case: ``*``
  (nothing is proxied), an IP (``10.0.0.1``, ``2001:db8::1``) or a CIDR (``10.0.0.0/8``) that
  matches IP hosts only, a domain (``example.com``: that name and its subdomains;
  ``.example.com`` or ``*.example.com``: its subdomains only) that matches names only; an IP or
  a domain may carry a port (``10.0.0.1:6443``, ``[2001:db8::1]:443``, ``example.com:443``),
  then only that port matches. Entries that parse as none of these are ignored.
- Under CGI (``REQUEST_METHOD`` set) ``HTTP_PROXY`` is refused, as Go refuses it.

A cluster's ``proxy-url`` in a kubeconfig is not this module's business beyond ``check``: it
applies to every request of that cluster, ``NO_PROXY`` and loopback included, as client-go's
``http.ProxyURL`` does.

Must not: read the environment itself (it is handed a mapping) or open anything.
"""

from __future__ import annotations

import dataclasses
import encodings.idna
import ipaddress
from collections.abc import Mapping
from urllib.parse import SplitResult, unquote, urlsplit

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_PORTS = {"http": "80", "https": "443", "socks5": "1080"}


class Unsupported(ValueError):
    """A proxy URL the transport cannot use (its message names the URL and why)."""


class CgiRefused(ValueError):
    """``HTTP_PROXY`` under CGI, where a request's ``Proxy:`` header sets it (httpoxy)."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """The proxy of one request: its URL and where it came from (``HTTPS_PROXY``)."""

    url: str
    source: str


@dataclasses.dataclass(frozen=True)
class Environment:
    """The proxy variables, as ``golang.org/x/net/http/httpproxy.Config``."""

    http_proxy: str = ""
    https_proxy: str = ""
    no_proxy: str = ""
    cgi: bool = False
    sources: tuple[str, str] = ("HTTP_PROXY", "HTTPS_PROXY")
    """The names the two proxies were read from, for messages."""

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Environment:
        """``FromEnvironment``: each upper-case name first, then the lower-case one."""

        def first(*names: str) -> tuple[str, str]:
            return next(((environ[n], n) for n in names if environ.get(n)), ("", names[0]))

        http, http_name = first("HTTP_PROXY", "http_proxy")
        https, https_name = first("HTTPS_PROXY", "https_proxy")
        return cls(
            http_proxy=http,
            https_proxy=https,
            no_proxy=first("NO_PROXY", "no_proxy")[0],
            cgi=bool(environ.get("REQUEST_METHOD")),
            sources=(http_name, https_name),
        )

    def proxy_for(self, url: str) -> Choice | None:
        """The proxy for a request to ``url``, or None to connect directly. Raises
        ``CgiRefused`` as Go does."""
        target = urlsplit(url)
        if target.scheme == "https":
            proxy, source = _parse_proxy(self.https_proxy), self.sources[1]
        elif target.scheme == "http":
            proxy, source = _parse_proxy(self.http_proxy), self.sources[0]
            if proxy is not None and self.cgi:
                raise CgiRefused(
                    "refusing to use HTTP_PROXY value in CGI environment; see "
                    "golang.org/s/cgihttpproxy"
                )
        else:
            return None
        if proxy is None or not self.use_proxy(*_canonical_addr(target)):
            return None
        return Choice(proxy.geturl(), source)

    def use_proxy(self, host: str, port: str) -> bool:
        """``useProxy``: whether ``host:port`` goes through the proxy under ``NO_PROXY``."""
        if host == "localhost":
            return False
        ip = _parse_addr(host)
        if ip is not None and ip.is_loopback:
            return False
        host = host.strip().lower()
        matchers = _matchers(self.no_proxy)
        if matchers is None:  # "*"
            return False
        ips, domains = matchers
        if ip is not None and any(m.match(host, port, ip) for m in ips):
            return False
        return not any(m.match(host, port, ip) for m in domains)


def check(url: str, what: str) -> str:
    """``url`` if the transport can go through it (an ``http://`` or ``https://`` proxy with a
    host); ``Unsupported`` in words otherwise. ``what`` names where it came from."""
    shown = redacted(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise Unsupported(f"{what} is {shown}: not a URL ({exc})") from None
    if parts.scheme in ("socks5", "socks5h"):
        raise Unsupported(
            f"{what} is {shown}: dra-gpu goes through HTTP proxies only (http:// or https://, "
            "with CONNECT), not SOCKS; use an HTTP proxy, or run where the server is reachable"
        )
    if parts.scheme not in ("http", "https"):
        raise Unsupported(
            f"{what} is {shown}: unsupported scheme {parts.scheme!r}, must be http or https"
        )
    if not parts.hostname:
        raise Unsupported(f"{what} is {shown}: the proxy's host is missing")
    return url


def redacted(url: str) -> str:
    """``url`` with its password as ``xxxxx``, as Go's ``URL.Redacted`` shows it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:xxxxx@{host}{slash}{path}"


# ---- the parts of Go's httpproxy --------------------------------------------------------------


def _parse_proxy(value: str) -> SplitResult | None:
    """``parseProxy``: a URL, or ``host[:port]`` taken as ``http://``; None when empty or not a
    URL (Go ignores such a value)."""
    if not value:
        return None
    try:
        parts = urlsplit(value)
        if not parts.scheme or not parts.netloc:
            parts = urlsplit("http://" + value)
        parts.port  # noqa: B018 - a bad port does not parse in Go either
    except ValueError:
        return None
    return parts


def _canonical_addr(url: SplitResult) -> tuple[str, str]:
    """``canonicalAddr``: the host (IDNA-encoded) and the port, the scheme's by default."""
    host = _idna(unquote(url.hostname or ""))
    try:
        port = str(url.port) if url.port is not None else _PORTS.get(url.scheme, "")
    except ValueError:
        port = ""
    return host, port


def _idna(name: str) -> str:
    """``idnaASCII``: a non-ASCII name as its ``xn--`` labels; unchanged if it cannot be."""
    if name.isascii():
        return name
    try:
        return ".".join(
            label if label.isascii() else encodings.idna.ToASCII(label).decode()
            for label in name.split(".")
        )
    except UnicodeError:
        return name


def _parse_addr(host: str) -> IP | None:
    """``netip.ParseAddr`` (a zone allowed), an IPv4-mapped IPv6 address as its IPv4 one."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return _unmapped(ip)


def _parse_ip(host: str) -> IP | None:
    """``net.ParseIP``: no zone."""
    return None if "%" in host else _parse_addr(host)


def _unmapped(ip: IP) -> IP:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _split_host_port(value: str) -> tuple[str, str] | None:
    """``net.SplitHostPort``: ``host:port`` or ``[host]:port`` (the port may be empty); None
    when it is neither."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or value[end + 1 : end + 2] != ":":
            return None
        host, port = value[1:end], value[end + 2 :]
        if "[" in host or ":" in port or "[" in port or "]" in port:
            return None
        return host, port
    host, colon, port = value.rpartition(":")
    if not colon or ":" in host or "[" in value or "]" in value:
        return None
    return host, port


@dataclasses.dataclass(frozen=True)
class _Cidr:
    network: ipaddress.IPv4Network | ipaddress.IPv6Network

    def match(self, host: str, port: str, ip: IP | None) -> bool:
        return ip is not None and ip.version == self.network.version and ip in self.network


@dataclasses.dataclass(frozen=True)
class _Ip:
    ip: IP
    port: str

    def match(self, host: str, port: str, ip: IP | None) -> bool:
        return ip is not None and _same(ip, self.ip) and self.port in ("", port)


@dataclasses.dataclass(frozen=True)
class _Domain:
    host: str
    """With a leading dot."""
    port: str
    match_host: bool
    """The entry had no leading dot: the name itself matches too."""

    def match(self, host: str, port: str, ip: IP | None) -> bool:
        if ip is not None:
            return False
        if host.endswith(self.host) or (self.match_host and host == self.host[1:]):
            return self.port in ("", port)
        return False


_Matcher = _Cidr | _Ip | _Domain


def _same(a: IP, b: IP) -> bool:
    """``net.IP.Equal``: the address, without its zone."""
    return a.version == b.version and int(a) == int(b)


def _matchers(no_proxy: str) -> tuple[list[_Matcher], list[_Matcher]] | None:
    """``config.init``: the IP and the domain matchers of ``NO_PROXY``; None for ``*``."""
    ips: list[_Matcher] = []
    domains: list[_Matcher] = []
    for entry in no_proxy.split(","):
        p = entry.strip().lower()
        if not p:
            continue
        if p == "*":
            return None
        if "/" in p:  # net.ParseCIDR: an address, a slash, a prefix length
            address, _, bits = p.partition("/")
            if bits.isdigit() and _parse_ip(address) is not None:
                try:
                    ips.append(_Cidr(ipaddress.ip_network(p, strict=False)))
                    continue
                except ValueError:
                    pass
        split = _split_host_port(p)
        if split is not None:
            phost, pport = split
            if not phost:
                continue  # malformed (":1"): ignored
        else:
            phost, pport = p, ""
        if (pip := _parse_ip(phost)) is not None:
            ips.append(_Ip(pip, pport))
            continue
        if not phost:
            continue
        if phost.startswith("*."):
            phost = phost[1:]
        match_host = not phost.startswith(".")
        if match_host:
            phost = "." + phost
        domains.append(_Domain(_idna(phost), pport, match_host))
    return ips, domains

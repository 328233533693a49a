"""Kubernetes' CEL URL library (``url()``, ``isURL()`` and the getters) on Go's ``net/url``.

``url(s)`` is valid when Go's ``url.ParseRequestURI`` accepts ``s``, and its parts are what
``url.Parse`` makes of it. Both are ported here from Go 1.26 (with the default GODEBUG of the
scheduler's build: strict colons in http(s) hosts, at most 10,000 query parameters), working
on UTF-8 bytes as Go does. Pure; no I/O.
"""

from __future__ import annotations

from typing import Final

from dra_gpu.cel._port.network import _parse_address
from dra_gpu.cel._port.values import CelError

__all__ = ["URL", "is_url", "parse_url"]

_PATH, _SEGMENT, _HOST, _ZONE, _USERINFO, _QUERY, _FRAGMENT = range(7)
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_ALNUM: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


class URLError(ValueError):
    pass


def _should_escape(c: int, mode: int) -> bool:
    """net/url shouldEscape (RFC 3986 with Go's exceptions)."""
    if c in _ALNUM:
        return False
    if mode in (_HOST, _ZONE) and chr(c) in "!$&'()*+,;=:[]<>\"":
        return False
    if chr(c) in "-_.~":
        return False
    if chr(c) in "$&+,/:;=?@":
        if mode == _PATH:
            return c == ord("?")
        if mode == _SEGMENT:
            return chr(c) in "/;,?"
        if mode == _USERINFO:
            return chr(c) in "@/?:"
        if mode == _QUERY:
            return True
        if mode == _FRAGMENT:
            return False
    return not (mode == _FRAGMENT and chr(c) in "!()*")


def _unhex(c: int) -> int:
    return int(chr(c), 16)


def _unescape(s: bytes, mode: int) -> bytes:
    n = 0
    has_plus = False
    i = 0
    while i < len(s):
        c = s[i]
        if c == ord("%"):
            n += 1
            if i + 2 >= len(s) or s[i + 1] not in _HEX or s[i + 2] not in _HEX:
                raise URLError(f"invalid URL escape {s[i : i + 3]!r}")
            if mode == _HOST and _unhex(s[i + 1]) < 8 and s[i : i + 3] != b"%25":
                raise URLError(f"invalid URL escape {s[i : i + 3]!r}")
            if mode == _ZONE:
                v = _unhex(s[i + 1]) << 4 | _unhex(s[i + 2])
                if s[i : i + 3] != b"%25" and v != 0x20 and _should_escape(v, _HOST):
                    raise URLError(f"invalid URL escape {s[i : i + 3]!r}")
            i += 3
        elif c == ord("+"):
            has_plus = mode == _QUERY
            i += 1
        else:
            if mode in (_HOST, _ZONE) and c < 0x80 and _should_escape(c, mode):
                raise URLError(f"invalid character {chr(c)!r} in host name")
            i += 1
    if n == 0 and not has_plus:
        return s
    out = bytearray()
    i = 0
    while i < len(s):
        c = s[i]
        if c == ord("%"):
            out.append(_unhex(s[i + 1]) << 4 | _unhex(s[i + 2]))
            i += 3
            continue
        if c == ord("+"):
            out.append(0x20 if mode == _QUERY else ord("+"))
        else:
            out.append(c)
        i += 1
    return bytes(out)


def _escape(s: bytes, mode: int) -> bytes:
    out = bytearray()
    for c in s:
        if c == 0x20 and mode == _QUERY:
            out.append(ord("+"))
        elif _should_escape(c, mode):
            out += b"%%%02X" % c
        else:
            out.append(c)
    return bytes(out)


def _valid_encoded(s: bytes, mode: int) -> bool:
    for c in s:
        if chr(c) in "!$&'()*,;=:@[]%+":
            continue
        if _should_escape(c, mode):
            return False
    return True


def _valid_optional_port(port: bytes) -> bool:
    if not port:
        return True
    if port[:1] != b":":
        return False
    return all(0x30 <= b <= 0x39 for b in port[1:])


def _valid_userinfo(s: bytes) -> bool:
    text = s.decode("utf-8", "surrogateescape")
    return all(c.isascii() and (c.isalnum() or c in "-._:~!$&'()*+,;=%@") for c in text)


class URL:
    """A parsed URL (the parts the CEL getters read)."""

    __slots__ = ("force_query", "host", "opaque", "path", "raw_path", "raw_query", "scheme")
    cel_type_name: Final = "kubernetes.URL"

    def __init__(self) -> None:
        self.scheme = b""
        self.opaque = b""
        self.host = b""
        self.path = b""
        self.raw_path = b""
        self.raw_query = b""
        self.force_query = False

    def cel_equal(self, other: object) -> bool:
        if not isinstance(other, URL):
            raise CelError("no such overload")
        return self.string() == other.string()

    def string(self) -> bytes:
        # url.URL.String() for the parts kept here (no user info or fragment: Equal compares
        # the text of both sides, which come from the same kind of parse).
        out = bytearray()
        if self.scheme:
            out += self.scheme + b":"
        if self.opaque:
            out += self.opaque
        else:
            if self.scheme or self.host:
                if self.host or self.path or self.scheme:
                    out += b"//"
                out += self.host
            path = self.escaped_path()
            if path and path[:1] != b"/" and self.host:
                out += b"/"
            out += path
        if self.force_query or self.raw_query:
            out += b"?" + self.raw_query
        return bytes(out)

    def escaped_path(self) -> bytes:
        if self.raw_path and _valid_encoded(self.raw_path, _PATH):
            try:
                if _unescape(self.raw_path, _PATH) == self.path:
                    return self.raw_path
            except URLError:
                pass
        if self.path == b"*":
            return b"*"
        return _escape(self.path, _PATH)

    def hostname(self) -> bytes:
        return _split_host_port(self.host)[0]

    def port(self) -> bytes:
        return _split_host_port(self.host)[1]

    def query(self) -> dict[bytes, list[bytes]]:
        values: dict[bytes, list[bytes]] = {}
        query = self.raw_query
        if query.count(b"&") + 1 > 10_000:
            return values
        while query:
            key, _, query = query.partition(b"&")
            if b";" in key or not key:
                continue
            key, _, value = key.partition(b"=")
            try:
                key = _unescape(key, _QUERY)
                value = _unescape(value, _QUERY)
            except URLError:
                continue
            values.setdefault(key, []).append(value)
        return values


def _split_host_port(host_port: bytes) -> tuple[bytes, bytes]:
    host, port = host_port, b""
    colon = host.rfind(b":")
    if colon != -1 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith(b"[") and host.endswith(b"]"):
        host = host[1:-1]
    return host, port


def _get_scheme(raw: bytes) -> tuple[bytes, bytes]:
    for i, c in enumerate(raw):
        if 0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A:
            continue
        if 0x30 <= c <= 0x39 or chr(c) in "+-.":
            if i == 0:
                return b"", raw
            continue
        if c == ord(":"):
            if i == 0:
                raise URLError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return b"", raw
    return b"", raw


def _parse_host(scheme: bytes, host: bytes) -> bytes:
    open_bracket = host.rfind(b"[")
    if open_bracket > 0:
        raise URLError("invalid IP-literal")
    if open_bracket == 0:
        close_bracket = host.rfind(b"]")
        if close_bracket < 0:
            raise URLError("missing ']' in host")
        colon_port = host[close_bracket + 1 :]
        if not _valid_optional_port(colon_port):
            raise URLError(f"invalid port {colon_port!r} after host")
        unescaped_port = _unescape(colon_port, _HOST)
        hostname = host[1:close_bracket]
        zone = hostname.find(b"%25")
        if zone >= 0:
            unescaped = _unescape(hostname[:zone], _HOST) + _unescape(hostname[zone:], _ZONE)
        else:
            unescaped = _unescape(hostname, _HOST)
        text = unescaped.decode("utf-8", "surrogateescape")
        address_text, percent, zone_name = text.partition("%")
        try:
            if percent and not zone_name:
                raise ValueError("zone must be a non-empty string")
            address = _parse_address(address_text)
        except ValueError as error:
            raise URLError(f"invalid host: {error}") from None
        if address.version == 4:
            raise URLError("invalid IP-literal")
        return b"[" + unescaped + b"]" + unescaped_port
    i = host.find(b":")
    if i != -1:
        last = host.rfind(b":")
        if last != i and scheme not in (b"http", b"https"):
            i = last
        colon_port = host[i:]
        if not _valid_optional_port(colon_port):
            raise URLError(f"invalid port {colon_port!r} after host")
    return _unescape(host, _HOST)


def _parse(raw: bytes, via_request: bool) -> URL:
    if any(b < 0x20 or b == 0x7F for b in raw):
        raise URLError("net/url: invalid control character in URL")
    if not raw and via_request:
        raise URLError("empty url")
    url = URL()
    if raw == b"*":
        url.path = b"*"
        return url
    scheme, rest = _get_scheme(raw)
    url.scheme = scheme.lower()
    if rest.endswith(b"?") and rest.count(b"?") == 1:
        url.force_query = True
        rest = rest[:-1]
    else:
        rest, _, url.raw_query = rest.partition(b"?")
    if not rest.startswith(b"/"):
        if url.scheme:
            url.opaque = rest
            return url
        if via_request:
            raise URLError("invalid URI for request")
        segment = rest.partition(b"/")[0]
        if b":" in segment:
            raise URLError("first path segment in URL cannot contain colon")
    if (url.scheme or (not via_request and not rest.startswith(b"///"))) and rest.startswith(b"//"):
        authority, rest = rest[2:], b""
        slash = authority.find(b"/")
        if slash >= 0:
            authority, rest = authority[:slash], authority[slash:]
        at = authority.rfind(b"@")
        url.host = _parse_host(url.scheme, authority if at < 0 else authority[at + 1 :])
        if at >= 0:
            userinfo = authority[:at]
            if not _valid_userinfo(userinfo):
                raise URLError("net/url: invalid userinfo")
            for part in userinfo.split(b":", 1):
                _unescape(part, _USERINFO)
    path = _unescape(rest, _PATH)
    url.path = path
    url.raw_path = b"" if _escape(path, _PATH) == rest else rest
    return url


def parse_url(text: str) -> URL:
    """Kubernetes' ``url()``: ParseRequestURI must accept it, then Parse gives the parts."""
    raw = text.encode()
    try:
        _parse(raw, via_request=True)
        without_fragment = raw.partition(b"#")[0]
        url = _parse(without_fragment, via_request=False)
        if b"#" in raw:
            _unescape(raw.partition(b"#")[2], _FRAGMENT)
    except URLError as error:
        raise CelError(
            f"URL parse error during conversion from string: parse {text!r}: {error}"
        ) from None
    return url


def is_url(text: str) -> bool:
    try:
        _parse(text.encode(), via_request=True)
    except URLError:
        return False
    return True


def text(value: bytes) -> str:
    return value.decode("utf-8", "replace")

"""Kubernetes' CEL URL library (``library/urls.go``): ``url()``, ``isURL()``, ``getScheme``,
``getHost``, ``getHostname``, ``getPort``, ``getEscapedPath``, ``getQuery``.

Owns: ``IMPLEMENTATIONS`` of the URL overloads.
Must not: parse URLs itself (``dra_gpu.cel._port.urls`` ports Go's net/url).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import urls

__all__ = ["IMPLEMENTATIONS"]

IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "string_to_url": urls.parse_url,
    "is_url_string": urls.is_url,
    "url_get_scheme": lambda u: urls.text(u.scheme),
    "url_get_host": lambda u: urls.text(u.host),
    "url_get_hostname": lambda u: urls.text(u.hostname()),
    "url_get_port": lambda u: urls.text(u.port()),
    "url_get_escaped_path": lambda u: urls.text(u.escaped_path()),
    "url_get_query": lambda u: {
        urls.text(k): [urls.text(v) for v in vs] for k, vs in u.query().items()
    },
}

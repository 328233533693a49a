"""Kubernetes' CEL IP library (``library/ip.go``): ``ip()``, ``isIP()``, ``ip.isCanonical()``,
``string``, ``family``, and netip's predicates (``isLoopback`` ...).

Owns: ``IMPLEMENTATIONS`` of the IP overloads.
Must not: parse or print addresses itself (``dra_gpu.cel._port.network`` ports Go's netip).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import network

__all__ = ["IMPLEMENTATIONS"]

IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "string_to_ip": network.parse_ip,
    "ip_to_string": lambda ip: ip.string(),
    "is_ip": network.is_ip,
    "ip_is_canonical": network.is_canonical,
    "ip_family": lambda ip: ip.family(),
    "ip_is_unspecified": lambda ip: ip.is_unspecified(),
    "ip_is_loopback": lambda ip: ip.is_loopback(),
    "ip_is_link_local_multicast": lambda ip: ip.is_link_local_multicast(),
    "ip_is_link_local_unicast": lambda ip: ip.is_link_local_unicast(),
    "ip_is_global_unicast": lambda ip: ip.is_global_unicast(),
}

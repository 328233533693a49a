"""Kubernetes' CEL CIDR library (``library/cidr.go``): ``cidr()``, ``isCIDR()``, ``string``,
``ip``, ``masked``, ``prefixLength``, ``containsIP``, ``containsCIDR``.

Owns: ``IMPLEMENTATIONS`` of the CIDR overloads.
Must not: parse or print prefixes itself (``dra_gpu.cel._port.network`` ports Go's netip).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import network

__all__ = ["IMPLEMENTATIONS"]

IMPLEMENTATIONS: Final[dict[str, Callable[..., Any]]] = {
    "string_to_cidr": network.parse_cidr,
    "cidr_to_string": lambda c: c.string(),
    "is_cidr": network.is_cidr,
    "cidr_ip": lambda c: c.ip(),
    "cidr_masked": lambda c: c.masked(),
    "cidr_prefix_length": lambda c: c.bits,
    "cidr_contains_ip_string": network.contains_ip,
    "cidr_contains_ip_ip": network.contains_ip,
    "cidr_contains_cidr_string": network.contains_cidr,
    "cidr_contains_cidr": network.contains_cidr,
}

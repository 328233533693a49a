"""The API's naming rules, and the natural order of names.

What a name may be (``IsDNS1123Label``, ``IsDNS1123Subdomain``, ``IsQualifiedName`` as the
``resource.k8s.io`` validation uses them for attribute and capacity keys, ``IsValidLabelValue``)
and how names sort for people ("gpu-2" before "gpu-10"). Pure: no I/O.
"""

from __future__ import annotations

import functools
import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) is not None


def is_qualified_name(name: str) -> bool:
    """An attribute or capacity key: ``memory`` or ``<DNS subdomain <= 63>/<C identifier>``."""
    domain, slash, ident = name.rpartition("/")
    if slash and not (len(domain) <= 63 and is_dns_subdomain(domain)):
        return False
    return len(ident) <= 32 and _C_IDENTIFIER.fullmatch(ident) is not None


def is_label_value(value: str) -> bool:
    """A non-empty label value (the API also takes the empty one; callers that need it say so)."""
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


@functools.lru_cache(maxsize=65536)
def natural(text: str) -> tuple[str | int, ...]:
    """A sort key that puts "gpu-2" before "gpu-10". re.split alternates text and digits, so
    positions never mix types."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", text)))

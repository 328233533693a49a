"""Kubernetes' CEL IP and CIDR libraries: ``ip()``, ``cidr()`` and their methods.

Addresses are parsed as Go's ``net/netip`` parses them (no leading zeros in IPv4 fields, no
netmask notation, no leading zeros in a prefix length) and then as Kubernetes restricts them
(no zones, no IPv4-mapped IPv6); the predicates are netip's definitions (``isGlobalUnicast`` is
true for private addresses too), and text is netip's ``String()`` (RFC 5952). Python's
``ipaddress`` holds the values.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Final

from dra_gpu.cel._port.values import CelError

__all__ = ["CIDR", "IP", "is_canonical", "parse_cidr", "parse_ip"]

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPV4: Final = re.compile(r"(0|[1-9][0-9]{0,2})(\.(0|[1-9][0-9]{0,2})){3}")
_BITS: Final = re.compile(r"0|[1-9][0-9]*")


class IP:
    """A ``net.IP`` value."""

    __slots__ = ("address",)
    cel_type_name: Final = "net.IP"

    def __init__(self, address: _Address) -> None:
        self.address = address

    def cel_equal(self, other: object) -> bool:
        if not isinstance(other, IP):
            raise CelError("no such overload")
        return self.address == other.address

    def string(self) -> str:
        return str(self.address)

    def family(self) -> int:
        return self.address.version

    def is_unspecified(self) -> bool:
        return int(self.address) == 0

    def is_loopback(self) -> bool:
        if self.address.version == 4:
            return self.address in ipaddress.IPv4Network("127.0.0.0/8")
        return int(self.address) == 1

    def is_link_local_multicast(self) -> bool:
        if self.address.version == 4:
            return self.address in ipaddress.IPv4Network("224.0.0.0/24")
        return (int(self.address) >> 112) & 0xFF0F == 0xFF02

    def is_link_local_unicast(self) -> bool:
        if self.address.version == 4:
            return self.address in ipaddress.IPv4Network("169.254.0.0/16")
        return (int(self.address) >> 118) == 0xFE80 >> 6

    def is_multicast(self) -> bool:
        if self.address.version == 4:
            return self.address in ipaddress.IPv4Network("224.0.0.0/4")
        return (int(self.address) >> 120) == 0xFF

    def is_global_unicast(self) -> bool:
        if self.address.version == 4 and int(self.address) == 0xFFFFFFFF:
            return False  # the limited broadcast address
        return not (
            self.is_unspecified()
            or self.is_loopback()
            or self.is_multicast()
            or self.is_link_local_unicast()
        )


class CIDR:
    """A ``net.CIDR`` value: an address and a prefix length (the address kept unmasked)."""

    __slots__ = ("address", "bits")
    cel_type_name: Final = "net.CIDR"

    def __init__(self, address: _Address, bits: int) -> None:
        self.address = address
        self.bits = bits

    def cel_equal(self, other: object) -> bool:
        if not isinstance(other, CIDR):
            raise CelError("no such overload")
        return self.address == other.address and self.bits == other.bits

    def string(self) -> str:
        return f"{self.address}/{self.bits}"

    def _network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(f"{self.address}/{self.bits}", strict=False)

    def contains_ip(self, ip: IP) -> bool:
        if ip.address.version != self.address.version:
            return False
        return ip.address in self._network()

    def contains_cidr(self, other: CIDR) -> bool:
        if other.address.version != self.address.version:
            return False
        return self.bits <= other.bits and other._network().subnet_of(self._network())  # type: ignore[arg-type]

    def masked(self) -> CIDR:
        return CIDR(self._network().network_address, self.bits)

    def ip(self) -> IP:
        return IP(self.address)


def _parse_address(text: str) -> _Address:
    """netip.ParseAddr, without zones (Kubernetes rejects those anyway)."""
    if "%" in text:
        raise ValueError(f"IP address {text!r} with zone value is not allowed")
    if ":" not in text:
        if not _IPV4.fullmatch(text):
            raise ValueError(f"ParseAddr({text!r}): unable to parse IP")
        address: _Address = ipaddress.IPv4Address(text)
        return address
    if not text.isascii():
        raise ValueError(f"ParseAddr({text!r}): unexpected character")
    try:
        return ipaddress.IPv6Address(text)
    except ValueError as error:
        raise ValueError(f"ParseAddr({text!r}): {error}") from None


def parse_ip(text: str) -> IP:
    """Kubernetes' parseIPAddr; CelError as upstream fails."""
    try:
        address = _parse_address(text)
    except ValueError as error:
        raise CelError(
            f"IP Address {text!r} parse error during conversion from string: {error}"
        ) from None
    return IP(_not_ipv4_mapped(address, text))


def parse_cidr(text: str) -> CIDR:
    """Kubernetes' parseCIDR (netip.ParsePrefix); CelError as upstream fails."""
    address_text, slash, bits_text = text.rpartition("/")
    try:
        if not slash:
            raise ValueError(f"netip.ParsePrefix({text!r}): no '/'")
        if not _BITS.fullmatch(bits_text):
            raise ValueError(f"netip.ParsePrefix({text!r}): bad bits after slash")
        address = _parse_address(address_text)
        bits = int(bits_text)
        if bits > address.max_prefixlen:
            raise ValueError(f"netip.ParsePrefix({text!r}): prefix length out of range")
    except ValueError as error:
        raise CelError(
            f"network address parse error during conversion from string: {error}"
        ) from None
    return CIDR(_not_ipv4_mapped(address, text), bits)


def _not_ipv4_mapped(address: _Address, text: str) -> _Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise CelError(f"IPv4-mapped IPv6 address {text!r} is not allowed")
    return address


def is_canonical(text: str) -> bool:
    return parse_ip(text).string() == text


def is_ip(text: str) -> bool:
    try:
        parse_ip(text)
    except CelError:
        return False
    return True


def is_cidr(text: str) -> bool:
    try:
        parse_cidr(text)
    except CelError:
        return False
    return True


def contains_ip(cidr: CIDR, other: Any) -> bool:
    return cidr.contains_ip(parse_ip(other) if type(other) is str else other)


def contains_cidr(cidr: CIDR, other: Any) -> bool:
    return cidr.contains_cidr(parse_cidr(other) if type(other) is str else other)

"""Address classes for the address guard (DNS-rebinding and metadata defence).

``classify_address`` says whether an address is public or which non-public class it
is in. IPv6 forms that embed an IPv4 address (mapped ::ffff:0:0/96, NAT64
64:ff9b::/96, 6to4 2002::/16, Teredo 2001::/32) are classified by the address they
embed, so ``64:ff9b::a9fe:a9fe`` is the metadata service, not "public IPv6".

Ranges: IANA IPv4/IPv6 Special-Purpose Address Registries (RFC 6890 and updates).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from netaddr import IPAddress, IPSet

__all__ = ["AddressClass", "AddressInfo", "classify_address"]


class AddressClass(StrEnum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    UNSPECIFIED = "unspecified"
    METADATA = "metadata"  # cloud instance metadata services
    LINK_LOCAL = "link-local"
    PRIVATE = "private"  # RFC 1918 (and deprecated IPv6 site-local)
    CGNAT = "cgnat"  # 100.64.0.0/10, RFC 6598
    ULA = "ula"  # fc00::/7, RFC 4193
    MULTICAST = "multicast"
    RESERVED = "reserved"  # documentation, benchmarking, future use, broadcast, ...


@dataclass(frozen=True, slots=True)
class AddressInfo:
    address: str  # canonical text (mapped IPv6 folded to IPv4)
    klass: AddressClass
    via: str | None = None  # "nat64", "6to4", "teredo" when the class comes from an embedded IPv4

    @property
    def public(self) -> bool:
        return self.klass is AddressClass.PUBLIC

    def describe(self) -> str:
        """``"127.0.0.1 (loopback)"``, ``"64:ff9b::a9fe:a9fe (metadata, embedded via nat64)"``."""
        embedded = f", embedded via {self.via}" if self.via else ""
        return f"{self.address} ({self.klass.value}{embedded})"


# Most specific first: the first set containing the address names its class.
_CLASSES: tuple[tuple[AddressClass, IPSet], ...] = (
    (
        AddressClass.METADATA,
        IPSet(
            ["169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32", "fd00:ec2::254/128"]
        ),
    ),
    (AddressClass.UNSPECIFIED, IPSet(["0.0.0.0/32", "::/128"])),
    (AddressClass.LOOPBACK, IPSet(["127.0.0.0/8", "::1/128"])),
    (AddressClass.LINK_LOCAL, IPSet(["169.254.0.0/16", "fe80::/10"])),
    (AddressClass.PRIVATE, IPSet(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fec0::/10"])),
    (AddressClass.CGNAT, IPSet(["100.64.0.0/10"])),
    (AddressClass.ULA, IPSet(["fc00::/7"])),
    (AddressClass.MULTICAST, IPSet(["224.0.0.0/4", "ff00::/8"])),
    (
        AddressClass.RESERVED,
        IPSet(
            [
                "0.0.0.0/8",  # "this network"
                "192.0.0.0/24",  # IETF protocol assignments
                "192.0.2.0/24",  # TEST-NET-1
                "192.88.99.0/24",  # deprecated 6to4 relay anycast
                "198.18.0.0/15",  # benchmarking
                "198.51.100.0/24",  # TEST-NET-2
                "203.0.113.0/24",  # TEST-NET-3
                "240.0.0.0/4",  # future use, includes 255.255.255.255
                "100::/64",  # discard-only
                "2001:db8::/32",  # documentation
                "2001:10::/28",  # ORCHID
                "2001:20::/28",  # ORCHIDv2
                "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215)
                "3fff::/20",  # documentation (RFC 9637)
                "5f00::/16",  # SRv6 SIDs
            ]
        ),
    ),
)

_GLOBAL_UNICAST_V6 = IPSet(["2000::/3"])
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")


def classify_address(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> AddressInfo:
    """Class of one address (text in any canonical IP form, or an ipaddress object)."""
    return _classify(str(address))


@lru_cache(maxsize=4096)
def _classify(text: str) -> AddressInfo:
    addr = ipaddress.ip_address(text)
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        else:
            embedded_all = _embedded_ipv4(addr)
            for via, embedded in embedded_all:
                inner = _class_of(embedded)
                if inner is not AddressClass.PUBLIC:
                    return AddressInfo(str(addr), inner, via)
            if addr in _NAT64:
                return AddressInfo(str(addr), AddressClass.PUBLIC)  # translates to a public IPv4
    return AddressInfo(str(addr), _class_of(addr))


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    value = int(addr)
    if addr in _NAT64:
        return [("nat64", ipaddress.IPv4Address(value & 0xFFFFFFFF))]
    if addr in _SIX_TO_FOUR:
        return [("6to4", ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF))]
    if addr in _TEREDO:
        server = ipaddress.IPv4Address((value >> 64) & 0xFFFFFFFF)
        client = ipaddress.IPv4Address(~value & 0xFFFFFFFF)  # RFC 4380: stored inverted
        return [("teredo", client), ("teredo", server)]
    return []


def _class_of(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> AddressClass:
    nat = IPAddress(int(addr), addr.version)
    for klass, members in _CLASSES:
        if nat in members:
            return klass
    if addr.version == 6 and nat not in _GLOBAL_UNICAST_V6:
        return AddressClass.RESERVED  # outside 2000::/3 nothing is routable unicast
    return AddressClass.PUBLIC

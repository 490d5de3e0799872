"""Destination canonicalisation: one spelling per host, so a rule and every spelling
of the same destination agree.

Contract (DESIGN.md "Policy"): lowercase; strip ONE trailing dot; IDN labels to
punycode; ``[v6]`` brackets removed; every IPv4 spelling folded to the dotted quad
(``2852039166``, ``0xA9FEA9FE``, ``0251.0376.0251.0376``, ``169.254.43518``,
``127.1``) with the inet_aton(3) rules that resolvers and browsers use (WHATWG URL
"IPv4 parser": a name whose last label is numeric IS an address, or it is invalid);
IPv4-mapped and IPv4-compatible IPv6 folded to IPv4. What is not a host at all
(NUL, CR/LF, spaces, ``%zone``, empty labels, a label over 63 or a name over 253
octets) raises HostInvalid with the reason.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache

from policy.errors import HostInvalid

__all__ = [
    "canonicalize_host",
    "fold_ipv6",
    "ip_value",
    "is_ip",
    "parse_ipv4_spelling",
    "split_host_port",
]

MAX_NAME = 253
MAX_LABEL = 63

# A host that is already canonical: lowercase LDH(+underscore) labels, no trailing dot.
_PLAIN = re.compile(
    r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
)
_LABEL_CHARS = re.compile(r"[a-z0-9_-]+")
_V6_CHARS = re.compile(r"[0-9a-f:.]+")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")


def is_ip(canonical: str) -> bool:
    """Whether a canonical host (output of canonicalize_host) is an IP literal."""
    return ip_value(canonical) is not None


@lru_cache(maxsize=8192)
def ip_value(canonical: str) -> tuple[int, int] | None:
    """``(version, integer)`` of a canonical IP literal, None for a name. A canonical
    name never ends in a digit-only label (that would have made it an address)."""
    if ":" not in canonical and not canonical[-1:].isdigit():
        return None
    try:
        addr = ipaddress.ip_address(canonical)
    except ValueError:
        return None
    return addr.version, int(addr)


def canonicalize_host(raw: str) -> str:
    """The canonical spelling of ``raw`` or HostInvalid. Pure and cached."""
    if not isinstance(raw, str):
        raise HostInvalid(repr(raw), "a host must be text")
    return _canonicalize(raw)


@lru_cache(maxsize=8192)
def _canonicalize(raw: str) -> str:
    host = raw
    if not host:
        raise HostInvalid(raw, "empty host")
    bad = _first_forbidden_char(host)
    if bad is not None:
        raise HostInvalid(raw, bad)
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")):
            raise HostInvalid(raw, "unbalanced brackets; write [2001:db8::1]")
        inner = host[1:-1]
        if ":" not in inner:
            raise HostInvalid(raw, "brackets are only for IPv6 addresses")
        return _canonical_v6(raw, inner)
    if ":" in host:
        return _canonical_v6(raw, host)
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise HostInvalid(raw, "empty host")
    if not host.isascii():
        host = _to_punycode(raw, host)
    if _PLAIN.fullmatch(host) is None:
        _explain_bad_name(raw, host)
    if len(host) > MAX_NAME:
        raise HostInvalid(raw, f"name is {len(host)} octets, over the {MAX_NAME} limit")
    last = host.rsplit(".", 1)[-1]
    if _NUMERIC_LABEL.fullmatch(last):
        v4 = parse_ipv4_spelling(host)
        if v4 is None:
            raise HostInvalid(raw, "ends in a number but is not a valid IPv4 address")
        return v4
    return host


def _first_forbidden_char(host: str) -> str | None:
    for ch in host:
        if ch == "\x00":
            return "contains a NUL byte"
        if ch in "\r\n":
            return "contains CR/LF"
        if ch.isspace():
            return "contains whitespace"
        if ch == "%":
            return "contains '%' (IPv6 zone ids and percent-encoding are not hosts)"
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return "contains a control character"
        if ch in "/\\@?#,;\"'<>`{}|^*!&=+$()~":
            return f"contains {ch!r}, which is not allowed in a host"
    return None


def _explain_bad_name(raw: str, host: str) -> None:
    labels = host.split(".")
    for label in labels:
        if not label:
            raise HostInvalid(raw, "empty label (two dots in a row, or a leading dot)")
        if len(label) > MAX_LABEL:
            raise HostInvalid(raw, f"label of {len(label)} octets, over the {MAX_LABEL} limit")
        if _LABEL_CHARS.fullmatch(label) is None:
            raise HostInvalid(raw, f"label {label!r} has characters a host name cannot have")
        if label.startswith("-") or label.endswith("-"):
            raise HostInvalid(raw, f"label {label!r} starts or ends with a hyphen")
    raise HostInvalid(raw, "not a host name")  # pragma: no cover - the loop finds the cause


def _to_punycode(raw: str, host: str) -> str:
    out = []
    for label in host.split("."):
        if label.isascii():
            out.append(label)
            continue
        try:
            out.append(label.encode("idna").decode("ascii"))
        except UnicodeError as exc:
            raise HostInvalid(
                raw, f"label {label!r} is not a valid internationalised name"
            ) from exc
    return ".".join(out).lower()


def _canonical_v6(raw: str, text: str) -> str:
    text = text.lower()
    if _V6_CHARS.fullmatch(text) is None:
        raise HostInvalid(raw, "not a valid IPv6 address")
    try:
        addr = ipaddress.IPv6Address(text)
    except ValueError as exc:
        raise HostInvalid(raw, "not a valid IPv6 address") from exc
    folded = fold_ipv6(addr)
    return str(folded)


def fold_ipv6(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d) addresses are IPv4."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    as_int = int(addr)
    # ::a.b.c.d (deprecated "compatible" form); :: and ::1 are themselves, not IPv4.
    if as_int >> 32 == 0 and as_int > 1:
        return ipaddress.IPv4Address(as_int)
    return addr


def parse_ipv4_spelling(host: str) -> str | None:
    """inet_aton(3): 1-4 parts, each decimal, 0x-hex or 0-octal; the last part fills
    the remaining bytes. Returns the dotted quad, or None when it is not an address."""
    parts = host.split(".")
    if len(parts) > 4 or not all(parts):
        return None
    values: list[int] = []
    for part in parts:
        try:
            if part.startswith("0x"):
                values.append(int(part[2:], 16) if len(part) > 2 else 0)
            elif len(part) > 1 and part.startswith("0"):
                values.append(int(part[1:], 8))
            else:
                values.append(int(part, 10))
        except ValueError:
            return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last
    for i, v in enumerate(head):
        value |= v << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def split_host_port(dest: str, default_port: int | None = None) -> tuple[str, int | None]:
    """Split ``host``, ``host:port``, ``[v6]:port``, ``[v6]`` or a bare IPv6 address.
    The host part is returned as written (not canonicalised); a bad port raises HostInvalid."""
    if dest.startswith("["):
        close = dest.find("]")
        if close < 0:
            raise HostInvalid(dest, "unclosed '['; write [2001:db8::1]:443")
        host, rest = dest[: close + 1], dest[close + 1 :]
        if not rest:
            return host, default_port
        if not rest.startswith(":"):
            raise HostInvalid(dest, "unexpected text after ']'")
        return host, _port(dest, rest[1:])
    if dest.count(":") == 1:
        host, _, port_text = dest.partition(":")
        return host, _port(dest, port_text)
    return dest, default_port


def _port(dest: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise HostInvalid(dest, f"port {text!r} is not a number from 1 to 65535")
    return int(text)

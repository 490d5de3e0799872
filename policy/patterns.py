"""Rule grammar: one rule string -> a frozen Rule.

    rule     := ["!"] target [":" ports]
    target   := host | "*." host | "**." host | "**" | ipv4 | ipv6 | cidr
    ports    := port | port "-" port            (1-65535; IPv6 + port: "[2001:db8::1]:443")

``*.x`` matches exactly one label in front of x; ``**.x`` one or more, never x
itself; ``**`` anything. Hosts and IPs are canonicalised exactly as destinations
are (policy.hosts), so ``0x7f000001`` and ``127.0.0.1`` are the same rule.
Errors are PatternInvalid with the problem and the fix.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from policy.errors import HostInvalid, PatternInvalid
from policy.hosts import canonicalize_host, fold_ipv6, is_ip

__all__ = ["Kind", "PortRange", "Rule", "parse_rule"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Kind(StrEnum):
    EXACT = "exact"  # api.example.com
    ONE_LABEL = "one_label"  # *.example.com
    MULTI_LABEL = "multi_label"  # **.example.com
    ANY = "any"  # **
    IP = "ip"  # 1.2.3.4, 2001:db8::1
    CIDR = "cidr"  # 10.0.0.0/8


@dataclass(frozen=True, slots=True)
class PortRange:
    low: int
    high: int

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True, slots=True)
class Rule:
    """A parsed rule. ``value`` is the canonical host, the wildcard's suffix, the
    IP text or the CIDR text; ``network`` is set for IP and CIDR rules."""

    text: str
    kind: Kind
    value: str
    negated: bool = False
    ports: PortRange | None = None
    network: IPNetwork | None = None
    where: str = ""  # "file:line" when known

    @property
    def is_address_rule(self) -> bool:
        return self.kind in (Kind.IP, Kind.CIDR)

    def matches_host(self, host: str, host_is_ip: bool) -> bool:
        """Whether the pattern (ignoring ports) matches a canonical host."""
        kind = self.kind
        if kind is Kind.ANY:
            return True
        if host_is_ip:
            if self.network is None:
                return False
            addr = ipaddress.ip_address(host)
            return addr.version == self.network.version and addr in self.network
        if kind is Kind.EXACT:
            return host == self.value
        if kind is Kind.ONE_LABEL:
            head, sep, rest = host.partition(".")
            return bool(sep) and bool(head) and rest == self.value
        if kind is Kind.MULTI_LABEL:
            return host.endswith("." + self.value) and len(host) > len(self.value) + 1
        return False

    def describe(self) -> str:
        return f"{self.text!r} ({self.where})" if self.where else repr(self.text)


def parse_rule(text: str, where: str = "") -> Rule:
    """Parse one rule string; raise PatternInvalid (placed at ``where``) if it is not one."""
    try:
        return _parse(text, where)
    except PatternInvalid as exc:
        if where and not exc.where:
            raise exc.located(where) from None
        raise


def _fail(rule: str, problem: str, hint: str = "") -> PatternInvalid:
    return PatternInvalid(rule=rule, problem=problem, hint=hint)


def _parse(original: str, where: str) -> Rule:
    if not isinstance(original, str):
        raise _fail(str(original), "a rule must be a string", 'quote it, e.g. "10.0.0.1"')
    text = original.strip()
    if not text:
        raise _fail(original, "empty rule", "remove it")
    negated = text.startswith("!")
    body = text[1:].strip() if negated else text
    for ch in body:
        if ord(ch) < 0x20 or ord(ch) == 0x7F or ch.isspace():
            raise _fail(original, "contains whitespace or a control character", "remove it")
    if not body:
        raise _fail(original, "a bare '!' negates nothing", 'write "!host", e.g. "!evil.example"')
    if body.startswith("!"):
        raise _fail(original, "double negation", "use one '!' at the start")
    target, ports = _split_port(original, body)
    kind, value, network = _parse_target(original, target)
    return Rule(
        text=("!" if negated else "") + body,
        kind=kind,
        value=value,
        negated=negated,
        ports=ports,
        network=network,
        where=where,
    )


def _split_port(rule: str, body: str) -> tuple[str, PortRange | None]:
    if body.startswith("["):
        close = body.find("]")
        if close < 0:
            raise _fail(rule, "unclosed '['", 'write "[2001:db8::1]:443"')
        target, rest = body[1:close], body[close + 1 :]
        if not rest:
            return target, None
        if not rest.startswith(":"):
            raise _fail(rule, "unexpected text after ']'", 'write "[2001:db8::1]:443"')
        return target, _parse_ports(rule, rest[1:])
    if body.count(":") == 1:
        target, _, port_text = body.partition(":")
        return target, _parse_ports(rule, port_text)
    return body, None  # no port, or a bare IPv6 address / CIDR


def _parse_ports(rule: str, text: str) -> PortRange:
    low_text, dash, high_text = text.partition("-")
    if not dash:
        high_text = low_text
    try:
        low, high = int(low_text, 10), int(high_text, 10)
    except ValueError:
        raise _fail(
            rule, f"port {text!r} is not a number or range", 'write ":443" or ":8000-8100"'
        ) from None
    if not (1 <= low <= 65535 and 1 <= high <= 65535):
        raise _fail(rule, f"port {text!r} is out of range", "ports are 1-65535")
    if low > high:
        raise _fail(rule, f"port range {text!r} is backwards", f'write ":{high}-{low}"')
    return PortRange(low, high)


def _parse_target(rule: str, target: str) -> tuple[Kind, str, IPNetwork | None]:
    if target == "**":
        return Kind.ANY, "**", None
    if "/" in target:
        return _parse_cidr(rule, target)
    if "*" in target:
        return _parse_wildcard(rule, target)
    try:
        host = canonicalize_host(target)
    except HostInvalid as exc:
        raise _fail(rule, exc.reason, "write a host name, an IP address or a CIDR") from None
    if is_ip(host):
        addr = ipaddress.ip_address(host)
        return Kind.IP, host, ipaddress.ip_network(addr)
    return Kind.EXACT, host, None


def _parse_wildcard(rule: str, target: str) -> tuple[Kind, str, None]:
    if target == "*":
        raise _fail(
            rule,
            "a lone '*' is not a pattern",
            'write "**" to match every destination, or "*.example.com" for one label',
        )
    if target.startswith("**."):
        kind, suffix = Kind.MULTI_LABEL, target[3:]
    elif target.startswith("*."):
        kind, suffix = Kind.ONE_LABEL, target[2:]
    elif "*" not in target.split(".", 1)[0]:
        raise _fail(
            rule,
            "a wildcard can only be the first label",
            'list the hosts you mean instead, e.g. "api.example.com"',
        )
    else:
        tail = target.rsplit("*", 1)[1].lstrip(".")
        if tail.startswith("-"):  # "*-aiplatform.x.com": "*.-aiplatform.x.com" is no host
            hint = f'list the hosts you mean instead, e.g. "us-east1{tail}"'
        elif tail:
            hint = f'write "*.{tail}" or "**.{tail}"'
        else:
            hint = 'write "*.example.com"'
        raise _fail(rule, "a wildcard must be a whole leading label", hint)
    if "*" in suffix:
        tail = suffix.rsplit("*", 1)[1].lstrip(".")
        if suffix.startswith(("*.", "**.")) and "*" not in tail:
            raise _fail(rule, "one wildcard segment per rule", f'write "**.{tail}"')
        raise _fail(
            rule,
            "a wildcard must be a whole leading label",
            f'write "*.{tail}" or "**.{tail}"' if tail else 'write "*.example.com"',
        )
    try:
        host = canonicalize_host(suffix)
    except HostInvalid as exc:
        raise _fail(
            rule, f"after the wildcard: {exc.reason}", "write a host name after '*.'"
        ) from None
    if is_ip(host):
        raise _fail(
            rule,
            "a wildcard cannot stand in front of an IP address",
            "use a CIDR such as 10.0.0.0/8",
        )
    return kind, host, None


def _parse_cidr(rule: str, target: str) -> tuple[Kind, str, IPNetwork]:
    addr_text, _, length = target.partition("/")
    try:
        network = ipaddress.ip_network(f"{addr_text}/{length}", strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(f"{addr_text}/{length}", strict=False)
        except ValueError:
            raise _fail(
                rule, f"not a valid CIDR ({exc})", 'write e.g. "10.0.0.0/8" or "fd00::/8"'
            ) from None
        raise _fail(rule, "the CIDR has host bits set", f'write "{loose}"') from None
    if isinstance(network, ipaddress.IPv6Network):
        mapped = ipaddress.IPv6Network("::ffff:0:0/96")
        if network.subnet_of(mapped) and network.prefixlen >= 96:
            # Destinations fold mapped IPv6 to IPv4, so say the rule the same way.
            v4 = fold_ipv6(network.network_address)
            network_v4 = ipaddress.ip_network(f"{v4}/{network.prefixlen - 96}")
            return Kind.CIDR, str(network_v4), network_v4
    return Kind.CIDR, str(network), network

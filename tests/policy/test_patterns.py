"""Rule grammar: what each form matches, and every invalid rule's message, pinned."""

from __future__ import annotations

import pytest

from policy import Kind, PatternInvalid, canonicalize_host, parse_rule
from policy.hosts import is_ip

# (rule, host, matches) — host is canonicalised first, as the gateway does.
MATCHES = [
    pytest.param("api.x.com", "api.x.com", True, id="exact"),
    pytest.param("api.x.com", "API.X.COM.", True, id="exact-case-and-dot"),
    pytest.param("api.x.com", "x.com", False, id="exact-not-parent"),
    pytest.param("api.x.com", "a.api.x.com", False, id="exact-not-child"),
    pytest.param("*.x.com", "a.x.com", True, id="one-label"),
    pytest.param("*.x.com", "a.b.x.com", False, id="one-label-not-two"),
    pytest.param("*.x.com", "x.com", False, id="one-label-not-apex"),
    pytest.param("*.x.com", "ax.com", False, id="one-label-not-suffix-string"),
    pytest.param("**.x.com", "a.x.com", True, id="multi-one"),
    pytest.param("**.x.com", "a.b.c.x.com", True, id="multi-three"),
    pytest.param("**.x.com", "x.com", False, id="multi-not-apex"),
    pytest.param("**.x.com", "evilx.com", False, id="multi-not-suffix-string"),
    pytest.param("**", "anything.example", True, id="any-name"),
    pytest.param("**", "10.0.0.1", True, id="any-ip"),
    pytest.param("1.2.3.4", "1.2.3.4", True, id="ipv4"),
    pytest.param("1.2.3.4", "16909060", True, id="ipv4-decimal-spelling"),
    pytest.param("127.0.0.1", "0x7f000001", True, id="ipv4-hex-spelling"),
    pytest.param("127.0.0.1", "::ffff:127.0.0.1", True, id="ipv4-mapped-spelling"),
    pytest.param("0x7f000001", "127.1", True, id="rule-in-hex"),
    pytest.param("1.2.3.4", "1.2.3.5", False, id="ipv4-other"),
    pytest.param("2001:db8::1", "[2001:DB8:0::1]", True, id="ipv6"),
    pytest.param("10.0.0.0/8", "10.255.0.1", True, id="cidr4-in"),
    pytest.param("10.0.0.0/8", "11.0.0.1", False, id="cidr4-out"),
    pytest.param("10.0.0.0/8", "012.1", True, id="cidr4-octal-spelling"),
    pytest.param("fd00::/8", "fd12::1", True, id="cidr6-in"),
    pytest.param("fd00::/8", "fe80::1", False, id="cidr6-out"),
    pytest.param("::ffff:10.0.0.0/104", "10.1.1.1", True, id="cidr-mapped-folded"),
    pytest.param("1.2.3.4", "a.b", False, id="ip-rule-never-matches-names"),
    pytest.param("a.com", "1.2.3.4", False, id="name-rule-never-matches-ips"),
    pytest.param("bücher.example", "xn--bcher-kva.example", True, id="idn-rule"),
]


@pytest.mark.parametrize(("rule", "host", "matches"), MATCHES)
def test_rule_matches(rule: str, host: str, matches: bool) -> None:
    canonical = canonicalize_host(host)
    assert parse_rule(rule).matches_host(canonical, is_ip(canonical)) is matches


FORMS = [
    pytest.param("api.x.com", Kind.EXACT, "api.x.com", False, None, id="exact"),
    pytest.param("  API.x.com  ", Kind.EXACT, "api.x.com", False, None, id="trimmed-lowered"),
    pytest.param("*.x.com", Kind.ONE_LABEL, "x.com", False, None, id="one-label"),
    pytest.param("**.x.com", Kind.MULTI_LABEL, "x.com", False, None, id="multi-label"),
    pytest.param("**", Kind.ANY, "**", False, None, id="any"),
    pytest.param("!**", Kind.ANY, "**", True, None, id="deny-any"),
    pytest.param("!evil.com", Kind.EXACT, "evil.com", True, None, id="negation"),
    pytest.param("! evil.com", Kind.EXACT, "evil.com", True, None, id="negation-space"),
    pytest.param("x.com:8443", Kind.EXACT, "x.com", False, "8443", id="port"),
    pytest.param("x.com:8000-8100", Kind.EXACT, "x.com", False, "8000-8100", id="port-range"),
    pytest.param("!*.x.com:22", Kind.ONE_LABEL, "x.com", True, "22", id="negated-wildcard-port"),
    pytest.param("10.0.0.0/8", Kind.CIDR, "10.0.0.0/8", False, None, id="cidr4"),
    pytest.param("10.0.0.0/8:5432", Kind.CIDR, "10.0.0.0/8", False, "5432", id="cidr4-port"),
    pytest.param("fd00::/8", Kind.CIDR, "fd00::/8", False, None, id="cidr6"),
    pytest.param("1.2.3.4:443", Kind.IP, "1.2.3.4", False, "443", id="ip-port"),
    pytest.param("[2001:db8::1]:443", Kind.IP, "2001:db8::1", False, "443", id="ipv6-port"),
    pytest.param("2001:db8::1", Kind.IP, "2001:db8::1", False, None, id="ipv6-bare"),
    pytest.param("[2001:db8::1]", Kind.IP, "2001:db8::1", False, None, id="ipv6-brackets"),
    pytest.param("FD00::/8", Kind.CIDR, "fd00::/8", False, None, id="cidr6-upper"),
]


@pytest.mark.parametrize(("text", "kind", "value", "negated", "ports"), FORMS)
def test_rule_forms(text: str, kind: Kind, value: str, negated: bool, ports: str | None) -> None:
    rule = parse_rule(text)
    assert (rule.kind, rule.value, rule.negated) == (kind, value, negated)
    assert (str(rule.ports) if rule.ports else None) == ports


INVALID = [
    pytest.param(
        "a*b.com",
        'a wildcard must be a whole leading label; write "*.b.com" or "**.b.com"',
        id="mid-label",
    ),
    pytest.param(
        "*foo.com",
        'a wildcard must be a whole leading label; write "*.foo.com" or "**.foo.com"',
        id="partial-leading",
    ),
    pytest.param(
        "api.*.com",
        'a wildcard can only be the first label; list the hosts you mean instead, e.g. "api.example.com"',
        id="middle-label",
    ),
    pytest.param(
        "*.*.x.com", 'one wildcard segment per rule; write "**.x.com"', id="two-wildcards"
    ),
    pytest.param(
        "*",
        """a lone '*' is not a pattern; write "**" to match every destination, or "*.example.com" for one label""",
        id="lone-star",
    ),
    pytest.param(
        "***.x.com",
        'a wildcard must be a whole leading label; write "*.x.com" or "**.x.com"',
        id="triple-star",
    ),
    pytest.param(
        "*.1.2.3",
        "a wildcard cannot stand in front of an IP address; use a CIDR such as 10.0.0.0/8",
        id="wildcard-ip",
    ),
    pytest.param(
        "*-aiplatform.googleapis.com",
        'a wildcard must be a whole leading label; list the hosts you mean instead, e.g. "us-east1-aiplatform.googleapis.com"',
        id="partial-label-hyphen",
    ),
    pytest.param("", "empty rule; remove it", id="empty"),
    pytest.param("   ", "empty rule; remove it", id="blank"),
    pytest.param(
        "!", """a bare '!' negates nothing; write "!host", e.g. "!evil.example\"""", id="bare-bang"
    ),
    pytest.param("!!x.com", "double negation; use one '!' at the start", id="double-bang"),
    pytest.param(
        "10.0.0.1/8", 'the CIDR has host bits set; write "10.0.0.0/8"', id="cidr-host-bits"
    ),
    pytest.param("10.0.0.0/33", "not a valid CIDR", id="cidr-prefix"),
    pytest.param("x.com:0", "port '0' is out of range; ports are 1-65535", id="port-zero"),
    pytest.param("x.com:65536", "port '65536' is out of range; ports are 1-65535", id="port-big"),
    pytest.param(
        "x.com:http",
        """port 'http' is not a number or range; write ":443" or ":8000-8100\"""",
        id="port-name",
    ),
    pytest.param(
        "x.com:9000-8000",
        """port range '9000-8000' is backwards; write ":8000-9000\"""",
        id="port-backwards",
    ),
    pytest.param(
        "a..com",
        "empty label (two dots in a row, or a leading dot); write a host name, an IP address or a CIDR",
        id="empty-label",
    ),
    pytest.param("a" * 64 + ".com", "label of 64 octets, over the 63 limit", id="long-label"),
    pytest.param(
        "x.com\ny.com", "contains whitespace or a control character; remove it", id="newline"
    ),
    pytest.param("[::1", """unclosed '['; write "[2001:db8::1]:443\"""", id="unclosed-bracket"),
    pytest.param("300.1.1.1", "ends in a number but is not a valid IPv4 address", id="bad-ip"),
]


@pytest.mark.parametrize(("text", "message"), INVALID)
def test_invalid_rule_message(text: str, message: str) -> None:
    with pytest.raises(PatternInvalid) as info:
        parse_rule(text, where="policy.yaml:7")
    assert str(info.value).startswith("policy.yaml:7: rule ")
    assert message in str(info.value)


def test_invalid_rule_message_exact() -> None:
    with pytest.raises(PatternInvalid) as info:
        parse_rule("a*b.com", where="policy.yaml:7")
    assert str(info.value) == (
        'policy.yaml:7: rule "a*b.com": a wildcard must be a whole leading label; '
        'write "*.b.com" or "**.b.com"'
    )

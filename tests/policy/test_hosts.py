"""Destination canonicalisation: every spelling of one destination is one string."""

from __future__ import annotations

import pytest

from policy import HostInvalid, canonicalize_host, split_host_port

CANONICAL = [
    # (raw, canonical)
    pytest.param("API.Anthropic.COM", "api.anthropic.com", id="lowercase"),
    pytest.param("api.anthropic.com.", "api.anthropic.com", id="one-trailing-dot"),
    pytest.param("Bücher.example", "xn--bcher-kva.example", id="idn-to-punycode"),
    pytest.param("xn--bcher-kva.example", "xn--bcher-kva.example", id="punycode-kept"),
    pytest.param("münchen.de.", "xn--mnchen-3ya.de", id="idn-and-trailing-dot"),
    pytest.param("under_score.example", "under_score.example", id="underscore-label"),
    pytest.param("169.254.169.254", "169.254.169.254", id="dotted-quad"),
    pytest.param("2852039166", "169.254.169.254", id="ipv4-decimal"),
    pytest.param("0xA9FEA9FE", "169.254.169.254", id="ipv4-hex"),
    pytest.param("0xa9.0xfe.0xa9.0xfe", "169.254.169.254", id="ipv4-hex-parts"),
    pytest.param("0251.0376.0251.0376", "169.254.169.254", id="ipv4-octal"),
    pytest.param("169.254.43518", "169.254.169.254", id="ipv4-three-part"),
    pytest.param("169.16689662", "169.254.169.254", id="ipv4-two-part"),
    pytest.param("127.1", "127.0.0.1", id="ipv4-short"),
    pytest.param("0x7f000001", "127.0.0.1", id="loopback-hex"),
    pytest.param("0177.0.0.1", "127.0.0.1", id="loopback-octal"),
    pytest.param("017700000001", "127.0.0.1", id="loopback-octal-whole"),
    pytest.param("127.0.0.1.", "127.0.0.1", id="ipv4-trailing-dot"),
    pytest.param("0", "0.0.0.0", id="zero"),
    pytest.param("[::1]", "::1", id="ipv6-brackets"),
    pytest.param("[2001:DB8::1]", "2001:db8::1", id="ipv6-upper"),
    pytest.param("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1", id="ipv6-long"),
    pytest.param("::ffff:169.254.169.254", "169.254.169.254", id="mapped-dotted"),
    pytest.param("[::ffff:a9fe:a9fe]", "169.254.169.254", id="mapped-hex"),
    pytest.param("::ffff:127.0.0.1", "127.0.0.1", id="mapped-loopback"),
    pytest.param("::127.0.0.1", "127.0.0.1", id="compatible-ipv4"),
    pytest.param("::", "::", id="ipv6-unspecified-stays"),
]


@pytest.mark.parametrize(("raw", "canonical"), CANONICAL)
def test_canonical_spelling(raw: str, canonical: str) -> None:
    assert canonicalize_host(raw) == canonical


INVALID = [
    pytest.param("", "empty host", id="empty"),
    pytest.param(".", "empty host", id="only-dot"),
    pytest.param("a..b", "empty label", id="empty-label"),
    pytest.param(".a.b", "empty label", id="leading-dot"),
    pytest.param("a.b..", "empty label", id="two-trailing-dots"),
    pytest.param("evil.com\x00.good.com", "NUL", id="nul"),
    pytest.param("a.com\r\nX-Injected: 1", "CR/LF", id="crlf"),
    pytest.param("a.com\n", "CR/LF", id="lf"),
    pytest.param("a b.com", "whitespace", id="space"),
    pytest.param("a\tb.com", "whitespace", id="tab"),
    pytest.param("fe80::1%eth0", "'%'", id="zone-id"),
    pytest.param("[fe80::1%25eth0]", "'%'", id="zone-id-bracketed"),
    pytest.param("a%2ecom", "'%'", id="percent-encoding"),
    pytest.param("a" * 64 + ".com", "over the 63 limit", id="label-64"),
    pytest.param(".".join(["a" * 60] * 5), "over the 253 limit", id="name-254"),
    pytest.param("evil.com/x", "'/'", id="slash"),
    pytest.param("user@evil.com", "'@'", id="userinfo"),
    pytest.param("1.2.3.256", "not a valid IPv4", id="octet-256"),
    pytest.param("1.2.3.4.5", "not a valid IPv4", id="five-parts"),
    pytest.param("4294967296", "not a valid IPv4", id="decimal-overflow"),
    pytest.param("08.1.1.1", "not a valid IPv4", id="bad-octal"),
    pytest.param("[1.2.3.4]", "only for IPv6", id="brackets-ipv4"),
    pytest.param("[::1", "unbalanced", id="unbalanced"),
    pytest.param("1:2:3", "not a valid IPv6", id="bad-ipv6"),
    pytest.param("-a.com", "hyphen", id="leading-hyphen"),
    pytest.param("a\x7f.com", "control", id="del"),
]


@pytest.mark.parametrize(("raw", "reason"), INVALID)
def test_not_a_host(raw: str, reason: str) -> None:
    with pytest.raises(HostInvalid) as info:
        canonicalize_host(raw)
    assert reason in info.value.reason


def test_error_message_escapes_control_characters() -> None:
    with pytest.raises(HostInvalid) as info:
        canonicalize_host("a.com\r\nX: y")
    assert "\n" not in str(info.value)
    assert "\\r\\n" in str(info.value)


@pytest.mark.parametrize(
    ("dest", "expected"),
    [
        pytest.param("api.x.com", ("api.x.com", 443), id="host"),
        pytest.param("api.x.com:8443", ("api.x.com", 8443), id="host-port"),
        pytest.param("[::1]:80", ("[::1]", 80), id="v6-port"),
        pytest.param("[::1]", ("[::1]", 443), id="v6-brackets"),
        pytest.param("2001:db8::1", ("2001:db8::1", 443), id="v6-bare"),
    ],
)
def test_split_host_port(dest: str, expected: tuple[str, int]) -> None:
    assert split_host_port(dest, default_port=443) == expected


@pytest.mark.parametrize("dest", ["a.com:0", "a.com:65536", "a.com:x", "[::1]x", "a.com:"])
def test_split_host_port_rejects_bad_ports(dest: str) -> None:
    with pytest.raises(HostInvalid):
        split_host_port(dest)

"""Last-match-wins evaluation, modes, ports, IP-literal refusal and the address guard."""

from __future__ import annotations

import pytest

from policy import Code, Mode, Verdict, policy_from_rules

ALLOW, DENY = Verdict.ALLOW, Verdict.DENY

# (mode, rules, destination, port, verdict, code, deciding rule)
CASES = [
    # last match wins
    pytest.param(
        "allowlist",
        ["**.x.com", "!bad.x.com"],
        "bad.x.com",
        443,
        DENY,
        Code.POLICY_DENIED,
        "!bad.x.com",
        id="later-negation-wins",
    ),
    pytest.param(
        "allowlist",
        ["!bad.x.com", "**.x.com"],
        "bad.x.com",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "**.x.com",
        id="later-allow-wins",
    ),
    pytest.param(
        "allowlist",
        ["**.x.com", "!bad.x.com"],
        "ok.x.com",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "**.x.com",
        id="negation-not-matching",
    ),
    pytest.param(
        "allowlist",
        ["**", "!*.x.com", "a.x.com"],
        "a.x.com",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "a.x.com",
        id="three-deep",
    ),
    pytest.param(
        "allowlist",
        ["**", "!*.x.com", "a.x.com"],
        "b.x.com",
        443,
        DENY,
        Code.POLICY_DENIED,
        "!*.x.com",
        id="three-deep-middle",
    ),
    # modes
    pytest.param(
        "allowlist",
        ["api.x.com"],
        "evil.site",
        443,
        DENY,
        Code.POLICY_DENIED,
        None,
        id="allowlist-no-match",
    ),
    pytest.param(
        "denylist",
        ["!evil.site"],
        "evil.site",
        443,
        DENY,
        Code.POLICY_DENIED,
        "!evil.site",
        id="denylist-negation",
    ),
    pytest.param(
        "denylist",
        ["!evil.site"],
        "fine.site",
        443,
        ALLOW,
        Code.DEFAULT_ALLOWED,
        None,
        id="denylist-no-match",
    ),
    pytest.param(
        "denylist",
        ["!**.evil.site", "ok.evil.site"],
        "ok.evil.site",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "ok.evil.site",
        id="denylist-exception",
    ),
    pytest.param(
        "open",
        ["!evil.site"],
        "evil.site",
        443,
        ALLOW,
        Code.OPEN_MODE,
        None,
        id="open-ignores-rules",
    ),
    # wildcards vs apex
    pytest.param(
        "allowlist", ["**.x.com"], "x.com", 443, DENY, Code.POLICY_DENIED, None, id="multi-not-apex"
    ),
    pytest.param(
        "allowlist",
        ["*.x.com"],
        "a.b.x.com",
        443,
        DENY,
        Code.POLICY_DENIED,
        None,
        id="one-label-only",
    ),
    # ports
    pytest.param(
        "allowlist",
        ["api.x.com"],
        "api.x.com",
        80,
        ALLOW,
        Code.RULE_ALLOWED,
        "api.x.com",
        id="default-port-80",
    ),
    pytest.param(
        "allowlist",
        ["api.x.com"],
        "api.x.com",
        8443,
        DENY,
        Code.PORT_NOT_ALLOWED,
        "api.x.com",
        id="portless-not-other-ports",
    ),
    pytest.param(
        "allowlist",
        ["api.x.com:8443"],
        "api.x.com",
        8443,
        ALLOW,
        Code.RULE_ALLOWED,
        "api.x.com:8443",
        id="named-port",
    ),
    pytest.param(
        "allowlist",
        ["api.x.com:8443"],
        "api.x.com",
        443,
        DENY,
        Code.PORT_NOT_ALLOWED,
        "api.x.com:8443",
        id="named-port-only",
    ),
    pytest.param(
        "allowlist",
        ["api.x.com:8443", "api.x.com"],
        "api.x.com",
        8443,
        ALLOW,
        Code.RULE_ALLOWED,
        "api.x.com:8443",
        id="portless-does-not-hide-named",
    ),
    pytest.param(
        "allowlist",
        ["x.com:8000-8100"],
        "x.com",
        8100,
        ALLOW,
        Code.RULE_ALLOWED,
        "x.com:8000-8100",
        id="range-top",
    ),
    pytest.param(
        "allowlist",
        ["x.com:8000-8100"],
        "x.com",
        8101,
        DENY,
        Code.PORT_NOT_ALLOWED,
        "x.com:8000-8100",
        id="range-outside",
    ),
    pytest.param(
        "allowlist",
        ["**.x.com", "!a.x.com:22"],
        "a.x.com",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "**.x.com",
        id="negated-port-only-that-port",
    ),
    pytest.param(
        "allowlist",
        ["x.com", "!x.com"],
        "x.com",
        9999,
        DENY,
        Code.POLICY_DENIED,
        "!x.com",
        id="portless-negation-any-port",
    ),
    pytest.param(
        "denylist",
        ["!x.com:22"],
        "x.com",
        22,
        DENY,
        Code.POLICY_DENIED,
        "!x.com:22",
        id="denylist-port",
    ),
    pytest.param(
        "denylist", [], "x.com", 8443, ALLOW, Code.DEFAULT_ALLOWED, None, id="denylist-any-port"
    ),
    # IP literals in allowlist
    pytest.param(
        "allowlist",
        ["api.x.com"],
        "1.2.3.4",
        443,
        DENY,
        Code.IP_LITERAL_REFUSED,
        None,
        id="ip-literal",
    ),
    pytest.param(
        "allowlist",
        ["api.x.com"],
        "16909060",
        443,
        DENY,
        Code.IP_LITERAL_REFUSED,
        None,
        id="ip-literal-decimal",
    ),
    pytest.param(
        "allowlist",
        ["api.x.com"],
        "[2606:4700::1]",
        443,
        DENY,
        Code.IP_LITERAL_REFUSED,
        None,
        id="ip-literal-v6",
    ),
    pytest.param(
        "allowlist", ["1.2.3.4"], "1.2.3.4", 443, ALLOW, Code.RULE_ALLOWED, "1.2.3.4", id="ip-rule"
    ),
    pytest.param(
        "allowlist",
        ["1.2.3.0/24"],
        "0x01020304",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "1.2.3.0/24",
        id="cidr-rule-hex",
    ),
    pytest.param(
        "allowlist",
        ["**"],
        "1.2.3.4",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "**",
        id="any-allows-public-ip",
    ),
    # address guard on literals
    pytest.param(
        "allowlist",
        ["**"],
        "127.0.0.1",
        443,
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        None,
        id="any-not-loopback",
    ),
    pytest.param(
        "allowlist",
        ["**"],
        "169.254.169.254",
        80,
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        None,
        id="any-not-metadata",
    ),
    pytest.param(
        "allowlist",
        ["**"],
        "[::ffff:169.254.169.254]",
        80,
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        None,
        id="any-not-mapped-metadata",
    ),
    pytest.param(
        "allowlist",
        ["**"],
        "[64:ff9b::a9fe:a9fe]",
        80,
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        None,
        id="any-not-nat64-metadata",
    ),
    pytest.param(
        "allowlist",
        ["**"],
        "localhost",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "**",
        id="localhost-name-needs-dns-check",
    ),
    pytest.param(
        "allowlist",
        ["127.0.0.1"],
        "127.1",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "127.0.0.1",
        id="explicit-loopback",
    ),
    pytest.param(
        "allowlist",
        ["10.0.0.0/8"],
        "10.1.2.3",
        443,
        ALLOW,
        Code.RULE_ALLOWED,
        "10.0.0.0/8",
        id="explicit-private",
    ),
    pytest.param(
        "denylist", [], "127.0.0.1", 443, DENY, Code.NON_PUBLIC_ADDRESS, None, id="denylist-guard"
    ),
    pytest.param(
        "denylist",
        [],
        "0x7f.1",
        443,
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        None,
        id="denylist-guard-spelling",
    ),
    pytest.param(
        "denylist", [], "8.8.8.8", 443, ALLOW, Code.DEFAULT_ALLOWED, None, id="denylist-public-ip"
    ),
    pytest.param(
        "denylist",
        ["!8.8.0.0/16"],
        "8.8.8.8",
        443,
        DENY,
        Code.POLICY_DENIED,
        "!8.8.0.0/16",
        id="denylist-cidr",
    ),
    # hosts that are not hosts
    pytest.param("allowlist", ["**"], "a.com\r\nx", 443, DENY, Code.INVALID_HOST, None, id="crlf"),
    pytest.param(
        "denylist", [], "evil\x00.com", 443, DENY, Code.INVALID_HOST, None, id="nul-denylist"
    ),
    pytest.param("open", [], "a b", 443, DENY, Code.INVALID_HOST, None, id="invalid-even-open"),
    pytest.param("allowlist", ["**"], "a.com", 0, DENY, Code.INVALID_HOST, None, id="port-zero"),
]


@pytest.mark.parametrize(("mode", "rules", "host", "port", "verdict", "code", "rule"), CASES)
def test_decide(
    mode: str,
    rules: list[str],
    host: str,
    port: int,
    verdict: Verdict,
    code: Code,
    rule: str | None,
) -> None:
    decision = policy_from_rules(rules, mode=mode).decide(host, port)
    assert (decision.verdict, decision.code, decision.rule) == (verdict, code, rule), (
        decision.detail
    )
    if rule is not None:
        assert decision.rule_index is not None
        assert rules[decision.rule_index] == rule


def test_decision_reason_and_message() -> None:
    policy = policy_from_rules(["api.x.com"], name="agent-default")
    decision = policy.decide("evil.site", 443)
    assert decision.reason == "policy denial"
    assert decision.message == (
        "blocked by egress policy: evil.site is not on the allowlist (policy agent-default); "
        "ask your operator to add it"
    )
    assert decision.as_dict() == {
        "host": "evil.site",
        "port": 443,
        "verdict": "deny",
        "rule": None,
        "rule_index": None,
        "reason": "policy denial",
        "code": "policy_denied",
    }


def test_decide_fails_closed_on_unexpected_input() -> None:
    policy = policy_from_rules(["**"])
    decision = policy.decide(None, 443)  # type: ignore[arg-type]  # hostile caller on purpose
    assert decision.verdict is DENY
    assert decision.code in (Code.INVALID_HOST, Code.DECISION_ERROR)
    assert policy.decide("a.com", "443").verdict is DENY  # type: ignore[arg-type]  # a str port
    assert policy.decide("a.com", True).verdict is DENY  # a bool is not a port


# (rules, host, addresses, verdict, code)
ADDRESS_CASES = [
    pytest.param(["api.x.com"], "api.x.com", ["1.2.3.4"], ALLOW, Code.RULE_ALLOWED, id="public"),
    pytest.param(
        ["api.x.com"],
        "api.x.com",
        ["1.2.3.4", "127.0.0.1"],
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        id="one-of-many-loopback",
    ),
    pytest.param(
        ["api.x.com"],
        "api.x.com",
        ["169.254.169.254"],
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        id="metadata",
    ),
    pytest.param(
        ["api.x.com"], "api.x.com", ["10.0.0.1"], DENY, Code.NON_PUBLIC_ADDRESS, id="rfc1918"
    ),
    pytest.param(
        ["api.x.com"],
        "api.x.com",
        ["::ffff:127.0.0.1"],
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        id="mapped-loopback",
    ),
    pytest.param(
        ["api.x.com"], "api.x.com", ["::1"], DENY, Code.NON_PUBLIC_ADDRESS, id="v6-loopback"
    ),
    pytest.param(["api.x.com"], "api.x.com", ["fd00::5"], DENY, Code.NON_PUBLIC_ADDRESS, id="ula"),
    pytest.param(
        ["api.x.com"], "api.x.com", ["100.64.0.1"], DENY, Code.NON_PUBLIC_ADDRESS, id="cgnat"
    ),
    pytest.param(
        ["api.x.com", "10.0.0.0/8"],
        "api.x.com",
        ["10.0.0.1"],
        ALLOW,
        Code.RULE_ALLOWED,
        id="explicit-cidr",
    ),
    pytest.param(
        ["api.x.com", "10.0.0.1:443"],
        "api.x.com",
        ["10.0.0.1"],
        ALLOW,
        Code.RULE_ALLOWED,
        id="explicit-ip-port",
    ),
    pytest.param(
        ["api.x.com", "10.0.0.1:5432"],
        "api.x.com",
        ["10.0.0.1"],
        DENY,
        Code.NON_PUBLIC_ADDRESS,
        id="explicit-ip-other-port",
    ),
    pytest.param(
        ["**"], "api.x.com", ["127.0.0.1"], DENY, Code.NON_PUBLIC_ADDRESS, id="any-is-not-explicit"
    ),
    pytest.param(
        ["api.x.com", "10.0.0.0/8", "!10.0.0.5"],
        "api.x.com",
        ["10.0.0.5"],
        DENY,
        Code.POLICY_DENIED,
        id="cidr-then-negation",
    ),
    pytest.param(
        ["api.x.com", "!1.2.3.0/24"],
        "api.x.com",
        ["1.2.3.4"],
        DENY,
        Code.POLICY_DENIED,
        id="public-negated-range",
    ),
    pytest.param(["api.x.com"], "api.x.com", [], DENY, Code.DECISION_ERROR, id="no-addresses"),
    pytest.param(
        ["api.x.com"], "api.x.com", ["not-an-ip"], DENY, Code.DECISION_ERROR, id="garbage-address"
    ),
]


@pytest.mark.parametrize(("rules", "host", "addresses", "verdict", "code"), ADDRESS_CASES)
def test_check_addresses(
    rules: list[str], host: str, addresses: list[str], verdict: Verdict, code: Code
) -> None:
    decision = policy_from_rules(rules).check_addresses(host, 443, addresses)
    assert (decision.verdict, decision.code) == (verdict, code), decision.detail


def test_check_addresses_in_denylist_guards_too() -> None:
    decision = policy_from_rules([], mode=Mode.DENYLIST).check_addresses(
        "a.com", 443, ["127.0.0.1"]
    )
    assert decision.code is Code.NON_PUBLIC_ADDRESS


def test_silent_list() -> None:
    policy = policy_from_rules(["!**.sentry.io"], silent=["**.sentry.io"])
    assert policy.is_silent("o1.ingest.sentry.io")
    assert not policy.is_silent("api.x.com")
    assert not policy.is_silent("bad host")

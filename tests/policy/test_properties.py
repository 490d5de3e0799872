"""Properties: the compiled matcher decides exactly like a naive reverse scan, and
parsers never raise anything but the project's own errors.

Profiles: HYPOTHESIS_PROFILE=deep runs many more examples (default: fast).
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy import (
    Code,
    HostInvalid,
    Mode,
    PatternInvalid,
    PolicyError,
    Verdict,
    canonicalize_host,
    classify_address,
    load_policy,
    parse_rule,
    policy_from_rules,
)
from policy.hosts import is_ip

settings.register_profile("fast", max_examples=300, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=20_000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

LABELS = ["a", "b", "c", "x", "com"]
IPS = ["10.0.0.1", "10.9.9.9", "127.0.0.1", "1.2.3.4", "1.2.9.9", "169.254.169.254", "8.8.8.8",
       "2001:4860::1", "fd00::1", "::1"]  # fmt: skip
NETS = ["10.0.0.0/8", "1.2.0.0/16", "1.2.3.0/24", "0.0.0.0/0", "127.0.0.0/8", "fd00::/8",
        "2001:4860::/32", "::/0"]  # fmt: skip
PORTS = [22, 80, 443, 8000, 8443]

names = st.lists(st.sampled_from(LABELS), min_size=1, max_size=4).map(".".join)
port_suffix = st.sampled_from(["", ":443", ":8443", ":8000-8443", ":22", ":1-100"])


@st.composite
def rules(draw: st.DrawFn) -> str:
    target: str = draw(
        st.one_of(
            names,
            names.map(lambda n: "*." + n),
            names.map(lambda n: "**." + n),
            st.just("**"),
            st.sampled_from(IPS),
            st.sampled_from(NETS),
        )
    )
    suffix: str = draw(port_suffix)
    if suffix and ":" in target:  # IPv6 needs brackets to carry a port; CIDRs keep theirs plain
        target = f"[{target}]" if "/" not in target else target
        if "/" in target:
            suffix = ""
    negate = draw(st.booleans())
    return ("!" if negate else "") + target + suffix


destinations = st.one_of(names, st.sampled_from(IPS))


def naive_decide(
    rule_texts: list[str], mode: Mode, host_raw: str, port: int
) -> tuple[Verdict, Code, int | None]:
    """The DESIGN.md semantics, written as plainly as possible: scan in reverse."""
    parsed = [parse_rule(t) for t in rule_texts]
    host = canonicalize_host(host_raw)
    ip = is_ip(host)
    if mode is Mode.OPEN:
        return Verdict.ALLOW, Code.OPEN_MODE, None

    def port_ok(i: int) -> bool:
        r = parsed[i]
        if r.ports is not None:
            return port in r.ports
        return not (mode is Mode.ALLOWLIST and not r.negated) or port in (80, 443)

    decider = None
    for i in reversed(range(len(parsed))):
        if parsed[i].matches_host(host, ip) and port_ok(i):
            decider = i
            break
    if decider is not None and parsed[decider].negated:
        return Verdict.DENY, Code.POLICY_DENIED, decider
    if decider is None and mode is Mode.ALLOWLIST:
        if ip:
            return Verdict.DENY, Code.IP_LITERAL_REFUSED, None
        for i in reversed(range(len(parsed))):
            if parsed[i].matches_host(host, ip):
                if not parsed[i].negated:
                    return Verdict.DENY, Code.PORT_NOT_ALLOWED, i
                break
        return Verdict.DENY, Code.POLICY_DENIED, None
    if ip and not classify_address(host).public:
        explicit = decider is not None and parsed[decider].kind.value in ("ip", "cidr")
        if not explicit:
            return Verdict.DENY, Code.NON_PUBLIC_ADDRESS, None
    if decider is None:
        return Verdict.ALLOW, Code.DEFAULT_ALLOWED, None
    return Verdict.ALLOW, Code.RULE_ALLOWED, decider


@given(
    rule_list=st.lists(rules(), max_size=25),
    mode=st.sampled_from([Mode.ALLOWLIST, Mode.DENYLIST]),
    host=destinations,
    port=st.sampled_from(PORTS),
)
def test_compiled_matcher_equals_reverse_scan(
    rule_list: list[str], mode: Mode, host: str, port: int
) -> None:
    decision = policy_from_rules(rule_list, mode=mode).decide(host, port)
    assert (decision.verdict, decision.code, decision.rule_index) == naive_decide(
        rule_list, mode, host, port
    )


@given(
    rule_list=st.lists(rules(), max_size=25),
    host=names,
    addresses=st.lists(st.sampled_from(IPS), min_size=1, max_size=3),
)
def test_address_guard_equals_reverse_scan(
    rule_list: list[str], host: str, addresses: list[str]
) -> None:
    policy = policy_from_rules(rule_list)
    decision = policy.check_addresses(host, 443, addresses)
    parsed = [parse_rule(t) for t in rule_list]
    expected = Verdict.ALLOW
    for text in addresses:
        addr = canonicalize_host(text)
        last = None
        for r in reversed(parsed):
            if (
                r.network is not None
                and r.matches_host(addr, True)
                and (r.ports is None or 443 in r.ports)
            ):
                last = r
                break
        if (last is not None and last.negated) or (
            last is None and not classify_address(addr).public
        ):
            expected = Verdict.DENY
            break
    assert decision.verdict is expected


@given(st.text(max_size=80))
def test_parse_rule_raises_only_pattern_invalid(text: str) -> None:
    try:
        rule = parse_rule(text)
    except PatternInvalid as exc:
        assert str(exc)  # noqa: PT017 - either outcome is fine; only the type may not vary
    else:
        assert rule.text


@given(st.text(max_size=80) | st.binary(max_size=80).map(lambda b: b.decode("latin-1")))
def test_canonicalize_raises_only_host_invalid(text: str) -> None:
    try:
        host = canonicalize_host(text)
    except HostInvalid as exc:
        assert exc.reason  # noqa: PT017 - as above
    else:
        assert host == canonicalize_host(host), "canonical form is a fixed point"
        assert host == host.strip().lower()


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_ipv4_spelling_folds_to_dotted_quad(value: int) -> None:
    dotted = str(ipaddress.IPv4Address(value))
    spellings = [str(value), hex(value), f"[::ffff:{dotted}]", f"0{value:o}"]
    spellings.append(f"{value >> 24}.{value & 0xFFFFFF}")
    spellings.append(f"{value >> 24}.{(value >> 16) & 0xFF}.{value & 0xFFFF}")
    assert {canonicalize_host(s) for s in spellings} == {dotted}


@settings(max_examples=150)
@given(st.text(max_size=300))
def test_policy_file_raises_only_policy_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_policy(path)
        except PolicyError as exc:
            assert str(exc)  # noqa: PT017 - as above

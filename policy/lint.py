"""Lint: rules that are valid but probably not what their author meant.

Warnings, not errors (a policy with warnings still loads):
- a rule that can never decide: a later port-less ``**``/``!**`` matches everything
  after it, or a later rule in the same file with the same pattern and ports decides
  first (a later file repeating a preset's pattern is how presets are narrowed);
- an over-broad allow: a wildcard over a single label or a public suffix (``**.com``,
  ``*.co.uk``) or a CIDR allowing a /0-/7 IPv4 or /0-/15 IPv6 range;
- an allowlist that allows nothing, rules in open mode (ignored), silent entries the
  policy allows (silence only applies to refusals).
"""

from __future__ import annotations

from dataclasses import dataclass

from policy.decision import Mode
from policy.evaluate import Policy
from policy.patterns import Kind, Rule

__all__ = ["Finding", "lint_policy"]

# Two-label public suffixes under which a wildcard covers unrelated owners.
_PUBLIC_SUFFIXES = frozenset(
    {
        "co.uk", "org.uk", "ac.uk", "gov.uk", "com.au", "net.au", "org.au", "co.jp", "ne.jp",
        "com.br", "com.cn", "com.mx", "co.nz", "co.in", "co.za", "com.tw", "com.sg", "github.io",
        "herokuapp.com", "appspot.com", "cloudfront.net", "amazonaws.com", "azurewebsites.net",
        "vercel.app", "netlify.app", "pages.dev", "workers.dev", "ngrok.io", "ngrok-free.app",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Finding:
    where: str
    rule: str | None
    message: str

    def __str__(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        subject = f"rule {self.rule!r}: " if self.rule is not None else ""
        return f"{prefix}warning: {subject}{self.message}"


def lint_policy(policy: Policy) -> list[Finding]:
    rules = policy.rules
    found: list[Finding] = []
    where_of_policy = policy.source or policy.name
    if policy.mode is Mode.OPEN and rules:
        found.append(
            Finding(
                where_of_policy, None, "mode is open: the rules are ignored and nothing is proxied"
            )
        )
    if policy.mode is Mode.ALLOWLIST and rules and all(r.negated for r in rules):
        found.append(Finding(where_of_policy, None, "allowlist with only negations allows nothing"))
    found += _never_decides(rules)
    found += [Finding(r.where, r.text, msg) for r in rules if (msg := _over_broad(r)) is not None]
    for rule in policy.silent:
        if rule.kind is Kind.EXACT and policy.decide(rule.value, 443).allowed:
            found.append(
                Finding(
                    rule.where,
                    rule.text,
                    "is on the silent list but allowed; silence applies only to refusals",
                )
            )
    return found


def _never_decides(rules: tuple[Rule, ...]) -> list[Finding]:
    found = []
    last_any: Rule | None = None
    seen: dict[tuple[object, ...], Rule] = {}
    for rule in reversed(rules):
        key = (rule.kind, rule.value, rule.ports)
        if last_any is not None:
            found.append(
                Finding(
                    rule.where,
                    rule.text,
                    f"can never decide: the later rule {last_any.text!r} ({last_any.where or 'inline'}) "
                    "matches every destination; move it first or remove it",
                )
            )
        elif key in seen and _file(seen[key]) == _file(rule):
            # Across files it is the documented way to narrow a preset ("!api.x.ai"
            # after agent-default), so only a repeat within one file is reported.
            later = seen[key]
            found.append(
                Finding(
                    rule.where,
                    rule.text,
                    f"can never decide: the later rule {later.text!r} ({later.where or 'inline'}) "
                    "has the same pattern and ports; remove one",
                )
            )
        seen.setdefault(key, rule)
        if rule.kind is Kind.ANY and rule.ports is None and last_any is None:
            last_any = rule
    found.reverse()
    return found


def _file(rule: Rule) -> str:
    return rule.where.rsplit(":", 1)[0]


def _over_broad(rule: Rule) -> str | None:
    if rule.negated:
        return None
    if rule.kind in (Kind.ONE_LABEL, Kind.MULTI_LABEL):
        if "." not in rule.value:
            return f"over-broad: matches every name under the top-level domain {rule.value!r}; name the hosts"
        if rule.value in _PUBLIC_SUFFIXES:
            return f"over-broad: {rule.value!r} is a public suffix shared by unrelated owners; name the hosts"
    if rule.kind is Kind.CIDR and rule.network is not None:
        limit = 8 if rule.network.version == 4 else 16
        if rule.network.prefixlen < limit:
            return f"over-broad: {rule.network} allows a huge address range, private ones included; narrow it"
    return None

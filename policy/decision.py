"""The value every decision returns: verdict, the rule that decided, a reason and a code.

Audit events are built from a Decision, never re-derived. ``reason`` is the short
human text of DESIGN.md "Audit events" ("policy denial", "ip literal refused", ...)
and ``code`` its stable machine name; ``message`` is the one line an agent reads in
a 403 body.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

__all__ = ["REASONS", "Code", "Decision", "Mode", "Verdict"]


class Mode(StrEnum):
    ALLOWLIST = "allowlist"
    DENYLIST = "denylist"
    OPEN = "open"


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class Code(StrEnum):
    # allows
    RULE_ALLOWED = "rule_allowed"
    DEFAULT_ALLOWED = "default_allowed"  # denylist, no rule matched
    OPEN_MODE = "open_mode"
    # denials
    POLICY_DENIED = "policy_denied"
    IP_LITERAL_REFUSED = "ip_literal_refused"
    NON_PUBLIC_ADDRESS = "non_public_address"
    PORT_NOT_ALLOWED = "port_not_allowed"
    INVALID_HOST = "invalid_host"
    DECISION_ERROR = "decision_error"
    SECRET_EXFILTRATION = "secret_exfiltration"  # noqa: S105 - a code name, not a secret
    HOST_MISMATCH = "host_mismatch"
    PROXY_LOOP = "proxy_loop"


REASONS: dict[Code, str] = {
    Code.RULE_ALLOWED: "allowed by rule",
    Code.DEFAULT_ALLOWED: "no rule matched (denylist allows)",
    Code.OPEN_MODE: "open mode",
    Code.POLICY_DENIED: "policy denial",
    Code.IP_LITERAL_REFUSED: "ip literal refused",
    Code.NON_PUBLIC_ADDRESS: "non-public address",
    Code.PORT_NOT_ALLOWED: "port not allowed",
    Code.INVALID_HOST: "invalid host",
    Code.DECISION_ERROR: "decision error",
    Code.SECRET_EXFILTRATION: "secret exfiltration blocked",
    Code.HOST_MISMATCH: "host differs from CONNECT target",
    Code.PROXY_LOOP: "proxy loop refused",
}


class Decision(NamedTuple):
    """One verdict on one destination: an immutable value.

    A NamedTuple rather than a frozen dataclass because a decision is built on every
    connection and a frozen dataclass's __init__ costs ~1 µs of object.__setattr__.

    ``rule``/``rule_index`` name the deciding rule in the policy's flattened rule
    list (presets' rules first), or are None when the mode's default decided.
    ``detail`` is a one-line explanation for humans.
    """

    verdict: Verdict
    code: Code
    host: str
    port: int | None
    detail: str
    rule: str | None = None
    rule_index: int | None = None
    policy_name: str = "policy"

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW

    @property
    def reason(self) -> str:
        return REASONS[self.code]

    @property
    def message(self) -> str:
        """The one line an agent reads when refused (403 body)."""
        if self.allowed:
            return f"allowed by egress policy: {self.detail}"
        return (
            f"blocked by egress policy: {self.detail} (policy {self.policy_name}); "
            "ask your operator to add it"
            if self.code in (Code.POLICY_DENIED, Code.PORT_NOT_ALLOWED, Code.IP_LITERAL_REFUSED)
            else f"blocked by egress policy: {self.detail} (policy {self.policy_name})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "verdict": self.verdict.value,
            "rule": self.rule,
            "rule_index": self.rule_index,
            "reason": self.reason,
            "code": self.code.value,
        }


def deny(code: Code, host: str, port: int | None, detail: str, *, policy_name: str) -> Decision:
    """A denial that no rule decided (invalid host, decision error, ...)."""
    return Decision(Verdict.DENY, code, host, port, detail, policy_name=policy_name)

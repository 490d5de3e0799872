"""netwarden's error hierarchy. This module imports nothing of the project.

Every error a user can see is a ``GatewayError`` whose message says what failed,
where, and what to do about it.

    GatewayError
    ├── PolicyError              preset and policy authors must act
    │   ├── PatternInvalid       one rule string is not in the grammar
    │   ├── PresetInvalid        a policy/preset file is unreadable, mis-shaped,
    │   │                        names an unknown preset, or includes itself
    │   └── HostInvalid          a destination is not a host at all (NUL, CR/LF, ...)
    ├── OperatorError            whoever runs netwarden must act
    │   ├── DockerUnavailable    no engine answers, or it cannot do what a run needs
    │   ├── SpecInvalid          a sandbox spec is unsafe or malformed
    │   └── EnforcementUnavailable  egress cannot be confined (no privilege, no iptables)
    └── EgressRefused            a runtime denial; carries the Decision that refused
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DockerUnavailable",
    "EgressRefused",
    "EnforcementUnavailable",
    "GatewayError",
    "HostInvalid",
    "OperatorError",
    "PatternInvalid",
    "PolicyError",
    "PresetInvalid",
    "SpecInvalid",
    "escape_control",
]


class GatewayError(Exception):
    """Root of every error netwarden raises on purpose."""


class PolicyError(GatewayError):
    """Something in a policy, preset or destination must be fixed by its author."""


class PatternInvalid(PolicyError):
    """A rule string does not parse.

    ``where`` is "file:line" when known, ``rule`` the offending text, ``problem``
    what is wrong and ``hint`` the fix; the message joins them in that order:
    ``policy.yaml:7: rule "a*b.com": a wildcard must be ...; write "*.b.com"``.
    """

    def __init__(self, *, rule: str, problem: str, hint: str = "", where: str = "") -> None:
        self.rule = rule
        self.problem = problem
        self.hint = hint
        self.where = where
        super().__init__(self._render())

    def _render(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        tail = f"; {self.hint}" if self.hint else ""
        return f"{prefix}rule {_quote(self.rule)}: {self.problem}{tail}"

    def located(self, where: str) -> PatternInvalid:
        """The same error, placed at ``where`` (file:line)."""
        return PatternInvalid(rule=self.rule, problem=self.problem, hint=self.hint, where=where)


class PresetInvalid(PolicyError):
    """A policy or preset file cannot be loaded. Nothing of it is loaded."""

    def __init__(self, message: str, *, path: str = "", line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = path + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {message}" if where else message)


class HostInvalid(PolicyError):
    """A destination is not a host name or address; ``reason`` says why."""

    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        self.reason = reason
        super().__init__(f"invalid destination {_quote(host)}: {reason}")


class OperatorError(GatewayError):
    """The environment netwarden runs in must be fixed by its operator."""


class DockerUnavailable(OperatorError):
    """No docker engine answers, or it cannot do what the run needs."""


class SpecInvalid(OperatorError):
    """A sandbox spec is unsafe or malformed; the message names the field and the fix."""


class EnforcementUnavailable(OperatorError):
    """Egress cannot be confined to the proxy here (privilege, firewall tools)."""


class EgressRefused(GatewayError):
    """A destination was refused; ``decision`` is the policy Decision that refused it."""

    def __init__(self, decision: Any) -> None:
        # Typed as Any so this module stays free of project imports; it is a
        # policy.evaluate.Decision in practice.
        self.decision = decision
        super().__init__(str(getattr(decision, "message", decision)))


def escape_control(text: str) -> str:
    """``text`` with control and non-ASCII characters backslash-escaped, so input shown
    in a message, log line or event can never split or spoof the line it is shown in."""
    return text.encode("unicode_escape").decode("ascii")


def _quote(text: str) -> str:
    """Quote ``text`` for a message (escaped as by ``escape_control``)."""
    escaped = escape_control(text).replace('"', '\\"')
    if len(escaped) > 200:
        escaped = escaped[:200] + "..."
    return f'"{escaped}"'

"""Last-match-wins evaluation (DESIGN.md "Policy").

Rules are walked in order and the LAST rule that matches decides: allow, or deny
when negated. No match: allowlist denies, denylist allows, open allows.

Ports: a rule naming ports matches only those. In allowlist mode an allow rule
without ports matches only ``default_ports``, so another port needs a rule that
names it (and a match on a port-less rule does not hide an earlier rule that names
the port). Negations without ports match every port.

IP literals: name rules never match an address, so in allowlist mode an address is
allowed only by an IP/CIDR rule or ``**``. Address guard: a non-public address
(policy.addresses) is refused unless the deciding rule is an explicit IP/CIDR allow;
``**`` is not explicit. After DNS, ``check_addresses`` applies the same guard to
every resolved address, and IP/CIDR negations deny a name resolving into them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policy.addresses import AddressInfo, classify_address
from policy.decision import Code, Decision, Mode, Verdict, deny
from policy.errors import HostInvalid, escape_control
from policy.hosts import canonicalize_host, ip_value
from policy.matcher import Admit, Matcher
from policy.patterns import Rule

__all__ = ["DEFAULT_PORTS", "Policy", "PolicyTest"]

DEFAULT_PORTS: tuple[int, ...] = (80, 443)


@dataclass(frozen=True, slots=True)
class PolicyTest:
    """One ``tests:`` entry: ``host`` (optionally ``host:port``) must get ``expect``."""

    dest: str
    expect: Verdict
    code: Code | None = None
    silent: bool | None = None
    where: str = ""


@dataclass(frozen=True, eq=False)
class Policy:
    """A loaded, compiled policy. Build with policy.presets.load_policy or
    policy_from_rules; never half-built (construction validates everything)."""

    name: str
    mode: Mode
    rules: tuple[Rule, ...]
    default_ports: frozenset[int] = frozenset(DEFAULT_PORTS)
    silent: tuple[Rule, ...] = ()
    tests: tuple[PolicyTest, ...] = ()
    source: str | None = None
    description: str = ""
    _matcher: Matcher = field(init=False, repr=False)
    _silent: Matcher = field(init=False, repr=False)
    _admit: Admit = field(init=False, repr=False)  # ports each rule admits when deciding
    _admit_address: Admit = field(init=False, repr=False)  # ... when vouching for an address
    _admit_any: Admit = field(init=False, repr=False)

    def __post_init__(self) -> None:
        Ranges = tuple[tuple[int, int], ...] | None
        default: Ranges = tuple((p, p) for p in sorted(self.default_ports))
        admit: list[Ranges] = []
        admit_address: list[Ranges] = []
        for rule in self.rules:
            named: Ranges = ((rule.ports.low, rule.ports.high),) if rule.ports else None
            admit_address.append(named)
            if named is None and self.mode is Mode.ALLOWLIST and not rule.negated:
                named = default
            admit.append(named)
        object.__setattr__(self, "_matcher", Matcher(self.rules))
        object.__setattr__(self, "_silent", Matcher(self.silent))
        object.__setattr__(self, "_admit", tuple(admit))
        object.__setattr__(self, "_admit_address", tuple(admit_address))
        object.__setattr__(self, "_admit_any", (None,) * max(len(self.rules), len(self.silent)))

    # -- name-level decision -------------------------------------------------

    def decide(self, host: str, port: int) -> Decision:
        """Decide a destination by name (no DNS). Never raises: anything unexpected
        is a deny with Code.DECISION_ERROR (fail closed)."""
        try:
            return self._decide(host, port)
        except Exception as exc:  # a decision must never escape as an allow
            return deny(
                Code.DECISION_ERROR,
                _printable(host),
                port if isinstance(port, int) else None,
                f"internal error while deciding ({type(exc).__name__}); refused",
                policy_name=self.name,
            )

    def _decide(self, raw_host: str, port: int) -> Decision:
        try:
            host = canonicalize_host(raw_host)
        except HostInvalid as exc:
            return deny(
                Code.INVALID_HOST, _printable(raw_host), port, exc.reason, policy_name=self.name
            )
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            return deny(
                Code.INVALID_HOST,
                host,
                None,
                f"port {port!r} is not 1-65535",
                policy_name=self.name,
            )
        if self.mode is Mode.OPEN:
            return Decision(
                Verdict.ALLOW,
                Code.OPEN_MODE,
                host,
                port,
                "open mode: no egress control",
                policy_name=self.name,
            )
        ip = ip_value(host)
        host_is_ip = ip is not None
        index = self._matcher.last_match(host, ip, port, self._admit)
        if index is None:
            return self._no_match(host, host_is_ip, port)
        rule = self.rules[index]
        if rule.negated:
            return self._decision(
                Verdict.DENY,
                Code.POLICY_DENIED,
                host,
                port,
                f"{host} is denied by rule {rule.text!r}",
                index,
            )
        if host_is_ip:
            guarded = self._guard(host, port, classify_address(host), index)
            if guarded is not None:
                return guarded
        return self._decision(
            Verdict.ALLOW,
            Code.RULE_ALLOWED,
            host,
            port,
            f"{host}:{port} is allowed by rule {rule.text!r}",
            index,
        )

    def _no_match(self, host: str, host_is_ip: bool, port: int) -> Decision:
        if self.mode is Mode.DENYLIST:
            if host_is_ip:
                guarded = self._guard(host, port, classify_address(host), None)
                if guarded is not None:
                    return guarded
            return Decision(
                Verdict.ALLOW,
                Code.DEFAULT_ALLOWED,
                host,
                port,
                f"{host} matches no rule (denylist)",
                policy_name=self.name,
            )
        if host_is_ip:
            return self._decision(
                Verdict.DENY,
                Code.IP_LITERAL_REFUSED,
                host,
                port,
                f"{host} is an IP address and allowlist mode refuses IP literals unless an IP or CIDR rule allows them",
                None,
            )
        named = self._matcher.last_match(host, None, port, self._admit_any)
        if named is not None and not self.rules[named].negated:
            # The host is on the list, not on this port: say which ports it has.
            rule = self.rules[named]
            covered = (
                str(rule.ports) if rule.ports else ", ".join(map(str, sorted(self.default_ports)))
            )
            detail = (
                f"port {port} is not allowed for {host} (rule {rule.text!r} covers only ports "
                f'{covered}; a rule such as "{host}:{port}" would allow it)'
            )
            return self._decision(Verdict.DENY, Code.PORT_NOT_ALLOWED, host, port, detail, named)
        return self._decision(
            Verdict.DENY, Code.POLICY_DENIED, host, port, f"{host} is not on the allowlist", None
        )

    def _guard(self, host: str, port: int, info: AddressInfo, index: int | None) -> Decision | None:
        """Deny a non-public address unless rule ``index`` is an explicit IP/CIDR allow."""
        if info.public:
            return None
        if (
            index is not None
            and self.rules[index].is_address_rule
            and not self.rules[index].negated
        ):
            return None
        return self._decision(
            Verdict.DENY,
            Code.NON_PUBLIC_ADDRESS,
            host,
            port,
            f"{info.describe()} is not a public address; only an explicit IP/CIDR rule can allow it",
            None,
        )

    # -- after DNS ---------------------------------------------------------------

    def check_addresses(self, host: str, port: int, addresses: Iterable[str]) -> Decision:
        """The address guard on EVERY resolved address of ``host`` (already allowed by
        name). Deny if any is non-public without an explicit IP/CIDR allow, or falls
        in an IP/CIDR negation. Never raises."""
        try:
            return self._check_addresses(host, port, list(addresses))
        except Exception as exc:  # fail closed
            return deny(
                Code.DECISION_ERROR,
                _printable(host),
                port,
                f"internal error while checking addresses ({type(exc).__name__}); refused",
                policy_name=self.name,
            )

    def _check_addresses(self, host: str, port: int, addresses: Sequence[str]) -> Decision:
        if self.mode is Mode.OPEN:
            return Decision(
                Verdict.ALLOW, Code.OPEN_MODE, host, port, "open mode", policy_name=self.name
            )
        if not addresses:
            return deny(
                Code.DECISION_ERROR,
                host,
                port,
                f"{host} resolved to no address",
                policy_name=self.name,
            )
        for text in addresses:
            canonical = canonicalize_host(text)
            ip = ip_value(canonical)
            if ip is None:
                raise ValueError(f"{text!r} is not an IP address")
            index = self._matcher.last_address_match(ip, port, self._admit_address)
            info = classify_address(canonical)
            if index is not None and self.rules[index].negated:
                rule = self.rules[index].text
                detail = f"{host} resolves to {info.address}, which rule {rule!r} denies"
                return self._decision(Verdict.DENY, Code.POLICY_DENIED, host, port, detail, index)
            if not info.public and index is None:
                detail = (
                    f"{host} resolves to {info.describe()}, not a public address; "
                    "only an explicit IP/CIDR rule can allow it"
                )
                return self._decision(
                    Verdict.DENY, Code.NON_PUBLIC_ADDRESS, host, port, detail, None
                )
        shown = ", ".join(addresses[:4])
        return Decision(
            Verdict.ALLOW,
            Code.RULE_ALLOWED,
            host,
            port,
            f"{host} resolves to {shown}",
            policy_name=self.name,
        )

    # -- other queries -----------------------------------------------------------

    def is_silent(self, host: str) -> bool:
        """Whether a refusal of ``host`` is left out of the audit log (noise)."""
        try:
            canonical = canonicalize_host(host)
        except HostInvalid:
            return False
        return (
            self._silent.last_match(canonical, ip_value(canonical), 1, self._admit_any) is not None
        )

    def matching_rules(self, host: str, port: int) -> list[int]:
        """Every rule index that matches, in order (for `explain`; a plain scan)."""
        canonical = canonicalize_host(host)
        host_is_ip = ip_value(canonical) is not None
        return [
            i
            for i, rule in enumerate(self.rules)
            if rule.matches_host(canonical, host_is_ip) and self._port_ok(i, port)
        ]

    def _port_ok(self, index: int, port: int) -> bool:
        ranges = self._admit[index]
        return ranges is None or any(low <= port <= high for low, high in ranges)

    def _decision(
        self, verdict: Verdict, code: Code, host: str, port: int, detail: str, index: int | None
    ) -> Decision:
        rule = self.rules[index].text if index is not None else None
        return Decision(verdict, code, host, port, detail, rule, index, self.name)


def _printable(host: object) -> str:
    text = host if isinstance(host, str) else repr(host)
    return escape_control(text)[:256]

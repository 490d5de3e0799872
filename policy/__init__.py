"""The pure policy engine: rule grammar, canonicalisation, last-match-wins evaluation,
address classes, and policy/preset files. No sockets, no asyncio, no docker."""

from policy.addresses import AddressClass, AddressInfo, classify_address
from policy.decision import REASONS, Code, Decision, Mode, Verdict, deny
from policy.errors import (
    DockerUnavailable,
    EgressRefused,
    EnforcementUnavailable,
    GatewayError,
    HostInvalid,
    OperatorError,
    PatternInvalid,
    PolicyError,
    PresetInvalid,
    SpecInvalid,
)
from policy.evaluate import DEFAULT_PORTS, Policy, PolicyTest
from policy.hosts import canonicalize_host, split_host_port
from policy.patterns import Kind, PortRange, Rule, parse_rule
from policy.presets import load_policy, load_preset, policy_from_rules, preset_dir, preset_names

__all__ = [
    "DEFAULT_PORTS",
    "REASONS",
    "AddressClass",
    "AddressInfo",
    "Code",
    "Decision",
    "DockerUnavailable",
    "EgressRefused",
    "EnforcementUnavailable",
    "GatewayError",
    "HostInvalid",
    "Kind",
    "Mode",
    "OperatorError",
    "PatternInvalid",
    "Policy",
    "PolicyError",
    "PolicyTest",
    "PortRange",
    "PresetInvalid",
    "Rule",
    "SpecInvalid",
    "Verdict",
    "canonicalize_host",
    "classify_address",
    "deny",
    "load_policy",
    "load_preset",
    "parse_rule",
    "policy_from_rules",
    "preset_dir",
    "preset_names",
    "split_host_port",
]

"""`netwarden policy check | lint | test | explain` (DESIGN.md "CLI contract").

check: one verdict per destination; exit 0 all allowed, 3 some denied, 2 invalid
policy or usage. lint/test: exit 1 on any finding or failure. The decision is the
name-level one (no DNS) unless --resolve; IP-literal destinations get the full
decision since they need no lookup.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

from policy import (
    Code,
    Decision,
    Mode,
    Policy,
    PolicyError,
    PolicyTest,
    deny,
    load_policy,
    policy_from_rules,
    split_host_port,
)
from policy.errors import HostInvalid
from policy.lint import lint_policy

__all__ = ["register"]

DEFAULT_PRESET = "agent-default"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DENIED = 0, 1, 2, 3


def register(sub: argparse._SubParsersAction[Any]) -> None:
    policy = sub.add_parser("policy", help="check, lint, test and explain policies")
    cmds = policy.add_subparsers(dest="policy_command", required=True)

    check = cmds.add_parser("check", help="decide destinations against a policy")
    _policy_args(check)
    check.add_argument(
        "dests", nargs="+", metavar="DEST", help="host, host:port or an IP in any spelling"
    )
    check.add_argument("--json", action="store_true", help="one JSON line per destination")
    check.add_argument(
        "--resolve", action="store_true", help="also resolve names and apply the address guard"
    )
    check.set_defaults(func=cmd_check)

    explain = cmds.add_parser(
        "explain", help="show every rule that matches a destination, and which decided"
    )
    _policy_args(explain)
    explain.add_argument("dest", metavar="DEST")
    explain.set_defaults(func=cmd_explain)

    lint = cmds.add_parser("lint", help="validate policy files and warn about suspicious rules")
    lint.add_argument("files", nargs="+", metavar="FILE")
    lint.set_defaults(func=cmd_lint)

    test = cmds.add_parser("test", help="run the tests: section of policy files")
    test.add_argument("files", nargs="+", metavar="FILE")
    test.add_argument("-v", "--verbose", action="store_true", help="print passing cases too")
    test.set_defaults(func=cmd_test)


def _policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", metavar="FILE", help="policy file (YAML)")
    parser.add_argument(
        "--preset", action="append", default=[], metavar="NAME", help="add a preset's rules"
    )
    parser.add_argument("--rule", action="append", default=[], metavar="RULE", help="append a rule")
    parser.add_argument("--mode", choices=[m.value for m in Mode], help="override the mode")


def build_policy(args: argparse.Namespace) -> Policy:
    """The policy the flags describe: a file, then --preset and --rule appended."""
    if args.policy:
        base = load_policy(args.policy)
        if not (args.preset or args.rule or args.mode):
            return base
        return policy_from_rules(
            args.rule, presets=args.preset, mode=args.mode or base.mode, base=base
        )
    if not (args.preset or args.rule):
        print(
            f"netwarden: no --policy, --preset or --rule given; using preset {DEFAULT_PRESET}",
            file=sys.stderr,
        )
        args.preset = [DEFAULT_PRESET]
    return policy_from_rules(
        args.rule,
        presets=args.preset,
        mode=args.mode or Mode.ALLOWLIST,
        name="+".join(args.preset) or "inline",
    )


def decide_dest(policy: Policy, dest: str, *, resolve: bool = False) -> Decision:
    """Name-level decision for a CLI destination (default port 443)."""
    try:
        host, port = split_host_port(dest, default_port=443)
    except HostInvalid as exc:
        return deny(Code.INVALID_HOST, dest, None, exc.reason, policy_name=policy.name)
    assert port is not None
    decision = policy.decide(host, port)
    if resolve and decision.allowed and policy.mode is not Mode.OPEN:
        try:
            infos = socket.getaddrinfo(decision.host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return deny(
                Code.DECISION_ERROR,
                decision.host,
                port,
                f"DNS lookup failed: {exc}",
                policy_name=policy.name,
            )
        checked = policy.check_addresses(decision.host, port, sorted({str(i[4][0]) for i in infos}))
        if not checked.allowed:
            return checked
    return decision


def cmd_check(args: argparse.Namespace) -> int:
    try:
        policy = build_policy(args)
    except PolicyError as exc:
        print(f"netwarden: invalid policy:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK
    for dest in args.dests:
        decision = decide_dest(policy, dest, resolve=args.resolve)
        if not decision.allowed:
            status = EXIT_DENIED
        if args.json:
            print(
                json.dumps({"dest": dest, **decision.as_dict(), "detail": decision.detail}),
                flush=True,
            )
        else:
            print(_human(dest, decision, policy), flush=True)
    return status


def _human(dest: str, decision: Decision, policy: Policy) -> str:
    where = ""
    if decision.rule_index is not None and policy.rules[decision.rule_index].where:
        where = f" [{policy.rules[decision.rule_index].where}]"
    return f"{decision.verdict.value:5}  {dest}  {decision.code.value}: {decision.detail}{where}"


def cmd_explain(args: argparse.Namespace) -> int:
    try:
        policy = build_policy(args)
        host, port = split_host_port(args.dest, default_port=443)
    except PolicyError as exc:
        print(f"netwarden: {exc}", file=sys.stderr)
        return EXIT_USAGE
    assert port is not None
    decision = policy.decide(host, port)
    print(
        f"policy {policy.name} ({policy.mode.value}, {len(policy.rules)} rules); destination {decision.host}:{port}"
    )
    try:
        matches = policy.matching_rules(host, port)
    except HostInvalid:
        matches = []
    if not matches:
        print("  no rule matches")
    for index in matches:
        rule = policy.rules[index]
        mark = "  <- decides (last match wins)" if index == decision.rule_index else ""
        effect = "deny " if rule.negated else "allow"
        print(f"  #{index:<4} {effect} {rule.text:40} {rule.where}{mark}")
    print(f"verdict: {decision.verdict.value} ({decision.code.value}): {decision.detail}")
    return EXIT_OK if decision.allowed else EXIT_DENIED


def _load_all(files: list[str]) -> tuple[list[Policy], bool]:
    """Load every file, printing each load error; the policies and whether all loaded."""
    policies = []
    for file in files:
        try:
            policies.append(load_policy(file))
        except PolicyError as exc:
            print(f"error: {exc}")
    return policies, len(policies) == len(files)


def cmd_lint(args: argparse.Namespace) -> int:
    policies, all_loaded = _load_all(args.files)
    status = EXIT_OK if all_loaded else EXIT_FAILED
    for policy in policies:
        findings = lint_policy(policy)
        for finding in findings:
            print(finding)
        if findings:
            status = EXIT_FAILED
        else:
            print(f"{policy.source}: ok ({len(policy.rules)} rules, mode {policy.mode.value})")
    return status


def cmd_test(args: argparse.Namespace) -> int:
    policies, all_loaded = _load_all(args.files)
    status = EXIT_OK if all_loaded else EXIT_FAILED
    for policy in policies:
        failed = 0
        for case in policy.tests:
            decision = decide_dest(policy, case.dest)
            problem = _test_problem(policy, case, decision)
            if problem:
                failed += 1
                print(f"{case.where}: FAIL {case.dest}: {problem}")
            elif args.verbose:
                print(
                    f"{case.where}: ok {case.dest}: {decision.verdict.value} ({decision.code.value})"
                )
        if failed:
            status = EXIT_FAILED
        print(f"{policy.source}: {len(policy.tests) - failed} passed, {failed} failed")
    return status


def _test_problem(policy: Policy, case: PolicyTest, decision: Decision) -> str | None:
    """What is wrong with one ``tests:`` case, or None when it holds."""
    if decision.verdict is not case.expect or (
        case.code is not None and decision.code is not case.code
    ):
        want = case.expect.value + (f" ({case.code.value})" if case.code else "")
        got = f"{decision.verdict.value} ({decision.code.value}: {decision.detail})"
        return f"expected {want}, got {got}"
    if case.silent is not None and policy.is_silent(decision.host) is not case.silent:
        return (
            "expected silent (no audit event)"
            if case.silent
            else "expected an audit event, but it is silent"
        )
    return None

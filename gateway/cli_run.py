"""CLI: ``netwarden run``, ``netwarden sandbox reap``, ``netwarden doctor``, ``netwarden image build``.

``run`` exit codes: the command's own; 2 invalid policy, spec or usage; 125 netwarden
could not run the command (no engine with ``--sandbox docker``, no firewall privilege,
engine error); 130 Ctrl-C; 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gateway.run import (
    EXIT_CANNOT_RUN,
    RunRequest,
    SandboxMode,
    default_events_path,
    new_run_id,
    run_sync,
)
from policy import Mode, load_policy, policy_from_rules
from policy.errors import GatewayError, OperatorError, PolicyError, SpecInvalid
from sandbox import DEFAULT_IMAGE, RUN_ID_PATTERN, load_spec
from sandbox.doctor import failed, run_checks
from sandbox.reaper import reap_orphans
from sandbox.runtime import connect

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    run = sub.add_parser(
        "run",
        help="run a command in a sandbox whose only egress is the proxy",
        description="Run CMD in a throwaway container whose only way out is the netwarden "
        "proxy, then tear everything down. Exit code: CMD's own; 2 invalid input; 125 "
        "netwarden could not run it; 130 Ctrl-C; 143 SIGTERM.",
    )
    run.add_argument("--policy", type=Path, help="policy file (default: preset agent-default)")
    run.add_argument(
        "--sandbox",
        choices=[m.value for m in SandboxMode],
        default=SandboxMode.AUTO.value,
        help="auto: docker when an engine answers, else the host (warned); "
        "docker: docker or fail; none: the host (warned)",
    )
    run.add_argument("--image", default=DEFAULT_IMAGE, help=f"sandbox image ({DEFAULT_IMAGE})")
    run.add_argument("--events", type=Path, help=f"audit log ({default_events_path()})")
    run.add_argument("--run-id", help="run id (default: generated)")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    run.set_defaults(func=_cmd_run)

    sandbox = sub.add_parser("sandbox", help="manage sandboxes")
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    reap = sandbox_sub.add_parser("reap", help="remove leftovers of dead runs")
    reap.add_argument("--json", action="store_true")
    reap.set_defaults(func=_cmd_reap)

    doctor = sub.add_parser("doctor", help="check that sandboxes can be confined here")
    doctor.add_argument("--strict", action="store_true", help="warnings fail too")
    doctor.add_argument("--json", action="store_true", help="one JSON object per check")
    doctor.add_argument("--policy", type=Path, help="also load and lint this policy")
    doctor.add_argument("--image", default=DEFAULT_IMAGE)
    doctor.set_defaults(func=_cmd_doctor)

    image = sub.add_parser("image", help="sandbox images")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help=f"build {DEFAULT_IMAGE} locally (no registry)")
    build.add_argument("--tag", default=DEFAULT_IMAGE)
    build.set_defaults(func=_cmd_image_build)


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f"netwarden: error: {message}\n")
    return code


def _cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        return _fail(2, "no command given; write `netwarden run [OPTIONS] -- CMD ...`")
    run_id = args.run_id or new_run_id()
    if not RUN_ID_PATTERN.match(run_id):
        return _fail(
            2,
            f"--run-id {run_id!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit",
        )
    try:
        policy = (
            load_policy(args.policy)
            if args.policy is not None
            else policy_from_rules(
                [], mode=Mode.ALLOWLIST, presets=["agent-default"], name="agent-default"
            )
        )
        spec = load_spec(image=args.image)
    except (PolicyError, SpecInvalid) as exc:
        return _fail(2, str(exc))
    request = RunRequest(
        argv=tuple(argv),
        policy=policy,
        run_id=run_id,
        sandbox=SandboxMode(args.sandbox),
        spec=spec,
        events=args.events if args.events is not None else default_events_path(),
    )
    try:
        return run_sync(request)
    except SpecInvalid as exc:
        return _fail(2, str(exc))
    except OperatorError as exc:
        return _fail(EXIT_CANNOT_RUN, str(exc))
    except GatewayError as exc:
        return _fail(EXIT_CANNOT_RUN, str(exc))


def _cmd_reap(args: argparse.Namespace) -> int:
    try:
        runtime = connect()
    except GatewayError as exc:
        sys.stderr.write(f"netwarden: {exc}; reaping firewall rules only\n")
        runtime = None
    report = reap_orphans(runtime)
    if args.json:
        print(
            json.dumps(
                {
                    "containers": report.containers,
                    "networks": report.networks,
                    "firewall_keys": report.firewall_keys,
                    "errors": report.errors,
                }
            )
        )
    else:
        print(
            f"removed {len(report.containers)} containers, {len(report.networks)} networks, "
            f"{len(report.firewall_keys)} firewall chain sets of dead runs"
        )
        for error in report.errors:
            sys.stderr.write(f"netwarden: could not remove {error}\n")
    return 1 if report.errors else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    checks = run_checks(image=args.image, policy_path=args.policy)
    for check in checks:
        print(json.dumps(check.as_dict()) if args.json else check.line())
    return 1 if failed(checks, strict=args.strict) else 0


def _cmd_image_build(args: argparse.Namespace) -> int:
    try:
        image_id = connect().build_base_image(args.tag)
    except GatewayError as exc:
        return _fail(1, str(exc))
    print(f"built {args.tag} ({image_id[:19]})")
    return 0

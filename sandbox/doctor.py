"""``netwarden doctor``: can this machine run confined sandboxes? One line per check.

Checks, in order: the engine answers; its API version is one we were tried with
(>= 1.41); the sandbox image is present; this process may change the host firewall
(without it egress cannot be confined); the default sandbox spec passes the safety
checks; the run policy (if given) loads and lints clean. Each ``Check`` is pass, warn or
fail with a remediation line; ``failed(strict)`` says whether the command exits 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from policy import load_policy, policy_from_rules
from policy.errors import GatewayError
from policy.lint import lint_policy

from . import firewall
from .image import DEFAULT_IMAGE
from .runtime import ContainerRuntime, connect
from .spec import SandboxSpec, check_spec_safety

__all__ = ["Check", "Status", "failed", "run_checks"]

_MIN_API = (1, 41)


class Status(StrEnum):
    PASS = "pass"  # noqa: S105  # a check status, not a password
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    def line(self) -> str:
        fix = f"\n       fix: {self.fix}" if self.fix and self.status is not Status.PASS else ""
        return f"[{self.status.value}] {self.name}: {self.detail}{fix}"


def failed(checks: list[Check], *, strict: bool) -> bool:
    bad = {Status.FAIL, Status.WARN} if strict else {Status.FAIL}
    return any(c.status in bad for c in checks)


def run_checks(
    *,
    image: str = DEFAULT_IMAGE,
    policy_path: Path | None = None,
    spec: SandboxSpec | None = None,
    connector: Callable[[], ContainerRuntime] = connect,
) -> list[Check]:
    checks: list[Check] = []
    runtime: ContainerRuntime | None
    try:
        runtime = connector()
        info = runtime.info()
        checks.append(Check("engine", Status.PASS, f"docker engine {info.version} answers"))
    except GatewayError as exc:
        runtime = None
        checks.append(
            Check(
                "engine",
                Status.FAIL,
                str(exc),
                "start the engine (scripts/ensure-docker) or use --sandbox none (unconfined)",
            )
        )
    if runtime is not None:
        version = tuple(int(p) for p in info.api_version.split(".")[:2] if p.isdigit())
        if version >= _MIN_API:
            checks.append(Check("api", Status.PASS, f"API {info.api_version}"))
        else:
            checks.append(
                Check(
                    "api",
                    Status.WARN,
                    f"API {info.api_version} is older than 1.41, which netwarden was tried on",
                    "upgrade the engine (Debian's docker.io 20.10 or later)",
                )
            )
        try:
            present = runtime.image_present(image)
        except GatewayError as exc:
            checks.append(Check("image", Status.FAIL, str(exc), "check the engine"))
        else:
            checks.append(
                Check("image", Status.PASS, f"{image} present")
                if present
                else Check(
                    "image",
                    Status.WARN,
                    f"{image} is not present (the default one is built on first run)",
                    "run `netwarden image build`",
                )
            )
    problem = firewall.probe_privilege()
    checks.append(
        Check("egress", Status.PASS, "can install firewall rules confining sandboxes to the proxy")
        if problem is None
        else Check(
            "egress",
            Status.FAIL,
            f"egress cannot be confined: {problem}",
            "run netwarden as root (or with CAP_NET_ADMIN); `--sandbox auto` would run "
            "sandboxes unconfined",
        )
    )
    try:
        check_spec_safety(spec or SandboxSpec())
        checks.append(Check("spec", Status.PASS, "sandbox spec passes the safety checks"))
    except GatewayError as exc:
        checks.append(
            Check("spec", Status.FAIL, str(exc), "fix the sandbox spec as the message says")
        )
    # the run policy as `netwarden run` would load it (the agent-default preset by default)
    shown = str(policy_path) if policy_path is not None else "preset agent-default"
    try:
        policy = (
            load_policy(str(policy_path))
            if policy_path is not None
            else policy_from_rules([], presets=["agent-default"], name="agent-default")
        )
        findings = lint_policy(policy)
    except GatewayError as exc:
        checks.append(Check("policy", Status.FAIL, str(exc), "fix the policy file"))
    else:
        checks.append(
            Check("policy", Status.PASS, f"{shown} loads and lints clean")
            if not findings
            else Check(
                "policy",
                Status.WARN,
                "; ".join(str(f) for f in findings),
                f"run `netwarden policy lint {policy_path or 'presets/agent-default.yaml'}`",
            )
        )
    return checks

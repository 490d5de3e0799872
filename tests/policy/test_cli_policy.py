"""`netwarden policy ...` through the real console script (DESIGN.md "CLI contract")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NETWARDEN = [sys.executable, "-m", "gateway.cli"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NETWARDEN, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def test_check_json_lines_and_exit_3_when_some_denied() -> None:
    proc = run(
        "policy", "check", "--preset", "agent-default", "--json",
        "api.anthropic.com", "evil.site:443", "0xA9FEA9FE", "[::ffff:127.0.0.1]:80", "api.openai.com:8443",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(x["dest"], x["host"], x["port"], x["verdict"], x["code"]) for x in lines] == [
        ("api.anthropic.com", "api.anthropic.com", 443, "allow", "rule_allowed"),
        ("evil.site:443", "evil.site", 443, "deny", "policy_denied"),
        ("0xA9FEA9FE", "169.254.169.254", 443, "deny", "ip_literal_refused"),
        ("[::ffff:127.0.0.1]:80", "127.0.0.1", 80, "deny", "ip_literal_refused"),
        ("api.openai.com:8443", "api.openai.com", 8443, "deny", "port_not_allowed"),
    ]
    first = lines[0]
    assert set(first) >= {"dest", "host", "port", "verdict", "rule", "rule_index", "reason", "code"}
    assert first["rule"] is not None
    assert isinstance(first["rule_index"], int)
    assert lines[1]["reason"] == "policy denial"
    assert lines[1]["rule"] is None


def test_check_exit_0_when_all_allowed() -> None:
    proc = run(
        "policy", "check", "--rule", "**.x.com", "--rule", "10.0.0.0/8", "a.x.com", "10.1.1.1:443"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["allow", "allow"]


def test_check_exit_2_on_invalid_policy() -> None:
    proc = run("policy", "check", "--rule", "a*b.com", "a.com")
    assert proc.returncode == 2
    assert 'rule "a*b.com": a wildcard must be a whole leading label' in proc.stderr


def test_check_exit_2_on_usage_error() -> None:
    proc = run("policy", "check", "--mode", "sometimes", "a.com")
    assert proc.returncode == 2


def test_check_policy_file_mode_override(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("mode: allowlist\nrules: ['!evil.site']\n")
    proc = run(
        "policy",
        "check",
        "--policy",
        str(tmp_path / "p.yaml"),
        "--mode",
        "denylist",
        "fine.site",
        "--json",
    )
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["code"] == "default_allowed"


def test_lint_and_test_pass_on_shipped_presets() -> None:
    presets = sorted(str(p) for p in (Path(__file__).parents[2] / "presets").glob("*.yaml"))
    assert run("policy", "lint", *presets).returncode == 0
    proc = run("policy", "test", *presets)
    assert proc.returncode == 0, proc.stdout
    assert " 0 failed" in proc.stdout


def test_lint_exit_1_on_warning_and_error(tmp_path: Path) -> None:
    (tmp_path / "broad.yaml").write_text("rules: ['**.com', api.x.com, '**']\n")
    (tmp_path / "broken.yaml").write_text("rules: ['a*b.com']\n")
    proc = run(
        "policy", "lint", str(tmp_path / "broad.yaml"), str(tmp_path / "broken.yaml"), cwd=tmp_path
    )
    assert proc.returncode == 1
    assert (
        "broad.yaml:1: warning: rule '**.com': can never decide: the later rule '**'" in proc.stdout
    )
    assert (
        "warning: rule '**.com': over-broad: matches every name under the top-level domain 'com'"
        in proc.stdout
    )
    assert 'error: broken.yaml:1: rule "a*b.com"' in proc.stdout


def test_test_exit_1_on_failed_expectation(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "rules: [a.com]\ntests:\n  - {host: a.com, expect: allow}\n  - {host: b.com, expect: allow}\n"
        "  - {host: '127.1', expect: deny, code: ip_literal_refused}\n"
    )
    proc = run("policy", "test", "p.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert (
        "p.yaml:4: FAIL b.com: expected allow, got deny (policy_denied: b.com is not on the allowlist)"
        in proc.stdout
    )
    assert "p.yaml: 2 passed, 1 failed" in proc.stdout


def test_explain_lists_matches_in_order_and_the_decider() -> None:
    proc = run(
        "policy",
        "explain",
        "--rule",
        "**.x.com",
        "--rule",
        "!bad.x.com",
        "--rule",
        "*.x.com",
        "bad.x.com",
    )
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["#0", "#1", "#2"]
    assert "<- decides" in lines[3]
    assert lines[-1].startswith("verdict: allow (rule_allowed)")


@pytest.mark.parametrize("dest", ["a.com:0", "a b.com", "x\x01y.com", "a.com\r\nX: y"])
def test_check_invalid_destination_is_a_denial(dest: str) -> None:
    proc = run("policy", "check", "--rule", "**", "--json", dest)
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["code"] == "invalid_host"


def test_test_checks_silence(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "rules: [a.com, '!**.sentry.io']\nsilent: ['**.sentry.io']\ntests:\n"
        "  - {host: o1.ingest.sentry.io, expect: deny, silent: true}\n"
        "  - {host: evil.example, expect: deny, silent: true}\n"
    )
    proc = run("policy", "test", "p.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert "p.yaml:5: FAIL evil.example: expected silent (no audit event)" in proc.stdout
    assert "1 passed, 1 failed" in proc.stdout


def test_lint_accepts_narrowing_a_preset_but_not_a_repeat_in_one_file(tmp_path: Path) -> None:
    (tmp_path / "narrow.yaml").write_text("presets: [llm-providers]\nrules: ['!api.x.ai']\n")
    (tmp_path / "repeat.yaml").write_text("rules: [a.com, '!a.com']\n")
    assert run("policy", "lint", "narrow.yaml", cwd=tmp_path).returncode == 0
    proc = run("policy", "lint", "repeat.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert "warning: rule 'a.com': can never decide: the later rule '!a.com'" in proc.stdout

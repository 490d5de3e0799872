"""Policy and preset files: each bad file gives one pinned message, nothing half-loads,
and every shipped preset loads, lints clean and passes its own tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policy import Mode, PolicyError, Verdict, load_policy, load_preset, preset_dir, preset_names
from policy.lint import lint_policy

BAD = Path(__file__).parent / "bad"


@pytest.fixture(autouse=True)
def _in_test_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    # Messages show paths relative to the working directory.
    monkeypatch.chdir(Path(__file__).parent)


BAD_FILES = [
    ("mid-label-wildcard.yaml", 'bad/mid-label-wildcard.yaml:4: rule "a*b.com": a wildcard must be a whole leading label; write "*.b.com" or "**.b.com"'),
    ("unknown-key.yaml", "bad/unknown-key.yaml:2: unknown key 'rulez'; expected one of: name, description, mode, presets, rules, default_ports, silent, tests"),
    ("bad-mode.yaml", "bad/bad-mode.yaml:1: mode: Input should be 'allowlist', 'denylist' or 'open'; write allowlist, denylist or open"),
    ("rule-not-string.yaml", 'bad/rule-not-string.yaml:4: rules[1]: Input should be a valid string; write each rule as a string, e.g. "api.example.com"'),
    ("continuation-line.yaml", 'bad/continuation-line.yaml:3: rule "api.x.com - b.com": contains whitespace or a control character; remove it'),
    ("unclosed-flow.yaml", "bad/unclosed-flow.yaml:3: not valid YAML: expected ',' or ']', but got '<stream end>'"),
    ("empty.yaml", "bad/empty.yaml: the file is empty; a policy needs at least `mode:` or `rules:`"),
    ("top-level-list.yaml", "bad/top-level-list.yaml:1: the top level must be a mapping (mode:, presets:, rules:, ...)"),
    ("cycle-a.yaml", "bad/cycle-b.yaml:1: preset cycle: bad/cycle-a.yaml -> bad/cycle-b.yaml -> bad/cycle-a.yaml; remove one of these includes"),
    ("unknown-preset.yaml", "bad/unknown-preset.yaml:1: unknown preset 'no-such-preset'; known presets: "),
    ("several-errors.yaml", 'bad/several-errors.yaml:2: rule "x.com:99999": port \'99999\' is out of range; ports are 1-65535\nbad/several-errors.yaml:3: rule "!": a bare \'!\' negates nothing; write "!host", e.g. "!evil.example"\nbad/several-errors.yaml:4: rule "10.0.0.1/8": the CIDR has host bits set; write "10.0.0.0/8"'),
    ("bad-default-port.yaml", "bad/bad-default-port.yaml:2: default_ports: Value error, ports must be 1-65535, got [0]; list ports, e.g. [80, 443]"),
    ("bad-test-expect.yaml", "bad/bad-test-expect.yaml:3: tests[0].expect: Input should be 'allow' or 'deny'; write each test as {host: api.example.com, expect: allow}"),
    ("duplicate-key.yaml", "bad/duplicate-key.yaml:2: key 'presets' appears twice (first on line 1); merge them into one"),
    ("duplicate-nested-key.yaml", "bad/duplicate-nested-key.yaml:4: key 'host' appears twice (first on line 4); merge them into one"),
    ("no-such-file.yaml", "bad/no-such-file.yaml: no such file; check the path"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "message"), BAD_FILES, ids=[n for n, _ in BAD_FILES])
def test_bad_file_message(name: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(Path("bad") / name)
    assert str(info.value).startswith(message)


def test_every_bad_file_is_covered() -> None:
    covered = {name for name, _ in BAD_FILES} | {"cycle-b.yaml"}
    assert {p.name for p in BAD.glob("*.yaml")} <= covered


def test_good_file_with_presets_relative_path(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("rules: [base.example]\nsilent: [noise.example]\n")
    (tmp_path / "run.yaml").write_text(
        "mode: allowlist\npresets: [base.yaml, llm-providers]\nrules: ['!api.openai.com']\n"
        "tests:\n  - {host: base.example, expect: allow}\n  - {host: 'api.openai.com:443', expect: deny}\n"
    )
    policy = load_policy(tmp_path / "run.yaml")
    assert policy.rules[0].text == "base.example"
    assert policy.rules[-1].text == "!api.openai.com"
    assert policy.decide("api.openai.com", 443).verdict is Verdict.DENY
    assert policy.decide("api.anthropic.com", 443).verdict is Verdict.ALLOW
    assert policy.is_silent("noise.example")
    assert [t.dest for t in policy.tests] == ["base.example", "api.openai.com:443"]


def test_diamond_include_expands_once(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("rules: [d.example]\n")
    (tmp_path / "b.yaml").write_text("presets: [d.yaml]\nrules: [b.example]\n")
    (tmp_path / "c.yaml").write_text("presets: [d.yaml]\nrules: [c.example]\n")
    (tmp_path / "a.yaml").write_text("presets: [b.yaml, c.yaml]\n")
    policy = load_policy(tmp_path / "a.yaml")
    assert [r.text for r in policy.rules] == ["d.example", "b.example", "c.example"]


def test_rule_positions_are_file_lines(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "# comment\nmode: allowlist\nrules:\n  - a.example\n\n  - b.example\n"
    )
    policy = load_policy(tmp_path / "p.yaml")
    assert [r.where.rsplit(":", 1)[1] for r in policy.rules] == ["4", "6"]


@pytest.mark.parametrize("name", preset_names())
def test_shipped_preset_loads_lints_and_passes_its_tests(name: str) -> None:
    policy = load_preset(name)
    assert policy.tests, f"preset {name} has no tests: section"
    assert [str(f) for f in lint_policy(policy)] == []
    for case in policy.tests:
        host, _, port = (
            case.dest.rpartition(":") if case.dest.count(":") == 1 else (case.dest, "", "443")
        )
        decision = policy.decide(host, int(port))
        assert decision.verdict is case.expect, f"{case.where}: {case.dest}: {decision.detail}"


def test_agent_default_composes_the_others() -> None:
    policy = load_preset("agent-default")
    assert policy.mode is Mode.ALLOWLIST
    for needed in (
        "api.anthropic.com",
        "pypi.org",
        "registry.npmjs.org",
        "github.com",
        "deb.debian.org",
    ):
        assert policy.decide(needed, 443).allowed, needed
    for refused in ("evil.example", "169.254.169.254", "10.0.0.1", "1.1.1.1"):
        assert not policy.decide(refused, 443).allowed, refused


def test_presets_ship_in_the_package_folder() -> None:
    assert (preset_dir() / "agent-default.yaml").is_file()
    assert os.path.samefile(preset_dir(), Path(__file__).parents[2] / "presets")

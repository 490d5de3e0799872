"""Policy and preset files (YAML) -> a compiled Policy, or one error naming every problem.

A file is read whole, its YAML composed once to learn each item's line, validated
with pydantic (policy.models), its presets expanded depth-first (a preset's rules
come before the rules of the file that includes it, in the order listed; a cycle is
an error) and every rule parsed. Nothing half-loads: any problem raises before a
Policy exists.

Preset names resolve to ``<name>.yaml`` in the shipped ``presets/`` folder, or, when
the name contains "/" or ends in ".yaml", to a path relative to the including file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from policy.decision import Mode, Verdict
from policy.errors import HostInvalid, PatternInvalid, PolicyError, PresetInvalid
from policy.evaluate import DEFAULT_PORTS, Policy, PolicyTest
from policy.hosts import split_host_port
from policy.models import PolicyFile
from policy.patterns import Rule, parse_rule

__all__ = ["load_policy", "load_preset", "policy_from_rules", "preset_dir", "preset_names"]

MAX_FILE_BYTES = 1 << 20


def preset_dir() -> Path:
    """The folder of shipped presets: ``presets/`` beside the ``policy`` package, both
    in a source checkout and in an installed wheel (which ships it as data)."""
    return Path(__file__).resolve().parent.parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in preset_dir().glob("*.yaml"))


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Load a policy or preset file. Raises PolicyError with every problem found."""
    file = Path(path)
    loaded = _load_file(file, stack=(), included=set())
    pf = loaded.model
    return _build(
        name=pf.name or file.stem,
        mode=pf.mode or Mode.ALLOWLIST,
        rules=loaded.rules,
        default_ports=pf.default_ports,
        silent=loaded.silent,
        tests=loaded.tests,
        source=_display(file),
        description=pf.description,
    )


def load_preset(name: str) -> Policy:
    return load_policy(_resolve_preset(name, base=None, where=""))


def policy_from_rules(
    rules: Iterable[str] = (),
    *,
    mode: Mode | str = Mode.ALLOWLIST,
    presets: Sequence[str] = (),
    default_ports: Sequence[int] | None = None,
    silent: Iterable[str] = (),
    name: str = "inline",
    base: Policy | None = None,
) -> Policy:
    """A policy from rule strings (and presets by name), appended after ``base`` if given."""
    errors: list[str] = []
    all_rules: list[Rule] = list(base.rules) if base else []
    all_silent: list[Rule] = list(base.silent) if base else []
    included: set[Path] = set()
    for preset in presets:
        try:
            loaded = _load_file(_resolve_preset(preset, base=None, where="--preset"), (), included)
        except PolicyError as exc:
            errors.append(str(exc))
            continue
        all_rules += loaded.rules
        all_silent += loaded.silent
    all_rules += _parse_rules(rules, lambda _: "", errors)
    all_silent += _parse_rules(silent, lambda _: "", errors)
    if errors:
        raise PresetInvalid("\n".join(errors))
    try:
        policy_mode = Mode(mode)
    except ValueError:
        raise PresetInvalid(f"mode {mode!r} is not one of allowlist, denylist, open") from None
    ports = (
        tuple(default_ports)
        if default_ports is not None
        else (tuple(base.default_ports) if base else None)
    )
    return _build(
        name=base.name if base else name,
        mode=policy_mode,
        rules=all_rules,
        default_ports=ports,
        silent=all_silent,
        tests=base.tests if base else (),
        source=base.source if base else None,
        description=base.description if base else "",
    )


def _build(
    *,
    name: str,
    mode: Mode,
    rules: Sequence[Rule],
    default_ports: Sequence[int] | None,
    silent: Sequence[Rule],
    tests: Sequence[PolicyTest],
    source: str | None,
    description: str,
) -> Policy:
    if default_ports is not None and not all(
        isinstance(p, int) and 1 <= p <= 65535 for p in default_ports
    ):
        raise PresetInvalid(f"default_ports must be ports 1-65535, got {list(default_ports)}")
    return Policy(
        name=name,
        mode=mode,
        rules=tuple(rules),
        default_ports=frozenset(default_ports if default_ports is not None else DEFAULT_PORTS),
        silent=tuple(silent),
        tests=tuple(tests),
        source=source,
        description=description,
    )


# -- one file ------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    model: PolicyFile
    rules: list[Rule]
    silent: list[Rule]
    tests: list[PolicyTest]


def _load_file(file: Path, stack: tuple[Path, ...], included: set[Path]) -> _Loaded:
    """Load ``file``; ``stack`` is the chain of files including it (cycle check) and
    ``included`` every preset already expanded in this load: a preset reached twice
    (a diamond: a includes b and c, both include d) is expanded only the first time."""
    shown = _display(file)
    text = _read(file, shown)
    data, lines = _parse_yaml(text, shown)
    try:
        model = PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise PresetInvalid("\n".join(_validation_lines(exc, shown, lines))) from None
    errors: list[str] = []
    rules: list[Rule] = []
    silent: list[Rule] = []
    real = file.resolve()
    for i, name in enumerate(model.presets):
        where = _where(shown, lines, ("presets", i))
        try:
            target = _resolve_preset(name, base=file.parent, where=where).resolve()
            if target in (*stack, real):
                chain = " -> ".join(_display(p) for p in (*stack, real, target))
                raise PresetInvalid(
                    f"preset cycle: {chain}; remove one of these includes", path=where
                )
            if target in included:
                continue
            included.add(target)
            loaded = _load_file(target, (*stack, real), included)
        except PolicyError as exc:
            errors.append(str(exc))
            continue
        rules += loaded.rules
        silent += loaded.silent
    rules += _parse_rules(model.rules, lambda i: _where(shown, lines, ("rules", i)), errors)
    silent += _parse_rules(model.silent, lambda i: _where(shown, lines, ("silent", i)), errors)
    tests = []
    for i, case in enumerate(model.tests):
        where = _where(shown, lines, ("tests", i))
        try:
            _, port = split_host_port(case.host)
        except HostInvalid as exc:
            errors.append(f"{where}: tests[{i}]: {exc}")
            continue
        if port is not None and case.port is not None and port != case.port:
            errors.append(
                f"{where}: tests[{i}]: port given twice ({port} and {case.port}); keep one"
            )
            continue
        dest = case.host if port is not None or case.port is None else f"{case.host}:{case.port}"
        tests.append(
            PolicyTest(
                dest=dest,
                expect=Verdict(case.expect),
                code=case.code,
                silent=case.silent,
                where=where,
            )
        )
    if errors:
        raise PresetInvalid("\n".join(errors))
    return _Loaded(model, rules, silent, tests)


def _parse_rules(
    texts: Iterable[str], where_of: Callable[[int], str], errors: list[str]
) -> list[Rule]:
    out = []
    for i, text in enumerate(texts):
        try:
            out.append(parse_rule(text, where=where_of(i)))
        except PatternInvalid as exc:
            errors.append(str(exc))
    return out


def _read(file: Path, shown: str) -> str:
    try:
        if file.stat().st_size > MAX_FILE_BYTES:
            raise PresetInvalid(
                f"file is over {MAX_FILE_BYTES} bytes; split it into presets", path=shown
            )
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PresetInvalid("no such file; check the path", path=shown) from None
    except IsADirectoryError:
        raise PresetInvalid("is a directory; give a .yaml file", path=shown) from None
    except UnicodeDecodeError:
        raise PresetInvalid("is not UTF-8 text", path=shown) from None
    except OSError as exc:
        raise PresetInvalid(f"cannot be read ({exc.strerror})", path=shown) from None


_Lines = dict[tuple[str, int] | tuple[str], int]


def _parse_yaml(text: str, shown: str) -> tuple[object, _Lines]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise PresetInvalid(f"not valid YAML: {problem}", path=shown, line=line) from None
    if node is None or data is None:
        raise PresetInvalid(
            "the file is empty; a policy needs at least `mode:` or `rules:`", path=shown
        )
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        raise PresetInvalid(
            "the top level must be a mapping (mode:, presets:, rules:, ...)", path=shown, line=1
        )
    _refuse_duplicate_keys(node, shown)
    lines: _Lines = {}
    for key_node, value_node in node.value:
        key = str(key_node.value)
        lines[(key,)] = key_node.start_mark.line + 1
        if isinstance(value_node, yaml.SequenceNode):
            for i, item in enumerate(value_node.value):
                lines[(key, i)] = item.start_mark.line + 1
    return data, lines


def _refuse_duplicate_keys(node: yaml.Node, shown: str) -> None:
    """YAML lets a later ``rules:`` silently replace an earlier one; for a security
    policy that would drop rules unseen, so a repeated key is an error."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise PresetInvalid(
                    f"key {key!r} appears twice (first on line {seen[key]}); merge them into one",
                    path=shown,
                    line=line,
                )
            seen[key] = line
            _refuse_duplicate_keys(value_node, shown)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, shown)


_HINTS = {
    "rules": 'write each rule as a string, e.g. "api.example.com"',
    "silent": 'write each entry as a host pattern string, e.g. "**.ingest.sentry.io"',
    "presets": "list preset names or .yaml paths, e.g. [agent-default]",
    "mode": "write allowlist, denylist or open",
    "default_ports": "list ports, e.g. [80, 443]",
    "tests": "write each test as {host: api.example.com, expect: allow}",
}


def _where(shown: str, lines: _Lines, loc: tuple[str, int] | tuple[str]) -> str:
    line = lines.get(loc) or lines.get(loc[:1])
    return f"{shown}:{line}" if line else shown


def _validation_lines(exc: ValidationError, shown: str, lines: _Lines) -> list[str]:
    known = ", ".join(PolicyFile.model_fields)
    out = []
    for err in exc.errors():
        loc = err["loc"]
        key = (str(loc[0]), loc[1]) if len(loc) > 1 and isinstance(loc[1], int) else (str(loc[0]),)
        where = _where(shown, lines, key)
        dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        if err["type"] == "extra_forbidden":
            message = f"unknown key {dotted!r}; expected one of: {known}"
        else:
            hint = _HINTS.get(str(loc[0]))
            message = f"{dotted}: {err['msg']}" + (f"; {hint}" if hint else "")
        out.append(f"{where}: {message}")
    return out


def _resolve_preset(name: str, base: Path | None, where: str) -> Path:
    prefix = f"{where}: " if where else ""
    if "/" in name or name.endswith((".yaml", ".yml")):
        path = Path(name) if base is None or Path(name).is_absolute() else base / name
        if not path.is_file():
            raise PresetInvalid(f"{prefix}preset file {name!r} not found")
        return path
    path = preset_dir() / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(preset_names()) or "(none shipped)"
        raise PresetInvalid(
            f"{prefix}unknown preset {name!r}; known presets: {known} (or give a path to a .yaml file)"
        )
    return path


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve()) if path.is_absolute() else str(path)

"""Every module imports on its own, in a fresh interpreter (no hidden import-order
dependencies or cycles), and the pure core stays pure (import-linter checks the
contracts in pyproject.toml during `make lint`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("policy", "gateway", "sandbox")


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            found.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return found


def test_each_module_imports_alone() -> None:
    modules = _modules()
    assert len(modules) > 20
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", f"import {name}"], cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        for name in modules
    }
    failures = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            failures[name] = err.strip().splitlines()[-1:]
    assert failures == {}


def test_policy_never_loads_asyncio_or_docker() -> None:
    # (socket is loaded by netaddr for inet_pton; import-linter forbids policy importing it.)
    code = (
        "import sys, policy, policy.lint; "
        "bad = sorted(m for m in ('asyncio', 'docker', 'aiohttp', 'gateway', 'sandbox') if m in sys.modules); "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""

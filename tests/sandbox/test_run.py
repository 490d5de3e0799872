"""``netwarden run`` end to end, as a subprocess, on a real engine and the real proxy.

Through the proxy an allowed fetch works and a refused one gets a 403 and a
``network_blocked`` event; the command's exit code is netwarden's; teardown leaves zero
labelled containers/networks and zero firewall rules after success, failure, SIGTERM,
and (via ``netwarden sandbox reap``) after SIGKILL; the reaper leaves a live run alone;
with no engine ``auto`` runs on the host (``sandbox_skipped``) and ``docker`` refuses;
without the firewall privilege ``docker`` refuses and ``auto`` runs loudly unconfined.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import read_events
from sandbox.names import LABEL_RUN, run_key
from sandbox.runtime import DockerRuntime

from .conftest import REPO, UPSTREAM_BODY, leftovers, netwarden

pytestmark = pytest.mark.docker

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent.sock"}


def _run_id(tag: str) -> str:
    return f"t-{tag}-{uuid.uuid4().hex[:8]}"


def _policy(tmp_path: Path, *rules: str, mode: str = "allowlist") -> Path:
    path = tmp_path / "policy.yaml"
    lines = [f"mode: {mode}", "rules:" if rules else "rules: []"]
    lines += [f'  - "{rule}"' for rule in rules]
    path.write_text("\n".join(lines) + "\n")
    return path


def _events(path: Path) -> list[dict[str, Any]]:
    return list(read_events(path)) if path.exists() else []


def _of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def _await_line(process: subprocess.Popen[str], wanted: str, timeout: float = 30) -> None:
    """Block until ``process`` prints a line containing ``wanted`` (a readiness probe)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = process.stdout.readline()
        if wanted in line:
            return
        if not line:
            break
    process.kill()
    _, err = process.communicate()
    pytest.fail(f"never printed {wanted!r}; stderr: {err}")


def test_allowed_and_refused_through_the_proxy(
    engine: DockerRuntime, upstream: int, tmp_path: Path
) -> None:
    # the upstream is on the host's loopback: only an explicit IP rule lets the guard pass it
    policy = _policy(tmp_path, f"127.0.0.2:{upstream}")
    events, run_id = tmp_path / "events.jsonl", _run_id("proxy")
    script = (
        f'wget -q -O- http://127.0.0.2:{upstream}/ok; echo "[allowed $?]"; '
        'wget -q -O- http://denied.example/ 2>&1; echo "[refused $?]"'
    )
    done = netwarden(
        "run", "--policy", str(policy), "--sandbox", "docker", "--events", str(events),
        "--run-id", run_id, "--", "sh", "-c", script,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert UPSTREAM_BODY.decode() in done.stdout
    assert "[allowed 0]" in done.stdout
    assert "403 Forbidden" in done.stdout
    assert "[refused 1]" in done.stdout
    log = _events(events)
    blocked = _of_type(log, "network_blocked")
    assert [(b["host"], b["code"], b["reason"]) for b in blocked] == [
        ("denied.example", "policy_denied", "policy denial")
    ]
    assert [c["host"] for c in _of_type(log, "network_connection")] == ["127.0.0.2"]
    (started,) = _of_type(log, "sandbox_started")
    assert started["egress"] == "enforced"
    (stopped,) = _of_type(log, "sandbox_stopped")
    assert (stopped["outcome"], stopped["exit_code"], stopped["teardown_errors"]) == (
        "exited",
        0,
        [],
    )
    assert all(e["run_id"] == run_id for e in log)
    assert "netwarden:" not in events.read_text()  # the proxy credentials never reach the log
    assert leftovers(engine, run_id) == []


def test_exit_code_passes_through_and_teardown_is_complete(
    engine: DockerRuntime, tmp_path: Path
) -> None:
    run_id = _run_id("exit3")
    done = netwarden(
        "run", "--policy", str(_policy(tmp_path)), "--sandbox", "docker",
        "--events", str(tmp_path / "e.jsonl"), "--run-id", run_id,
        "--", "sh", "-c", "echo out; echo err >&2; exit 3",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "out\n"
    assert done.stderr.endswith("err\n")
    assert leftovers(engine, run_id) == []


@pytest.mark.parametrize(
    ("signum", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["term", "int"]
)
def test_signal_tears_everything_down(
    engine: DockerRuntime, tmp_path: Path, signum: signal.Signals, exit_code: int
) -> None:
    run_id, events = _run_id(signum.name.lower()), tmp_path / "e.jsonl"
    process = _spawn(
        "run", "--policy", str(_policy(tmp_path)), "--sandbox", "docker", "--events",
        str(events), "--run-id", run_id, "--", "sh", "-c", "echo READY; exec sleep 600",
    )  # fmt: skip
    with process:
        _await_line(process, "READY")
        assert leftovers(engine, run_id) != []  # the run is up: container, network, rules
        process.send_signal(signum)
        assert process.wait(timeout=30) == exit_code
    assert leftovers(engine, run_id) == []
    (stopped,) = _of_type(_events(events), "sandbox_stopped")
    assert stopped["outcome"] == "cancelled"


def test_sigkill_then_reap_cleans_up(engine: DockerRuntime, tmp_path: Path) -> None:
    run_id = _run_id("kill")
    process = _spawn(
        "run", "--policy", str(_policy(tmp_path)), "--sandbox", "docker", "--events",
        str(tmp_path / "e.jsonl"), "--run-id", run_id, "--", "sh", "-c",
        "echo READY; exec sleep 600",
    )  # fmt: skip
    with process:
        _await_line(process, "READY")
        process.kill()
        process.wait(timeout=10)
    left = leftovers(engine, run_id)
    assert any(item.startswith("container ") for item in left), left
    assert any(item.startswith("network ") for item in left), left
    assert any(item.startswith("iptables: ") for item in left), left
    reaped = netwarden("sandbox", "reap", "--json")
    assert reaped.returncode == 0, reaped.stderr
    report = json.loads(reaped.stdout)
    assert f"/netwarden-{run_key(run_id)}" in report["containers"]
    assert f"netwarden-{run_key(run_id)}" in report["networks"]
    assert run_key(run_id) in report["firewall_keys"]
    assert leftovers(engine, run_id) == []


def test_reap_leaves_a_live_run_alone(engine: DockerRuntime, tmp_path: Path) -> None:
    run_id = _run_id("live")
    process = _spawn(
        "run", "--policy", str(_policy(tmp_path)), "--sandbox", "docker", "--events",
        str(tmp_path / "e.jsonl"), "--run-id", run_id, "--", "sh", "-c",
        "echo READY; while [ ! -e /tmp/go ]; do usleep 20000; done; echo finished",
    )  # fmt: skip
    with process:
        _await_line(process, "READY")
        before = leftovers(engine, run_id)
        reaped = netwarden("sandbox", "reap")
        assert reaped.returncode == 0, reaped.stderr
        assert leftovers(engine, run_id) == before
        (container,) = [
            r.id for r in engine.list_labelled(f"{LABEL_RUN}={run_id}") if r.kind == "container"
        ]
        assert engine.exec_stream(container, ["touch", "/tmp/go"], on_stdout=print,
                                  on_stderr=print) == 0  # fmt: skip
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out.endswith("finished\n")
    assert leftovers(engine, run_id) == []


def test_open_policy_starts_no_proxy(engine: DockerRuntime, tmp_path: Path) -> None:
    run_id, events = _run_id("open"), tmp_path / "e.jsonl"
    done = netwarden(
        "run", "--policy", str(_policy(tmp_path, mode="open")), "--sandbox", "docker",
        "--events", str(events), "--run-id", run_id, "--", "sh", "-c", "env | grep -ci proxy",
    )  # fmt: skip
    assert done.stdout.strip() == "0", done.stderr
    log = _events(events)
    assert _of_type(log, "proxy_started") == []
    (started,) = _of_type(log, "sandbox_started")
    assert started["egress"] == "open"
    assert leftovers(engine, run_id) == []


def test_auto_without_engine_runs_on_host(upstream: int, tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    fetch = (
        "import urllib.request as u, sys; "
        f"sys.stdout.write(u.urlopen('http://127.0.0.2:{upstream}/', timeout=5).read().decode())"
    )
    done = netwarden(
        "run", "--policy", str(_policy(tmp_path, f"127.0.0.2:{upstream}")), "--events",
        str(events), "--", sys.executable, "-c", fetch, env=NO_ENGINE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == UPSTREAM_BODY.decode()  # through the proxy (env set on the host)
    assert "NOT in a sandbox" in done.stderr
    log = _events(events)
    (skipped,) = _of_type(log, "sandbox_skipped")
    assert skipped["requested"] == "auto"
    assert "no docker engine answers" in skipped["reason"]
    assert [c["host"] for c in _of_type(log, "network_connection")] == ["127.0.0.2"]


def test_docker_mode_without_engine_refuses(tmp_path: Path) -> None:
    done = netwarden(
        "run", "--policy", str(_policy(tmp_path)), "--sandbox", "docker",
        "--events", str(tmp_path / "e.jsonl"), "--", "true", env=NO_ENGINE,
    )  # fmt: skip
    assert done.returncode == 125
    assert "netwarden: error: no docker engine answers" in done.stderr
    assert "run with --sandbox none" in done.stderr


def _without_net_admin(*args: str) -> list[str]:
    # root without CAP_NET_ADMIN: the engine still answers, the host firewall refuses us
    return ["setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin",
            sys.executable, "-m", "gateway.cli", *args]  # fmt: skip


def test_docker_mode_without_firewall_privilege_refuses(
    engine: DockerRuntime, tmp_path: Path
) -> None:
    run_id = _run_id("nopriv")
    done = subprocess.run(
        _without_net_admin(
            "run", "--policy", str(_policy(tmp_path)), "--sandbox", "docker",
            "--events", str(tmp_path / "e.jsonl"), "--run-id", run_id, "--", "true",
        ),
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 125, done.stderr
    assert "--sandbox docker cannot confine egress: cannot change the host firewall" in (
        done.stderr
    )
    assert "run netwarden as root or with CAP_NET_ADMIN" in done.stderr
    assert leftovers(engine, run_id) == []


def test_auto_without_firewall_privilege_is_loud(engine: DockerRuntime, tmp_path: Path) -> None:
    run_id, events = _run_id("loud"), tmp_path / "e.jsonl"
    done = subprocess.run(
        _without_net_admin(
            "run", "--policy", str(_policy(tmp_path)), "--events", str(events),
            "--run-id", run_id, "--", "true",
        ),
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "EGRESS IS NOT CONFINED" in done.stderr
    log = _events(events)
    (unenforced,) = _of_type(log, "sandbox_egress_unenforced")
    assert "cannot change the host firewall" in unenforced["reason"]
    (started,) = _of_type(log, "sandbox_started")
    assert started["egress"] == "unenforced"
    assert leftovers(engine, run_id) == []


def test_doctor(engine: DockerRuntime) -> None:
    ok = netwarden("doctor", "--json")
    assert ok.returncode == 0, ok.stdout
    checks = {c["name"]: c["status"] for c in map(json.loads, ok.stdout.splitlines())}
    assert checks == {
        "engine": "pass", "api": "pass", "image": "pass", "egress": "pass", "spec": "pass",
        "policy": "pass",
    }  # fmt: skip
    missing = netwarden("doctor", "--image", "netwarden/absent:none")
    assert missing.returncode == 0
    assert "[warn] image: netwarden/absent:none is not present" in missing.stdout
    assert "fix: run `netwarden image build`" in missing.stdout
    assert netwarden("doctor", "--strict", "--image", "netwarden/absent:none").returncode == 1
    down = netwarden("doctor", env=NO_ENGINE)
    assert down.returncode == 1
    assert down.stdout.startswith("[fail] engine: no docker engine answers")


def test_image_build(engine: DockerRuntime) -> None:
    tag = f"netwarden/test-build:{uuid.uuid4().hex[:8]}"
    built = netwarden("image", "build", "--tag", tag)
    try:
        assert built.returncode == 0, built.stderr
        assert built.stdout.startswith(f"built {tag} (sha256:")
        assert engine.image_present(tag)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)

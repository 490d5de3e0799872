"""Smoke run of the benchmark suite (`make bench`, not `make test`).

Runs the load client (``python -m bench.load --quick``) as a real subprocess: it starts
the loopback targets and a real ``netwarden proxy`` (and the naive baseline proxy), and
drives them over real sockets. These tests do not judge speed (the figures depend on
the machine and on who else uses it); they check that every figure was produced, is
sane, and that the run touched the proxy for real (its audit log, its CPU time).
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.bench

_REPO = Path(__file__).resolve().parents[2]
_THROUGHPUTS = ("tunnel_upload_mb_s", "tunnel_download_mb_s", "tunnels16_upload_mb_s")


def _load(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.load", "--quick", *args],
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, f"bench.load failed ({done.returncode}):\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    summary: dict[str, Any] = json.loads(lines[-1])
    assert summary["type"] == "bench_summary"
    return summary


def _positive(value: object) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


def _assert_proxied_figures_sane(
    name: str, figures: dict[str, Any], direct: dict[str, Any], notes: list[str]
) -> None:
    for key in _THROUGHPUTS:
        assert _positive(figures[key]), f"{name}.{key} = {figures[key]!r}"
        # A relay cannot beat the same bytes going direct by much; far more means a bug.
        assert figures[key] < 3 * direct[key], (
            f"{name}.{key} {figures[key]} vs direct {direct[key]}"
        )
    assert _positive(figures["new_tunnels_per_s"])
    assert figures["setup_errors"] == 0, f"{name}: a legitimate tunnel was refused: {notes}"
    assert 0 < figures["setup_p50_ms"] <= figures["setup_p99_ms"] < 5000
    # CPU per tunnel: clock ticks are 10 ms, so a short run still sees some; a proxy
    # that took no CPU at all was not the one we drove.
    assert 0 < figures["cpu_per_tunnel_us"] < 100_000
    assert _positive(figures["http_requests_per_s"])
    assert figures["http_reconnects"] == 0, "keep-alive must hold through the proxy"
    assert figures["idle_tunnels"] == 200
    # RSS growth can be ~0 when the heap had room; it cannot be hundreds of KiB per tunnel.
    assert -64 < figures["rss_per_idle_tunnel_kib"] < 256


def test_quick_run_against_netwarden_proxy_produces_sane_figures() -> None:
    summary = _summary(_load("--idle-tunnels", "200"))
    routes = summary["routes"]
    assert set(routes) == {"direct", "netwarden", "reference"}
    direct = routes["direct"]
    for key in (*_THROUGHPUTS, "new_tunnels_per_s", "http_requests_per_s"):
        assert _positive(direct[key]), f"direct.{key} = {direct[key]!r}"
    assert direct["setup_errors"] == 0
    notes = summary["notes"]
    for name in ("netwarden", "reference"):
        _assert_proxied_figures_sane(name, routes[name], direct, notes.get(name, []))
    # Every target has a verdict for the proxy under test.
    verdicts = summary["targets"]["netwarden"]
    assert set(verdicts) == {
        "tunnel_upload_mb_s",
        "tunnel_download_mb_s",
        "cpu_per_tunnel_us",
        "rss_per_idle_tunnel_kib",
    }
    assert all(isinstance(v["pass"], bool) for v in verdicts.values())
    # The proxy audited what it carried: one network_connection line per tunnel at least.
    audit = [note for note in summary["notes"]["netwarden"] if note.endswith("audit lines written")]
    assert audit, summary["notes"]
    assert int(audit[0].split()[0]) >= routes["netwarden"]["idle_tunnels"]


def test_table_reports_targets_next_to_figures() -> None:
    done = _load("--subject", "reference", "--idle-tunnels", "50")
    _summary(done)
    table = done.stdout.splitlines()
    assert table[0].startswith("netwarden bench (quick;")
    rows = {line.split("  ")[0].strip(): line for line in table[3:] if line.strip()}
    assert "1 tunnel upload, MB/s" in rows
    assert ">=0.6x" in rows["1 tunnel upload, MB/s"]
    assert ("PASS" in rows["proxy CPU per new tunnel, µs"]) != (
        "MISS" in rows["proxy CPU per new tunnel, µs"]
    )


@pytest.fixture
def refusing_proxy() -> Iterator[str]:
    """A real listener that answers every request with the proxy's 403."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 403 Forbidden\r\nX-Netwarden-Reason: policy_denied\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://bench:secret-token@127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    thread.join(timeout=5)


def test_a_refusing_proxy_is_a_clear_error_without_the_token(refusing_proxy: str) -> None:
    done = _load("--proxy", refusing_proxy, "--no-reference", timeout=120)
    assert done.returncode == 2
    assert "403" in done.stderr
    assert "X-Netwarden-Reason: policy_denied" in done.stderr
    assert "policy must allow the loopback targets" in done.stderr
    assert "secret-token" not in done.stderr + done.stdout

"""`netwarden proxy` and `netwarden events` as real subprocesses: the ready line, curl
through it, SIGHUP reloads (valid and invalid), SIGTERM drain, IPv6 listen, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import read_events
from tests.gateway.gw_support import Origin, curl

NETWARDEN = str(Path(sys.executable).with_name("netwarden"))


@dataclass
class CliProxy:
    proc: asyncio.subprocess.Process
    ready: dict[str, Any]
    events: Path

    @property
    def url(self) -> str:
        return str(self.ready["proxy_url"])


@asynccontextmanager
async def cli_proxy(*args: str, events: Path) -> AsyncIterator[CliProxy]:
    proc = await asyncio.create_subprocess_exec(
        NETWARDEN,
        "proxy",
        "--events",
        str(events),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line, (await proc.stderr.read()).decode() if proc.stderr else "no ready line"
        yield CliProxy(proc, json.loads(line), events)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 20)


async def _first_event(path: Path, kind: str) -> dict[str, Any]:
    """Await the first ``kind`` event via `netwarden events --follow` (prints what is
    there, then follows), so a line written before or after we start is seen."""
    proc = await asyncio.create_subprocess_exec(
        NETWARDEN,
        "events",
        str(path),
        "--type",
        kind,
        "--json",
        "--follow",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
    finally:
        proc.kill()
        await proc.wait()
    event: dict[str, Any] = json.loads(line)
    return event


def _policy(path: Path, *rules: str) -> Path:
    path.write_text("mode: allowlist\nrules:\n" + "".join(f"  - {json.dumps(r)}\n" for r in rules))
    return path


async def test_ready_line_curl_and_sigterm(tmp_path: Path, http_origin: Origin) -> None:
    policy = _policy(tmp_path / "p.yaml", f"127.0.0.1:{http_origin.port}")
    events = tmp_path / "events.jsonl"
    async with cli_proxy("--policy", str(policy), "--run-id", "r-cli", events=events) as px:
        assert px.ready["type"] == "ready"
        assert px.ready["run_id"] == "r-cli"
        assert px.url.startswith("http://netwarden:")
        token = px.url.split(":")[2].split("@")[0]
        rc, out, err = await curl("-x", px.url, http_origin.url("/via-cli"))
        assert rc == 0, err
        assert json.loads(out)["path"] == "/via-cli"
        rc, out, _ = await curl(
            "-x", px.url, "-o", "/dev/null", "-w", "%{http_code}", "http://blocked.test/"
        )
        assert out == "403"
        px.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(px.proc.wait(), 20) == 0
    types = [e["type"] for e in read_events(events)]
    assert types[0] == "proxy_started"
    assert types[-1] == "proxy_stopped"
    assert "network_blocked" in types
    assert "network_connection" in types
    assert token not in events.read_text()


async def test_sighup_reloads_valid_and_keeps_old_on_invalid(
    tmp_path: Path, http_origin: Origin
) -> None:
    policy = _policy(tmp_path / "p.yaml", "nothing.test")
    events = tmp_path / "events.jsonl"
    target = http_origin.url("/reload")
    async with cli_proxy("--policy", str(policy), events=events) as px:
        rc, out, _ = await curl("-x", px.url, "-o", "/dev/null", "-w", "%{http_code}", target)
        assert out == "403"
        _policy(policy, f"127.0.0.1:{http_origin.port}")
        px.proc.send_signal(signal.SIGHUP)
        reloaded = await _first_event(events, "policy_reloaded")
        assert reloaded["data"]["ok"] is True
        rc, out, _ = await curl("-x", px.url, "-o", "/dev/null", "-w", "%{http_code}", target)
        assert out == "200"

        policy.write_text("mode: allowlist\nrules:\n  - '*bad*.com'\n")
        before = len(list(read_events(events)))
        px.proc.send_signal(signal.SIGHUP)
        event = await _first_event_after(events, "policy_reloaded", before)
        assert event is not None
        assert event["data"]["ok"] is False
        assert "*bad*.com" in event["data"]["error"]
        rc, out, _ = await curl("-x", px.url, "-o", "/dev/null", "-w", "%{http_code}", target)
        assert (rc, out) == (0, "200")  # the old (valid) policy stays


async def _first_event_after(path: Path, kind: str, skip: int) -> dict[str, Any] | None:
    proc = await asyncio.create_subprocess_exec(
        NETWARDEN, "events", str(path), "--json", "--follow", stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        seen = 0
        async with asyncio.timeout(20):
            while line := await proc.stdout.readline():
                seen += 1
                event: dict[str, Any] = json.loads(line)
                if seen > skip and event["type"] == kind:
                    return event
    finally:
        proc.kill()
        await proc.wait()
    return None


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this host")
async def test_ipv6_listen(tmp_path: Path, http_origin: Origin) -> None:
    policy = _policy(tmp_path / "p.yaml", f"127.0.0.1:{http_origin.port}")
    async with cli_proxy(
        "--policy", str(policy), "--listen", "[::1]:0", events=tmp_path / "e.jsonl"
    ) as px:
        assert "@[::1]:" in px.url
        rc, out, err = await curl("-x", px.url, http_origin.url("/v6"))
        assert rc == 0, err
        assert json.loads(out)["path"] == "/v6"


async def test_no_auth_warns_loudly(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "p.yaml", "a.test")
    async with cli_proxy("--policy", str(policy), "--no-auth", events=tmp_path / "e.jsonl") as px:
        assert "@" not in px.url
        px.proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(px.proc.wait(), 20) == 0
        assert px.proc.stderr is not None
        assert "WARNING: --no-auth" in (await px.proc.stderr.read()).decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--policy", "{missing}"], "missing.yaml", id="missing-policy"),
        pytest.param(["--policy", "{bad}"], "*bad*.com", id="invalid-policy"),
        pytest.param([], "no policy", id="no-policy"),
        pytest.param(["--rule", "a.test", "--listen", "::1:0"], "brackets", id="v6-unbracketed"),
        pytest.param(["--rule", "a.test", "--listen", "x:99999"], "0-65535", id="bad-port"),
        pytest.param(["--rule", "a.test", "--idle-timeout", "0"], "> 0", id="zero-timeout"),
    ],
)
async def test_bad_usage_exits_2_with_a_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - '*bad*.com'\n")
    argv = [a.format(missing=tmp_path / "missing.yaml", bad=bad) for a in args]
    proc = await asyncio.create_subprocess_exec(
        NETWARDEN, "proxy", *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 2
    assert out == b""
    assert message in err.decode()


# -- netwarden events ------------------------------------------------------------------


def _write_events(path: Path) -> None:
    from datetime import UTC, datetime

    from gateway.audit import AuditLog, NetworkBlocked, NetworkConnection

    for run, moment in (("r-old", datetime(2020, 1, 1, tzinfo=UTC)), ("r-new", None)):
        log = AuditLog(path, run, **({"clock": lambda m=moment: m} if moment else {}))
        log.emit(
            NetworkBlocked(host="evil.test", port=443, reason="policy denial", code="policy_denied")
        )
        log.emit(
            NetworkConnection(
                host="ok.test", port=443, address="1.2.3.4", bytes_up=1, bytes_down=2, duration_ms=3
            )
        )
        log.close()


async def _events_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        NETWARDEN, "events", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(
    ("args", "lines"),
    [
        pytest.param([], 4, id="all"),
        pytest.param(["--type", "network_blocked"], 2, id="type"),
        pytest.param(["--run", "r-old"], 2, id="run"),
        pytest.param(["--since", "1d"], 2, id="since-relative"),
        pytest.param(["--since", "2021-01-01T00:00:00Z"], 2, id="since-iso"),
    ],
)
async def test_events_filters(tmp_path: Path, args: list[str], lines: int) -> None:
    path = tmp_path / "events.jsonl"
    _write_events(path)
    rc, out, err = await _events_cli(str(path), "--json", *args)
    assert rc == 0, err
    assert len(out.splitlines()) == lines
    assert all(json.loads(line)["seq"] for line in out.splitlines())


async def test_events_human_and_summary(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write_events(path)
    rc, out, _ = await _events_cli(str(path))
    assert rc == 0
    assert "network_blocked" in out
    assert "host=evil.test" in out
    rc, out, _ = await _events_cli(str(path), "--summary")
    assert rc == 0
    assert "4 events" in out
    assert "evil.test (policy_denied)" in out


async def test_events_errors(tmp_path: Path) -> None:
    rc, _, err = await _events_cli(str(tmp_path / "nope.jsonl"))
    assert rc == 2
    assert "no such file" in err
    rc, _, err = await _events_cli(str(tmp_path / "nope.jsonl"), "--since", "yesterday")
    assert rc == 2
    assert "10m" in err
    env_path = tmp_path / "env.jsonl"
    _write_events(env_path)
    proc = await asyncio.create_subprocess_exec(
        NETWARDEN,
        "events",
        "--type",
        "network_connection",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "NETWARDEN_EVENTS": str(env_path)},
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert len(out.splitlines()) == 2


async def test_sigkill_mid_traffic_leaves_only_whole_lines(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "p.yaml", "allowed.test")
    events = tmp_path / "events.jsonl"
    async with cli_proxy("--policy", str(policy), "--no-auth", events=events) as px:
        port = int(px.url.rsplit(":", 1)[1])

        answered = 0
        enough = asyncio.Event()

        async def refused(i: int) -> None:
            nonlocal answered
            with contextlib.suppress(ConnectionError):  # the proxy dies under us
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"CONNECT blocked-{i}.test:443 HTTP/1.1\r\n\r\n".encode())
                await reader.read()
                writer.close()
                answered += 1
                if answered == 100:
                    enough.set()

        async with asyncio.TaskGroup() as group:
            for i in range(400):
                group.create_task(refused(i))
            await asyncio.wait_for(enough.wait(), 20)
            px.proc.kill()  # mid-traffic: some requests are still in flight
        await px.proc.wait()
    raw = events.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.splitlines()
    assert len(lines) >= 101  # proxy_started and the refusals answered before the kill
    for line in lines:
        assert json.loads(line)["type"] in ("proxy_started", "network_blocked")

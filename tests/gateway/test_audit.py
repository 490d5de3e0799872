"""The audit log: line shape, redaction, and whole lines under concurrency."""

from __future__ import annotations

import json
import multiprocessing
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.audit import (
    AuditLog,
    NetworkBlocked,
    NetworkConnection,
    PolicyReloaded,
    format_ts,
    read_events,
)

FIXED = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)


def test_line_shape_matches_design(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with AuditLog(path, "r-1", clock=lambda: FIXED) as log:
        log.emit(
            NetworkBlocked(host="evil.site", port=443, reason="policy denial", code="policy_denied")
        )
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == {
        "seq": 1,
        "ts": "2026-12-01T10:00:00.123Z",
        "type": "network_blocked",
        "run_id": "r-1",
        "data": {
            "host": "evil.site",
            "port": 443,
            "reason": "policy denial",
            "code": "policy_denied",
            "rule": None,
            "method": "CONNECT",
            "detail": "",
            "run_id": "r-1",
        },
    }


def test_seq_is_monotonic_and_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    with AuditLog(path, "r-2") as log:
        for _ in range(5):
            log.emit(PolicyReloaded(ok=True, path="p.yaml"))
    assert [e["seq"] for e in read_events(path)] == [1, 2, 3, 4, 5]
    assert path.stat().st_mode & 0o077 == 0


def test_registered_secret_never_reaches_a_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with AuditLog(path, "r-3") as log:
        log.add_secret("s3cr3t-token")
        log.emit(PolicyReloaded(ok=False, path="p.yaml", error="bad token s3cr3t-token here"))
    text = path.read_text()
    assert "s3cr3t-token" not in text
    assert "[redacted]" in text


def test_repr_has_no_secret(tmp_path: Path) -> None:
    log = AuditLog(None, "r-4")
    log.add_secret("tok-xyz")
    assert "tok-xyz" not in repr(log)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        pytest.param(FIXED, "2026-12-01T10:00:00.123Z", id="utc-millis"),
        pytest.param(
            datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.000Z", id="zero"
        ),
    ],
)
def test_format_ts(moment: datetime, text: str) -> None:
    assert format_ts(moment) == text


def _write_many(path: str, run_id: str, count: int) -> None:
    log = AuditLog(path, run_id)
    big = "x" * 6000  # far over PIPE_BUF: regular-file O_APPEND writes stay whole
    for i in range(count):
        log.emit(
            NetworkConnection(
                host=f"h{i}.{big}",
                port=443,
                address="1.2.3.4",
                bytes_up=i,
                bytes_down=i,
                duration_ms=1,
            )
        )
    log.close()


def test_threads_and_processes_never_tear_or_interleave(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    shared = AuditLog(path, "threads")
    big = "y" * 5000

    def work(n: int) -> None:
        for i in range(200):
            shared.emit(NetworkBlocked(host=f"t{n}-{i}.{big}", port=1, reason="r", code="c"))

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), f"p{k}", 200)) for k in range(2)]
    for p in procs:
        p.start()
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join()
    shared.close()
    assert all(p.exitcode == 0 for p in procs)

    events = list(read_events(path))
    assert len(events) == 4 * 200 + 2 * 200
    thread_seqs = [e["seq"] for e in events if e["run_id"] == "threads"]
    assert sorted(thread_seqs) == list(range(1, 801))
    assert thread_seqs == sorted(thread_seqs)  # seq order is file order for one writer


def test_read_events_skips_a_partial_tail(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with AuditLog(path, "r") as log:
        log.emit(PolicyReloaded(ok=True, path=None))
    with open(path, "ab") as fh:
        fh.write(b'{"seq": 2, "ts"')
    assert [e["seq"] for e in read_events(path)] == [1]


def test_read_events_names_a_corrupt_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"seq": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"events.jsonl:2: not a JSON event line"):
        list(read_events(path))

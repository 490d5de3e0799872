"""Child processes of the load client: the proxy under test, the baseline, the targets.

A child prints ONE JSON line on stdout when it is ready (``netwarden proxy``'s CLI
contract; ``bench.targets`` and ``bench.reference_proxy`` follow it). We wait for that
line, not for a delay. The proxy's CPU time and RSS are read from ``/proc/PID``
(``utime + stime`` of ``stat``; ``VmRSS`` of ``status``), so they count the proxy
process alone, whatever drives it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final
from urllib.parse import urlsplit

__all__ = [
    "BenchError",
    "Child",
    "ProxyURL",
    "cpu_seconds",
    "python_argv",
    "rss_bytes",
    "spawn",
]

_READY_TIMEOUT: Final = 30.0
_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """The benchmark cannot go on; the message says what failed and what to do."""


@dataclass(frozen=True)
class ProxyURL:
    """``http://user:token@host:port`` split up. ``repr`` never shows the token."""

    host: str
    port: int
    username: str = ""
    password: str = field(default="", repr=False)

    @classmethod
    def parse(cls, url: str) -> ProxyURL:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as exc:
            raise BenchError(
                f"proxy URL has a bad port: {exc}; expected http://USER:TOKEN@HOST:PORT"
            ) from exc
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise BenchError(
                "proxy URL must look like http://USER:TOKEN@HOST:PORT (scheme http, explicit port)"
            )
        return cls(parts.hostname, port, parts.username or "", parts.password or "")

    @property
    def authorization(self) -> bytes:
        """The ``Proxy-Authorization`` header line (with CRLF), or nothing without credentials."""
        if not self.username and not self.password:
            return b""

        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Proxy-Authorization: Basic {token}\r\n".encode()


@dataclass
class Child:
    """A started child process and its ready line."""

    name: str
    process: subprocess.Popen[bytes]
    ready: dict[str, object]
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM, wait for the drain, SIGKILL if it hangs. Returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdin:
            self.process.stdin.close()
        if self.process.stdout:
            self.process.stdout.close()
        return self.process.returncode


def _read_ready_line(
    name: str, process: subprocess.Popen[bytes], stderr_path: Path
) -> dict[str, object]:
    stdout: IO[bytes] | None = process.stdout
    assert stdout is not None
    deadline = time.monotonic() + _READY_TIMEOUT
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                process.kill()
                raise BenchError(f"{name}: no ready line on stdout within {_READY_TIMEOUT:.0f} s")
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                process.wait()
                tail = stderr_path.read_text(errors="replace")[-2000:]
                raise BenchError(
                    f"{name}: exited with code {process.returncode} before printing its ready line;"
                    f" its stderr ends with:\n{tail}"
                )
            buffer += chunk
    line = buffer.split(b"\n", 1)[0]
    try:
        ready = json.loads(line)
    except ValueError as exc:
        process.kill()
        raise BenchError(f"{name}: first stdout line is not JSON: {line[:200]!r}") from exc
    if not isinstance(ready, dict) or ready.get("type") != "ready":
        process.kill()
        raise BenchError(
            f'{name}: first stdout line is not a {{"type": "ready"}} object: {line[:200]!r}'
        )
    return ready


@contextlib.contextmanager
def spawn(name: str, argv: Sequence[str], *, cpu: int | None = None) -> Iterator[Child]:
    """Start ``argv`` (pinned to ``cpu`` with ``taskset`` when given), yield it once ready.

    stdin is a pipe we hold: a child that watches it dies with us. stderr goes to a
    file, never a pipe nobody reads (a full pipe would stall the child mid-benchmark).
    """
    command = list(argv)
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    with tempfile.NamedTemporaryFile(
        prefix=f"bench-{name}-", suffix=".stderr", delete=False
    ) as err:
        stderr_path = Path(err.name)
    with stderr_path.open("wb") as stderr:
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=Path(__file__).resolve().parent.parent,
            )
        except FileNotFoundError as exc:
            raise BenchError(f"{name}: cannot start {command[0]!r}: {exc.strerror}") from exc
    child = Child(name, process, {}, stderr_path)
    try:
        child.ready = _read_ready_line(name, process, stderr_path)
        yield child
    finally:
        child.stop()
        stderr_path.unlink(missing_ok=True)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU time of ``pid`` so far (clock-tick resolution: 10 ms at 100 Hz)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"/proc/{pid}/status has no VmRSS line (is {pid} a kernel thread or gone?)")


def python_argv(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter (the repo's venv)."""
    return [sys.executable, "-m", module, *args]

"""The audit log: typed events, one JSON line each, appended to ``events.jsonl``.

Line contract (DESIGN.md "Audit events")::

    {"seq": 12, "ts": "2026-12-01T10:00:00.123Z", "type": "network_blocked", "run_id": "r-1",
     "data": {"host": "evil.site", ..., "run_id": "r-1"}}

Why a line is never torn or interleaved: the file is opened with ``O_APPEND`` and every
line (newline included) goes out in ONE ``os.write``. On Linux an ``O_APPEND`` write to
a regular file moves the offset to the end and writes under the inode lock, so
concurrent writers (threads of this process or other processes sharing the file) each
land their line whole and contiguous; a reader only ever sees complete lines plus, at
worst, the tail of a line still being written (which ``read_events`` skips). POSIX only
guarantees this for pipes up to PIPE_BUF; our lines go to regular files, where Linux
gives it for any size we produce. A SIGKILL between two writes loses the later line,
never half of it.

``seq`` is monotonic per ``AuditLog`` (per process), taken under a lock together with
the write, so seq order is file order for one writer. ``ts`` is UTC with milliseconds
and a ``Z``; the clock is injectable for tests.

Secrets never belong in events: events carry names, hosts and codes, never values. As a
second line of defence ``AuditLog.add_secret`` registers values (e.g. the run's proxy
token) that are replaced by ``[redacted]`` should they ever reach a line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Final

from policy import Decision

__all__ = [
    "REDACTED",
    "AuditLog",
    "Event",
    "NetworkBlocked",
    "NetworkConnection",
    "NetworkError",
    "PolicyReloaded",
    "ProxyStarted",
    "ProxyStopped",
    "format_ts",
    "read_events",
]

REDACTED: Final = "[redacted]"

# One encoder for every line: ``json.dumps(..., default=str)`` builds a new encoder per
# call. Same output (default separators); our records hold no cycles to check for.
_ENCODE: Final = json.JSONEncoder(default=str, check_circular=False).encode


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Base of every audit event. Subclasses set ``TYPE`` and declare their fields."""

    TYPE: ClassVar[str] = "event"

    def data(self) -> dict[str, object]:
        """The event's fields as JSON-ready values (StrEnums become their value)."""
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))
        return {name: _plain(getattr(self, name)) for name in names}


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkBlocked(Event):
    """A destination was refused (policy, address guard, loop defence, bad host)."""

    TYPE: ClassVar[str] = "network_blocked"
    host: str
    port: int | None
    reason: str
    code: str
    rule: str | None = None
    method: str = "CONNECT"
    detail: str = ""

    @classmethod
    def from_decision(cls, decision: Decision, *, method: str) -> NetworkBlocked:
        """Built from the Decision that refused, never re-derived (STYLE.md)."""
        return cls(
            host=decision.host,
            port=decision.port,
            reason=decision.reason,
            code=decision.code.value,
            rule=decision.rule,
            method=method,
            detail=decision.detail,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkConnection(Event):
    """An allowed tunnel or forwarded request ended."""

    TYPE: ClassVar[str] = "network_connection"
    host: str
    port: int
    address: str
    bytes_up: int
    bytes_down: int
    duration_ms: int
    method: str = "CONNECT"
    rule: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkError(Event):
    """An allowed destination could not be reached. ``code``: dns|refused|timeout|reset|error."""

    TYPE: ClassVar[str] = "network_error"
    host: str
    port: int
    error: str
    code: str
    method: str = "CONNECT"
    address: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxyStarted(Event):
    TYPE: ClassVar[str] = "proxy_started"
    listen: str
    policy: str
    mode: str
    auth: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxyStopped(Event):
    TYPE: ClassVar[str] = "proxy_stopped"
    listen: str
    connections_served: int = 0
    uptime_ms: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyReloaded(Event):
    """SIGHUP reload: ``ok`` false means the old policy stays and ``error`` says why."""

    TYPE: ClassVar[str] = "policy_reloaded"
    ok: bool
    path: str | None
    policy: str | None = None
    error: str | None = None


def _plain(value: object) -> object:
    # StrEnum is a str subclass: json would write it fine, but keep the value exact.
    if type(value) is str or value is None or type(value) is int:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def format_ts(moment: datetime) -> str:
    """``2026-12-01T10:00:00.123Z`` (UTC, milliseconds)."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _FastTs:
    """``format_ts(datetime.now(UTC))`` without strftime per event: the
    second-resolution prefix is formatted once per second (hot path of the proxy)."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        return f"{self._prefix}{int((now - second) * 1000):03d}Z"


class AuditLog:
    """Appends events to ``path`` (None: events are counted and discarded).

    Thread-safe. ``emit`` raises ``OSError`` if the file cannot be written: the
    caller decides (the proxy still refuses what it refused).
    """

    def __init__(
        self,
        path: Path | str | None,
        run_id: str,
        *,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.run_id = run_id
        self._clock = clock
        self._fast_ts = _FastTs() if clock is _utcnow else None
        self._lock = threading.Lock()
        self._seq = 0
        self._secrets: list[str] = []
        self._fd: int | None = None
        self._subscribers: list[Callable[[dict[str, Any]], None]] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self._fd = os.open(self.path, flags, 0o600)

    def __repr__(self) -> str:
        return f"AuditLog(path={str(self.path)!r}, run_id={self.run_id!r}, seq={self._seq})"

    @property
    def seq(self) -> int:
        """How many events were emitted so far."""
        return self._seq

    def add_secret(self, value: str) -> None:
        """Never let ``value`` reach a line (replaced by ``[redacted]``)."""
        if value and value not in self._secrets:
            self._secrets.append(value)

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``callback(record)`` after each emitted line (in the emitting thread);
        returns the function that unsubscribes. Callbacks must be quick and not raise."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def emit(self, event: Event) -> None:
        data = event.data()
        data["run_id"] = self.run_id
        with self._lock:
            self._seq += 1
            record = {
                "seq": self._seq,
                "ts": self._fast_ts() if self._fast_ts else format_ts(self._clock()),
                "type": event.TYPE,
                "run_id": self.run_id,
                "data": data,
            }
            line = _ENCODE(record)
            for secret in self._secrets:
                if secret in line:
                    line = line.replace(secret, REDACTED)
            if self._fd is not None:
                payload = (line + "\n").encode()
                # One write per line (see module docstring). A short write only happens on
                # a full disk or a signal; finishing the rest keeps the line contiguous.
                written = os.write(self._fd, payload)
                while written < len(payload):
                    written += os.write(self._fd, payload[written:])
        if self._subscribers:
            for callback in list(self._subscribers):
                callback(record)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: Path | str) -> Iterator[dict[str, Any]]:
    """Yield each complete event line of ``path`` as a dict.

    A final line without its newline (a writer mid-write) is not yielded. A complete
    line that is not a JSON object raises ``ValueError`` naming the line number: the
    log is never expected to hold one.
    """
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                return
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON event line ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: not a JSON object")
            yield record

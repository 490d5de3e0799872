"""Where the load client dials, and what counts as a tunnel that works.

A ``Route`` is either direct (to the loopback target) or through a proxy (CONNECT or an
absolute-URI request naming ``target_host``). ``CpuUsed`` is the proxy's CPU time over a
phase, read from ``/proc`` by ``bench.proxyproc``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from bench.proxyproc import BenchError, ProxyURL

__all__ = ["ATTEMPTS", "TARGET_HOST", "CpuUsed", "Route", "check_established", "error_text"]

TARGET_HOST: Final = "127.0.0.1"
ATTEMPTS: Final = 3  # tries per tunnel setup outside the rate phase (failures are counted)


@dataclass(frozen=True)
class Route:
    """How the client reaches a target: ``proxy`` None means a direct connection.

    ``pid`` is the proxy's process id, for its CPU time and RSS (None: not measured).
    ``target_host`` is what CONNECT names: an IP literal, or e.g. ``localhost`` so the
    proxy's resolver is part of what is measured.
    """

    name: str
    proxy: ProxyURL | None = None
    pid: int | None = None
    target_host: str = TARGET_HOST

    def connect_request(self, port: int) -> bytes:
        assert self.proxy is not None
        authority = f"{self.target_host}:{port}"
        return (
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n".encode()
            + self.proxy.authorization
            + b"\r\n"
        )

    def dial_address(self, port: int) -> tuple[str, int]:
        if self.proxy is None:
            return (TARGET_HOST, port)
        return (self.proxy.host, self.proxy.port)


_POLICY_REASONS: Final = frozenset(
    {"", "policy_denied", "non_public_address", "port_not_allowed", "ip_literal_refused"}
)
_REASON_HEADER: Final = re.compile(rb"\r\nx-netwarden-reason:[ \t]*([^\r]*)", re.IGNORECASE)


def check_established(route: Route, port: int, head: bytes) -> None:
    status = head.split(b"\r\n", 1)[0]
    parts = status.split(b" ", 2)
    if len(parts) >= 2 and parts[1] == b"200":
        return
    match = _REASON_HEADER.search(head)
    reason = match.group(1).decode(errors="replace").strip() if match else ""
    message = f"{route.name}: CONNECT {route.target_host}:{port} answered"
    message += f" {status.decode(errors='replace')!r}"
    if reason:
        message += f" (X-Netwarden-Reason: {reason})"
    if reason in _POLICY_REASONS:
        message += (
            f"; the proxy's policy must allow the loopback targets ({TARGET_HOST} and"
            f" {route.target_host} on the target ports)"
        )
    raise BenchError(message)


@dataclass(frozen=True)
class CpuUsed:
    """The proxy's CPU time over a phase: user and kernel (system) seconds."""

    user: float
    system: float

    @classmethod
    def between(cls, before: tuple[float, float], after: tuple[float, float]) -> CpuUsed:
        return cls(after[0] - before[0], after[1] - before[1])

    @property
    def total(self) -> float:
        return self.user + self.system


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"

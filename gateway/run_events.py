"""Audit events of a run's sandbox (DESIGN.md "Audit events": sandbox_*)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gateway.audit import Event

__all__ = ["SandboxEgressUnenforced", "SandboxSkipped", "SandboxStarted", "SandboxStopped"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxStarted(Event):
    """A container is up. ``egress``: enforced | unenforced | open | none."""

    TYPE: ClassVar[str] = "sandbox_started"
    image: str
    container: str
    network: str | None
    egress: str
    gateway_ip: str | None = None
    proxy_port: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxSkipped(Event):
    """The command runs on the host, not in a container (``requested``: auto | none)."""

    TYPE: ClassVar[str] = "sandbox_skipped"
    requested: str
    reason: str
    proxied: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxEgressUnenforced(Event):
    """The sandbox runs, but the firewall that confines it to the proxy is missing."""

    TYPE: ClassVar[str] = "sandbox_egress_unenforced"
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxStopped(Event):
    """Teardown done. ``outcome``: exited | cancelled | error; leftovers in ``teardown_errors``."""

    TYPE: ClassVar[str] = "sandbox_stopped"
    where: str  # docker | host
    outcome: str
    exit_code: int | None
    duration_ms: int
    teardown_errors: list[str] = field(default_factory=list)

"""What a proxy is started with: policy, listen address, run identity, seams, limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.audit import AuditLog
from gateway.parser import MAX_HEAD_BYTES
from gateway.resolver import Resolver
from gateway.tunnel import ConnectHandler
from policy import Policy

__all__ = ["ProxyConfig"]


@dataclass(kw_only=True)
class ProxyConfig:
    policy: Policy
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    run_id: str = "run"
    token: str | None = field(default=None, repr=False)  # None: no proxy auth (--no-auth)
    audit: AuditLog | None = None  # None: events discarded
    resolver: Resolver | None = None  # None: the system resolver
    connect_handler: ConnectHandler | None = None  # None: plain tunnel
    max_connections: int = 4096
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0
    header_timeout: float = 10.0
    max_header_bytes: int = MAX_HEAD_BYTES
    drain_timeout: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProxyConfig.{name} must be >= 1")
        for name in ("connect_timeout", "idle_timeout", "header_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ProxyConfig.{name} must be > 0 seconds")
        if self.drain_timeout < 0:
            raise ValueError("ProxyConfig.drain_timeout must be >= 0 seconds")

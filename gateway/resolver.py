"""The resolver seam: how a destination name becomes the addresses the guard checks.

``Resolver`` is a Protocol so tests inject any name -> address mapping (DNS-rebinding
cases) and production uses the system resolver through ``loop.getaddrinfo``. A resolver
returns IP address texts only (no zone ids, no duplicates, resolver order kept); the
gateway checks every one and dials only those, never the name again.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from policy.errors import GatewayError

__all__ = ["CachingResolver", "ResolveFailed", "Resolver", "StaticResolver", "SystemResolver"]


class ResolveFailed(GatewayError):
    """A name did not resolve to any address."""

    def __init__(self, host: str, why: str) -> None:
        self.host = host
        self.why = why
        super().__init__(f"cannot resolve {host!r}: {why}")


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[str]:
        """Addresses of ``host`` (a canonical name, never an IP literal); raises ResolveFailed."""
        ...


@runtime_checkable
class CachingResolver(Resolver, Protocol):
    """A resolver that can answer from memory without a coroutine. The CONNECT fast
    path (handshake.py) asks ``cached`` first and only awaits ``resolve`` on a miss."""

    def cached(self, host: str) -> list[str] | None:
        """The answer still held for ``host`` (a copy), or None: never a lookup."""
        ...


def _unique(addresses: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for address in addresses:
        seen.setdefault(address.split("%", 1)[0], None)
    return list(seen)


class SystemResolver:
    """``loop.getaddrinfo`` (the OS resolver: /etc/hosts, nsswitch, DNS), with answers
    kept for ``cache_ttl`` seconds (getaddrinfo runs in a thread pool and costs more
    than the rest of a tunnel setup). Caching does not weaken the address guard: every
    cached address is checked against the current policy on every use."""

    __slots__ = ("_cache", "_max", "_ttl")

    def __init__(self, cache_ttl: float = 5.0, max_entries: int = 4096) -> None:
        self._ttl = cache_ttl
        self._cache: dict[str, tuple[float, list[str]]] = {}
        self._max = max_entries

    def cached(self, host: str) -> list[str] | None:
        hit = self._cache.get(host)
        if hit is not None and hit[0] > asyncio.get_running_loop().time():
            return list(hit[1])
        return None

    async def resolve(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        hit = self._cache.get(host)
        if hit is not None and hit[0] > now:
            return list(hit[1])
        addresses = await self._lookup(loop, host, port)
        if self._ttl > 0:
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[host] = (now + self._ttl, addresses)
        return list(addresses)

    async def _lookup(self, loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[str]:
        try:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (socket.gaierror, UnicodeError) as exc:
            raise ResolveFailed(host, str(exc) or type(exc).__name__) from exc
        addresses = _unique(str(info[4][0]) for info in infos)
        if not addresses:
            raise ResolveFailed(host, "no addresses")
        return addresses


class StaticResolver:
    """A fixed name -> addresses map (tests, and pinning names in experiments)."""

    __slots__ = ("_table",)

    def __init__(self, table: Mapping[str, Iterable[str]]) -> None:
        self._table = {name.lower().rstrip("."): list(addrs) for name, addrs in table.items()}

    async def resolve(self, host: str, port: int) -> list[str]:
        addresses = self._table.get(host.lower().rstrip("."))
        if not addresses:
            raise ResolveFailed(host, "not in the static table")
        return _unique(addresses)

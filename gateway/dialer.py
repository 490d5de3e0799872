"""Dialing upstream: connect to the first reachable CHECKED address, and remember our own
outbound sockets for the loop defence.

Every address handed to ``Dialer.dial`` is an IP literal the address guard checked;
``create_connection`` resolves a numeric host without a lookup, so the destination name
is never looked up again (DNS-rebinding defence, DESIGN.md "Address guard").

Loop defence, second half: the (local, remote) address pair of every upstream socket any
proxy in this process has open is kept in one registry. An accepted client whose
(peer, our address) is such a pair is our own outbound connection arriving at one of our
listeners: a request looping back into us, directly or through another netwarden proxy
of this process (``came_from_us``). The whole pair is the key because Linux hands the
same ephemeral port to connections toward different destinations: a local address alone
would mistake an ordinary client for a loop.
"""

from __future__ import annotations

import asyncio
from typing import Final

from gateway.relay import Endpoint

__all__ = ["Addr", "Dialer", "UpstreamFailed", "addr_of", "came_from_us"]

Addr = tuple[str, int]
_OUTBOUND: Final[set[tuple[Addr, Addr]]] = set()


def addr_of(name: object) -> Addr | None:
    """``(ip, port)`` of a socket name (IPv4-mapped IPv6 folded to IPv4), or None."""
    if not isinstance(name, tuple) or len(name) < 2:
        return None
    host = str(name[0]).removeprefix("::ffff:")
    return host, int(name[1])


def came_from_us(peer: Addr, sockname: Addr) -> bool:
    """Whether an accepted connection (``peer`` -> our ``sockname``) is one we dialed."""
    return (peer, sockname) in _OUTBOUND


class UpstreamFailed(Exception):
    """Dialing failed; ``code`` is refused|timeout|error (the network_error code)."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(detail)


class Dialer:
    __slots__ = ("_mine", "timeout")

    def __init__(self, connect_timeout: float) -> None:
        self.timeout = connect_timeout
        self._mine: set[tuple[Addr, Addr]] = set()

    @property
    def open_count(self) -> int:
        """Upstream sockets of this dialer still open."""
        return len(self._mine)

    async def dial(self, addresses: tuple[str, ...], port: int) -> tuple[Endpoint, str]:
        """The connected upstream Endpoint and the address it reached."""
        loop = asyncio.get_running_loop()
        last = UpstreamFailed("error", "no address to dial")
        try:
            async with asyncio.timeout(self.timeout):
                for address in addresses:
                    upstream = Endpoint(on_lost=self.forget)
                    try:
                        transport, _ = await loop.create_connection(
                            lambda up=upstream: up,  # type: ignore[misc]  # binds this one
                            address,
                            port,
                        )
                    except ConnectionRefusedError:
                        last = UpstreamFailed("refused", f"connection refused by {address}")
                        continue
                    except OSError as exc:
                        last = UpstreamFailed("error", f"{address}: {exc.strerror or exc}")
                        continue
                    local = addr_of(transport.get_extra_info("sockname"))
                    remote = addr_of(transport.get_extra_info("peername"))
                    if local is not None and remote is not None:
                        upstream.local = (local, remote)
                        self._mine.add(upstream.local)
                        _OUTBOUND.add(upstream.local)
                    return upstream, address
        except TimeoutError:
            raise UpstreamFailed("timeout", "connect timed out") from None
        raise last

    def forget(self, upstream: Endpoint) -> None:
        """``upstream`` is gone: drop it from the loop registry."""
        if upstream.local is not None:
            self._mine.discard(upstream.local)
            _OUTBOUND.discard(upstream.local)

    def close(self) -> None:
        """Drop every socket of ours from the registry (the proxy stopped)."""
        _OUTBOUND.difference_update(self._mine)
        self._mine.clear()

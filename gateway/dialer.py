"""Dialing upstream: connect to the first reachable CHECKED address, and remember our own
outbound sockets for the loop defence.

Every address handed to ``Dialer.dial`` is an IP literal the address guard checked;
``create_connection`` resolves a numeric host without a lookup, so the destination name
is never looked up again (DNS-rebinding defence, DESIGN.md "Address guard").

Loop defence, second half: the local (ip, port) of every upstream socket any proxy in
this process has open is kept in one registry. A client that arrives FROM one of them is
a request looping back into us, directly or through another netwarden proxy of this
process (``came_from_us``).
"""

from __future__ import annotations

import asyncio
from typing import Final

from gateway.relay import Endpoint

__all__ = ["Dialer", "UpstreamFailed", "came_from_us"]

_OUTBOUND: Final[set[tuple[str, int]]] = set()


def came_from_us(peer: tuple[str, int]) -> bool:
    return peer in _OUTBOUND


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
        self._mine: set[tuple[str, int]] = set()

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
                    local = transport.get_extra_info("sockname")
                    if local is not None:
                        upstream.local = (str(local[0]), int(local[1]))
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

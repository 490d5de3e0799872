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
import logging
from collections.abc import Callable
from typing import Final

from gateway.relay import Endpoint

__all__ = ["Addr", "Dialed", "Dialer", "UpstreamFailed", "addr_of", "came_from_us"]

log = logging.getLogger("netwarden.proxy")

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


Dialed = tuple[Endpoint, str] | UpstreamFailed
"""What a dial ends with: the upstream and the address it reached, or why it failed."""


class Dialer:
    __slots__ = ("_mine", "_pending", "timeout")

    def __init__(self, connect_timeout: float) -> None:
        self.timeout = connect_timeout
        self._mine: set[tuple[Addr, Addr]] = set()
        self._pending: set[_Attempt] = set()

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
                    self._connected(upstream, transport)
                    return upstream, address
        except TimeoutError:
            raise UpstreamFailed("timeout", "connect timed out") from None
        raise last

    def dial_soon(
        self, addresses: tuple[str, ...], port: int, done: Callable[[Dialed], None]
    ) -> None:
        """``dial`` driven by callbacks: ``done`` is called once with the result.

        The CONNECT fast path uses it so that a new tunnel costs one task (the one
        ``create_connection`` needs) and one timer, instead of a coroutine per client
        plus a ``timeout`` context.
        """
        _Attempt(self, addresses, port, done).next()

    def cancel_pending(self) -> None:
        """Abandon the dials in flight (the proxy is stopping). Each logs a timeout
        (network_error); its client was already closed by stop(), so it gets no 504."""
        for attempt in list(self._pending):
            attempt.cancel()

    def _connected(self, upstream: Endpoint, transport: asyncio.BaseTransport) -> None:
        local = addr_of(transport.get_extra_info("sockname"))
        remote = addr_of(transport.get_extra_info("peername"))
        if local is not None and remote is not None:
            upstream.local = (local, remote)
            self._mine.add(upstream.local)
            _OUTBOUND.add(upstream.local)

    def forget(self, upstream: Endpoint) -> None:
        """``upstream`` is gone: drop it from the loop registry."""
        if upstream.local is not None:
            self._mine.discard(upstream.local)
            _OUTBOUND.discard(upstream.local)

    def close(self) -> None:
        """Drop every socket of ours from the registry (the proxy stopped)."""
        _OUTBOUND.difference_update(self._mine)
        self._mine.clear()


def _failure(address: str, exc: BaseException) -> UpstreamFailed:
    if isinstance(exc, ConnectionRefusedError):
        return UpstreamFailed("refused", f"connection refused by {address}")
    if isinstance(exc, OSError):
        return UpstreamFailed("error", f"{address}: {exc.strerror or exc}")
    log.error("unexpected error dialing %s", address, exc_info=exc)
    return UpstreamFailed("error", f"{address}: {type(exc).__name__}")


class _Attempt:
    """One ``dial_soon``: the checked addresses in order, one overall deadline."""

    __slots__ = ("addresses", "dialer", "done", "index", "last", "port", "task", "timer")

    def __init__(
        self,
        dialer: Dialer,
        addresses: tuple[str, ...],
        port: int,
        done: Callable[[Dialed], None],
    ) -> None:
        self.dialer = dialer
        self.addresses = addresses
        self.port = port
        self.done = done
        self.index = 0
        self.last = UpstreamFailed("error", "no address to dial")
        self.task: asyncio.Task[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]] | None = None
        self.timer = asyncio.get_running_loop().call_later(dialer.timeout, self.cancel)
        dialer._pending.add(self)

    def next(self) -> None:
        if self.index >= len(self.addresses):
            self._finish(self.last)
            return
        address = self.addresses[self.index]
        self.index += 1
        upstream = Endpoint(on_lost=self.dialer.forget)
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(loop.create_connection(lambda: upstream, address, self.port))
        self.task.add_done_callback(lambda task: self._connected(task, upstream, address))

    def cancel(self) -> None:
        """The deadline passed (or the proxy stops): give up with a timeout."""
        if self.task is not None:
            self.task.cancel()  # _connected reports the timeout
        else:
            self._finish(UpstreamFailed("timeout", "connect timed out"))

    def _connected(
        self,
        task: asyncio.Task[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]],
        upstream: Endpoint,
        address: str,
    ) -> None:
        self.task = None
        if task.cancelled():
            self._finish(UpstreamFailed("timeout", "connect timed out"))
            return
        exc = task.exception()
        if exc is not None:
            self.last = _failure(address, exc)
            self.next()
            return
        self.dialer._connected(upstream, task.result()[0])
        self._finish((upstream, address))

    def _finish(self, result: Dialed) -> None:
        self.timer.cancel()
        self.dialer._pending.discard(self)
        self.done(result)

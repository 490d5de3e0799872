"""One side of a proxied connection (client or upstream) as an asyncio Protocol, and the
splice that turns two of them into a tunnel.

An ``Endpoint`` has two modes:

* buffered (handshake, HTTP forward): bytes collect in ``buffer`` and a coroutine
  awaits them with ``wait_data``; reading pauses while the buffer is over its limit
  (a fast sender cannot make us buffer without bound).
* relaying (``splice``): every ``data_received`` goes straight to the peer's transport.
  No task and no coroutine per tunnel, only callbacks. Backpressure: when the peer's
  write buffer passes its high-water mark asyncio calls ``pause_writing`` on the peer,
  which pauses OUR reading until ``resume_writing``. Half-close: EOF from one side
  becomes ``write_eof`` on the other; the tunnel ends once both directions are done
  or either side is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, cast

__all__ = ["BUFFER_LIMIT", "Endpoint", "splice"]

BUFFER_LIMIT: Final = 256 * 1024


class Endpoint(asyncio.Protocol):
    __slots__ = (
        "_drain",
        "_lost",
        "_read_paused",
        "_waiter",
        "_write_paused",
        "buffer",
        "bytes_in",
        "eof",
        "last_active",
        "local",
        "on_lost",
        "peer",
        "transport",
    )

    def __init__(self, on_lost: Callable[[Endpoint], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.peer: Endpoint | None = None
        self.bytes_in = 0
        self.last_active = 0.0
        self._lost = False
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._read_paused = False
        self._write_paused = False
        self.on_lost = on_lost
        # (our address, peer address) of a dialed socket (loop defence, dialer.py)
        self.local: tuple[tuple[str, int], tuple[str, int]] | None = None

    # -- asyncio.Protocol callbacks ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        peer = self.peer
        if peer is not None:
            self.last_active = peer.last_active = _now()
            if peer.transport is not None and not peer._lost:
                peer.transport.write(data)
            return
        self.buffer += data
        if len(self.buffer) > BUFFER_LIMIT and not self._read_paused and self.transport:
            self._read_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is None:
            self._wake()
            return True  # keep the transport: the coroutine decides
        if peer.eof:
            # Both directions are done. close() flushes what is queued and sends the FIN
            # itself: a shutdown(SHUT_WR) first would be a syscall for nothing.
            self._close_pair()
        elif peer.transport is not None and not peer._lost and peer.transport.can_write_eof():
            peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.eof = True
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer._lost:
            # Flushes what is queued toward the peer, then closes it.
            peer.transport.close()
        callback, self.on_lost = self.on_lost, None
        if callback is not None:
            callback(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer._lost:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer._lost:
            peer.transport.resume_reading()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- buffered mode: used by coroutines --------------------------------------------

    @property
    def lost(self) -> bool:
        return self._lost

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_data(self) -> None:
        """Return once ``buffer`` may hold more bytes than before, or EOF/loss."""
        if self.eof:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self, count: int | None = None) -> bytes:
        """Remove and return up to ``count`` (all) buffered bytes; resumes reading."""
        if count is None or count >= len(self.buffer):
            data = bytes(self.buffer)
            self.buffer.clear()
        else:
            data = bytes(self.buffer[:count])
            del self.buffer[:count]
        if self._read_paused and len(self.buffer) <= BUFFER_LIMIT // 2 and self.transport:
            self._read_paused = False
            self.transport.resume_reading()
        return data

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self._lost:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while our transport's write buffer is over its high-water mark."""
        if not self._write_paused or self._lost:
            return
        self._drain = asyncio.get_running_loop().create_future()
        try:
            await self._drain
        finally:
            self._drain = None

    def close(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.abort()

    # -- relaying --------------------------------------------------------------------

    def _close_pair(self) -> None:
        self.close()
        if self.peer is not None:
            self.peer.close()


def _now() -> float:
    return asyncio.get_running_loop().time()


def splice(client: Endpoint, upstream: Endpoint) -> None:
    """Make ``client`` and ``upstream`` a tunnel: from now on bytes flow by callbacks.

    Bytes already buffered on either side (e.g. a TLS ClientHello pipelined right
    behind the CONNECT head) are forwarded first; an EOF already seen is passed on.
    """
    client.peer = upstream
    upstream.peer = client
    client.last_active = upstream.last_active = _now()
    for src, dst in ((client, upstream), (upstream, client)):
        src.bytes_in = len(src.buffer)  # tunnel byte counts start here
        if src.buffer:
            dst.write(src.take())
        if src._read_paused and src.transport is not None and not src._lost:
            src._read_paused = False
            src.transport.resume_reading()
        if dst._write_paused and src.transport is not None and not src._lost:
            src.transport.pause_reading()
    for src, dst in ((client, upstream), (upstream, client)):
        if src.lost:
            dst.close()
        elif (
            src.eof and dst.transport is not None and not dst.lost and dst.transport.can_write_eof()
        ):
            dst.transport.write_eof()
    if client.eof and upstream.eof:
        client._close_pair()

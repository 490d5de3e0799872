"""Loopback servers the load client measures against, run in their own process.

``python -m bench.targets`` binds three listeners on 127.0.0.1 (port 0) and prints ONE
JSON line when they are ready, ``{"type": "ready", "echo": P, "sink": P, "http": P}``,
then serves until its stdin closes (so it dies with the load client) or SIGTERM:

- ``echo``: writes back every byte it reads (tunnel setup latency, idle tunnels).
- ``sink``: a stream target for throughput. The client sends a 9-byte header, a mode
  byte and a big-endian u64 length. Mode ``U`` (upload): the sink reads exactly that many
  bytes and answers one byte ``K``, so the client's clock stops only once every byte has
  arrived, without depending on half-close. Mode ``D`` (download): the sink sends that
  many bytes, then waits for the client to close.
- ``http``: HTTP/1.1 keep-alive origin answering every request head with a fixed
  12-byte ``200`` (plain-HTTP request rate).

The echo and HTTP servers are asyncio Protocols (uvloop when installed); the sink is a
thread per connection on blocking sockets with ``recv_into`` a preallocated buffer, so
a byte costs the target one kernel copy and no allocation: the direct baseline must
measure loopback, not this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
from typing import Final, cast

__all__ = ["HTTP_BODY", "SINK_HEADER", "run_targets"]

SINK_HEADER: Final = struct.Struct("!cQ")
HTTP_BODY: Final = b"hello world\n"
_HTTP_RESPONSE: Final = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
    + str(len(HTTP_BODY)).encode()
    + b"\r\n\r\n"
    + HTTP_BODY
)
_CHUNK: Final = 1 << 20
_MAX_HEAD: Final = 64 * 1024


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._transport.write(data)

    def eof_received(self) -> bool:
        return False  # close our side too


class _KeepAliveHttp(asyncio.Protocol):
    """Answers each request head (up to the blank line) with the fixed response.

    Bench clients send GETs without bodies, so a head is the whole request.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        answers = buffer.count(b"\r\n\r\n")
        if answers:
            self._transport.write(_HTTP_RESPONSE * answers)
            buffer = buffer[buffer.rindex(b"\r\n\r\n") + 4 :]
        if len(buffer) > _MAX_HEAD:
            self._transport.close()
            return
        self._buffer = buffer

    def eof_received(self) -> bool:
        return False


def _recv_exactly(sock: socket.socket, view: memoryview, length: int) -> None:
    remaining = length
    while remaining:
        got = sock.recv_into(view, min(remaining, len(view)))
        if not got:
            raise ConnectionError(f"sink: peer closed with {remaining} bytes still expected")
        remaining -= got


def _serve_sink_connection(sock: socket.socket) -> None:
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with sock, contextlib.suppress(OSError):
        header = bytearray(SINK_HEADER.size)
        _recv_exactly(sock, memoryview(header), SINK_HEADER.size)
        mode, length = SINK_HEADER.unpack(header)
        if mode == b"U":
            _recv_exactly(sock, view, length)
            sock.sendall(b"K")
        elif mode == b"D":
            remaining = length
            while remaining:
                step = min(remaining, _CHUNK)
                sock.sendall(view[:step])
                remaining -= step
        # Wait for the client to close first, so TIME_WAIT lands on its side.
        while sock.recv_into(view):
            pass


def _serve_sink(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_sink_connection, args=(conn,), daemon=True).start()


async def run_targets() -> None:
    """Serve until stdin reaches EOF or SIGTERM/SIGINT arrives."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode):  # a parent's pipe: die with it
        loop.add_reader(sys.stdin.fileno(), lambda: None if os.read(0, 4096) else stop.set())

    echo = await loop.create_server(_Echo, "127.0.0.1", 0, backlog=4096)
    http = await loop.create_server(_KeepAliveHttp, "127.0.0.1", 0, backlog=4096)
    sink = socket.create_server(("127.0.0.1", 0), backlog=256)
    threading.Thread(target=_serve_sink, args=(sink,), daemon=True).start()

    def port(server: asyncio.Server) -> int:
        return int(server.sockets[0].getsockname()[1])

    ready = {"type": "ready", "echo": port(echo), "sink": sink.getsockname()[1], "http": port(http)}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    await stop.wait()
    echo.close()
    http.close()
    sink.close()


def main() -> int:
    try:
        import uvloop  # optional speed-up

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(run_targets())
    return 0


if __name__ == "__main__":
    sys.exit(main())

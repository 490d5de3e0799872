"""Relay throughput: bytes through established tunnels, timed from a common start.

Blocking sockets in threads with 1 MiB ``sendall``/``recv_into`` on preallocated
buffers: the GIL is released for the whole syscall, so the client costs a few Python
bytecodes per MiB. The direct route runs the same code without the proxy hop.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from bench.proxyproc import BenchError, cpu_seconds
from bench.route import ATTEMPTS, CpuUsed, Route, check_established, error_text
from bench.targets import SINK_HEADER

__all__ = ["Throughput", "best_of", "stream_throughput"]

_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class Throughput:
    streams: int
    bytes_moved: int
    seconds: float
    proxy_cpu: CpuUsed | None = None

    @property
    def mb_per_s(self) -> float:
        return self.bytes_moved / self.seconds / 1e6

    @property
    def proxy_busy(self) -> float | None:
        """Share of one core the proxy used while the bytes moved (near 1.0: the proxy
        is the bottleneck; well below: the client, the targets or the kernel are)."""
        return None if self.proxy_cpu is None else self.proxy_cpu.total / self.seconds

    @property
    def mb_per_cpu_second(self) -> float | None:
        """MB relayed per second of proxy CPU: the proxy's efficiency, much less
        sensitive than MB/s to other load on the machine."""
        if self.proxy_cpu is None or self.proxy_cpu.total <= 0:
            return None
        return self.bytes_moved / self.proxy_cpu.total / 1e6


def _open_blocking(route: Route, port: int) -> socket.socket:
    sock = socket.create_connection(route.dial_address(port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if route.proxy is not None:
        sock.sendall(route.connect_request(port))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise BenchError(f"{route.name}: proxy closed the connection during CONNECT")
            head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        check_established(route, port, head)
        if rest:
            raise BenchError(f"{route.name}: {len(rest)} unexpected bytes after the CONNECT answer")
    return sock


def _stream(
    sock: socket.socket, mode: bytes, size: int, start: threading.Barrier
) -> tuple[float, float]:
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    start.wait()
    began = time.perf_counter()
    sock.sendall(SINK_HEADER.pack(mode, size))
    if mode == b"U":
        remaining = size
        while remaining:
            step = min(remaining, _CHUNK)
            sock.sendall(view[:step])
            remaining -= step
        if sock.recv(1) != b"K":
            raise BenchError("sink did not acknowledge the upload (tunnel closed early?)")
    else:
        remaining = size
        while remaining:
            got = sock.recv_into(view, min(remaining, _CHUNK))
            if not got:
                raise BenchError(
                    f"download ended with {remaining} bytes missing (tunnel closed early?)"
                )
            remaining -= got
    return began, time.perf_counter()


def _open_blocking_retrying(route: Route, port: int, errors: list[str] | None) -> socket.socket:
    """``_open_blocking``; with an ``errors`` list, a failed setup is recorded there and
    retried (at most ``ATTEMPTS`` tries), so one refusal does not void a whole run."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _open_blocking(route, port)
        except (OSError, BenchError) as exc:
            if errors is None or attempt == ATTEMPTS:
                raise
            errors.append(error_text(exc))
    raise AssertionError("unreachable")


def stream_throughput(
    route: Route,
    sink_port: int,
    *,
    mode: bytes,
    streams: int,
    total: int,
    errors: list[str] | None = None,
) -> Throughput:
    """``streams`` tunnels moving ``total`` bytes between them, timed from a common start.

    Tunnels are set up first; the clock covers only the bytes (first header sent to
    last byte acknowledged), so this is relay throughput, not setup cost.
    """
    per_stream = total // streams
    socks = [_open_blocking_retrying(route, sink_port, errors) for _ in range(streams)]
    start = threading.Barrier(streams)
    cpu_before = cpu_seconds(route.pid) if route.pid else None
    try:
        with ThreadPoolExecutor(max_workers=streams) as pool:
            futures = [pool.submit(_stream, sock, mode, per_stream, start) for sock in socks]
            spans = [future.result() for future in futures]
    finally:
        for sock in socks:
            sock.close()
    cpu = None
    if route.pid and cpu_before is not None:
        cpu = CpuUsed.between(cpu_before, cpu_seconds(route.pid))
    began = min(span[0] for span in spans)
    ended = max(span[1] for span in spans)
    return Throughput(streams, per_stream * streams, ended - began, cpu)


def best_of(runs: int, measure: Callable[[], Throughput]) -> Throughput:
    """The fastest of ``runs`` (other engineers share this machine: noise only slows)."""
    return max((measure() for _ in range(runs)), key=lambda result: result.mb_per_s)

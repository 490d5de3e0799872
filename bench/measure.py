"""The measurements. Each takes a ``Route``: direct to the target, or through a proxy.

Throughput uses blocking sockets in threads with 1 MiB ``sendall``/``recv_into`` on
preallocated buffers (the GIL is released for the whole syscall, so the client costs a
few Python bytecodes per MiB). Tunnel setup, idle tunnels and HTTP keep-alive use the
event loop's ``sock_*`` calls on raw non-blocking sockets (uvloop when installed): no
StreamReader layers in the client. The direct rows run the same code without the
proxy hop, so a direct figure far above the proxied one shows the client was not the
limit.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from bench.proxyproc import BenchError, ProxyURL, cpu_seconds, rss_bytes
from bench.targets import HTTP_BODY, SINK_HEADER

__all__ = [
    "CpuUsed",
    "HttpRate",
    "IdleMemory",
    "Route",
    "Throughput",
    "TunnelRate",
    "best_of",
    "http_rate",
    "idle_tunnels",
    "stream_throughput",
    "tunnel_rate",
]

_CHUNK: Final = 1 << 20
_TARGET_HOST: Final = "127.0.0.1"
_CONTENT_LENGTH: Final = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


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
    target_host: str = _TARGET_HOST

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
            return (_TARGET_HOST, port)
        return (self.proxy.host, self.proxy.port)


_POLICY_REASONS: Final = frozenset(
    {"", "policy_denied", "non_public_address", "port_not_allowed", "ip_literal_refused"}
)
_REASON_HEADER: Final = re.compile(rb"\r\nx-netwarden-reason:[ \t]*([^\r]*)", re.IGNORECASE)


def _check_established(route: Route, port: int, head: bytes) -> None:
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
            f"; the proxy's policy must allow the loopback targets ({_TARGET_HOST} and"
            f" {route.target_host} on the target ports)"
        )
    raise BenchError(message)


# ---------------------------------------------------------------------------------------
# Throughput: blocking sockets, one thread per stream.


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
        _check_established(route, port, head)
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


_ATTEMPTS: Final = 3


def _open_blocking_retrying(route: Route, port: int, errors: list[str] | None) -> socket.socket:
    """``_open_blocking``; with an ``errors`` list, a failed setup is recorded there and
    retried (at most ``_ATTEMPTS`` tries), so one refusal does not void a whole run."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return _open_blocking(route, port)
        except (OSError, BenchError) as exc:
            if errors is None or attempt == _ATTEMPTS:
                raise
            errors.append(_error_text(exc))
    raise AssertionError("unreachable")


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"


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


# ---------------------------------------------------------------------------------------
# Tunnel setup, idle tunnels, keep-alive HTTP: raw non-blocking sockets on the loop.


async def _read_head(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, what: str
) -> tuple[bytes, bytes]:
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError(f"{what}: peer closed before a complete response head")
        data += chunk
    return data[:end], data[end + 4 :]


async def _open_tunnel(loop: asyncio.AbstractEventLoop, route: Route, port: int) -> socket.socket:
    """Connect (through the proxy), then one byte out and back: the tunnel is whole."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, route.dial_address(port))
        if route.proxy is not None:
            await loop.sock_sendall(sock, route.connect_request(port))
            head, rest = await _read_head(loop, sock, "CONNECT")
            _check_established(route, port, head)
            if rest:
                raise ConnectionError(f"{len(rest)} unexpected bytes after the CONNECT answer")
        await loop.sock_sendall(sock, b"x")
        if await loop.sock_recv(sock, 1) != b"x":
            raise ConnectionError("the echo target's byte did not come back through the tunnel")
    except BaseException:
        sock.close()
        raise
    return sock


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


@dataclass(frozen=True)
class TunnelRate:
    tunnels: int
    errors: int
    seconds: float
    latencies: tuple[float, ...]
    proxy_cpu: CpuUsed | None
    first_error: str | None

    @property
    def per_second(self) -> float:
        return self.tunnels / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def cpu_per_tunnel(self) -> float | None:
        if self.proxy_cpu is None or not self.tunnels:
            return None
        return self.proxy_cpu.total / self.tunnels

    @property
    def kernel_cpu_per_tunnel(self) -> float | None:
        if self.proxy_cpu is None or not self.tunnels:
            return None
        return self.proxy_cpu.system / self.tunnels


async def _settled_cpu(pid: int) -> tuple[float, float]:
    """The proxy's (user, system) CPU time once it has stopped using CPU (teardown and
    audit writes finish after the client closed). Polls every 100 ms, at most 3 s."""
    last = cpu_seconds(pid)
    for _ in range(30):
        await asyncio.sleep(0.1)
        now = cpu_seconds(pid)
        if now == last:
            return now
        last = now
    return last


async def tunnel_rate(
    route: Route, echo_port: int, *, concurrency: int, seconds: float
) -> TunnelRate:
    """New tunnels back to back from ``concurrency`` workers for ``seconds``: each
    connects, CONNECTs, echoes one byte and closes. Latency is that whole exchange."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors: list[str] = []
    cpu_before = await _settled_cpu(route.pid) if route.pid else None
    began = time.perf_counter()
    deadline = began + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                sock = await _open_tunnel(loop, route, echo_port)
            except (OSError, BenchError) as exc:
                errors.append(_error_text(exc))
                continue
            sock.close()
            latencies.append(time.perf_counter() - t0)

    async with asyncio.TaskGroup() as tasks:
        for _ in range(concurrency):
            tasks.create_task(worker())
    elapsed = time.perf_counter() - began
    cpu = None
    if route.pid and cpu_before is not None:
        cpu = CpuUsed.between(cpu_before, await _settled_cpu(route.pid))
    return TunnelRate(
        len(latencies), len(errors), elapsed, tuple(latencies), cpu, errors[0] if errors else None
    )


@dataclass(frozen=True)
class IdleMemory:
    tunnels: int
    rss_before: int
    rss_after: int

    @property
    def per_tunnel(self) -> float:
        return (self.rss_after - self.rss_before) / self.tunnels


async def idle_tunnels(
    route: Route,
    echo_port: int,
    *,
    count: int,
    concurrency: int = 64,
    errors: list[str] | None = None,
) -> IdleMemory:
    """The proxy's RSS growth with ``count`` tunnels open and idle (each carried one byte).

    Run it first on a fresh proxy: a warm-up of ``concurrency`` tunnels loads the code
    paths, then RSS is read before and after opening ``count`` tunnels.
    """
    if route.pid is None:
        raise BenchError(f"{route.name}: idle-tunnel RSS needs the proxy's pid")
    loop = asyncio.get_running_loop()
    for sock in await _open_many(loop, route, echo_port, concurrency, concurrency, errors):
        sock.close()
    await _settled_cpu(route.pid)
    before = rss_bytes(route.pid)
    socks = await _open_many(loop, route, echo_port, count, concurrency, errors)
    try:
        await _settled_cpu(route.pid)
        after = rss_bytes(route.pid)
    finally:
        for sock in socks:
            sock.close()
    return IdleMemory(count, before, after)


async def _open_many(
    loop: asyncio.AbstractEventLoop,
    route: Route,
    port: int,
    count: int,
    concurrency: int,
    errors: list[str] | None,
) -> list[socket.socket]:
    opened: list[socket.socket] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            for attempt in range(1, _ATTEMPTS + 1):
                try:
                    opened.append(await _open_tunnel(loop, route, port))
                    return
                except (OSError, BenchError) as exc:
                    if errors is None or attempt == _ATTEMPTS:
                        raise
                    errors.append(_error_text(exc))

    try:
        async with asyncio.TaskGroup() as tasks:
            for _ in range(count):
                tasks.create_task(one())
    except BaseException:
        for sock in opened:
            sock.close()
        raise
    return opened


@dataclass(frozen=True)
class HttpRate:
    requests: int
    reconnects: int
    seconds: float
    proxy_cpu: CpuUsed | None

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_per_request(self) -> float | None:
        if self.proxy_cpu is None or not self.requests:
            return None
        return self.proxy_cpu.total / self.requests


def _http_request(route: Route, port: int) -> bytes:
    authority = f"{_TARGET_HOST}:{port}"
    if route.proxy is None:
        return f"GET /bench HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
    return (
        f"GET http://{route.target_host}:{port}/bench HTTP/1.1\r\nHost: {route.target_host}:{port}\r\n".encode()
        + route.proxy.authorization
        + b"\r\n"
    )


async def _read_response(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, buffered: bytes
) -> tuple[bool, bytes]:
    """One response off ``sock``; returns (keep-alive?, bytes read past its end)."""
    data = buffered
    while (end := data.find(b"\r\n\r\n")) < 0:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError("closed before a response head")
        data += chunk
    head, body = data[:end], data[end + 4 :]
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        raise BenchError(
            f"HTTP request answered {head.split(b'\r\n', 1)[0].decode(errors='replace')!r}"
        )
    match = _CONTENT_LENGTH.search(head)
    if match:
        length = int(match.group(1))
        while len(body) < length:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                raise ConnectionError("closed mid-body")
            body += chunk
        if body[:length] != HTTP_BODY:
            raise BenchError(f"unexpected response body {body[:length][:80]!r}")
        rest = body[length:]
    else:  # chunked: read to the last-chunk marker (the bench body has no trailers)
        while b"0\r\n\r\n" not in body:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                raise ConnectionError("closed mid-body")
            body += chunk
        rest = body[body.index(b"0\r\n\r\n") + 5 :]
    keep_alive = b"connection: close" not in head.lower()
    return keep_alive, rest


async def http_rate(route: Route, http_port: int, *, connections: int, seconds: float) -> HttpRate:
    """Keep-alive GETs, one in flight per connection, for ``seconds``. A connection the
    far side closes is reopened and counted in ``reconnects``."""
    loop = asyncio.get_running_loop()
    request = _http_request(route, http_port)
    counts = [0] * connections
    reconnects = [0] * connections
    cpu_before = await _settled_cpu(route.pid) if route.pid else None
    began = time.perf_counter()
    deadline = began + seconds

    async def connect() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, route.dial_address(http_port))
        return sock

    async def worker(index: int) -> None:
        sock = await connect()
        rest = b""
        try:
            while time.perf_counter() < deadline:
                await loop.sock_sendall(sock, request)
                keep_alive, rest = await _read_response(loop, sock, rest)
                counts[index] += 1
                if not keep_alive:
                    sock.close()
                    sock = await connect()
                    rest = b""
                    reconnects[index] += 1
        finally:
            sock.close()

    async with asyncio.TaskGroup() as tasks:
        for index in range(connections):
            tasks.create_task(worker(index))
    elapsed = time.perf_counter() - began
    cpu = None
    if route.pid and cpu_before is not None:
        cpu = CpuUsed.between(cpu_before, await _settled_cpu(route.pid))
    return HttpRate(sum(counts), sum(reconnects), elapsed, cpu)


def best_of(runs: int, measure: Callable[[], Throughput]) -> Throughput:
    """The fastest of ``runs`` (other engineers share this machine: noise only slows)."""
    return max((measure() for _ in range(runs)), key=lambda result: result.mb_per_s)

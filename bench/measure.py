"""Tunnel setup rate, idle-tunnel memory and keep-alive HTTP rate.

The event loop's ``sock_*`` calls on raw non-blocking sockets (uvloop when installed):
no StreamReader layers in the client. The direct rows run the same code without the
proxy hop, so a direct figure far above the proxied one shows the client was not the
limit.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass
from typing import Final

from bench.proxyproc import BenchError, cpu_seconds, rss_bytes
from bench.route import ATTEMPTS, TARGET_HOST, CpuUsed, Route, check_established, error_text
from bench.targets import HTTP_BODY

__all__ = [
    "HttpRate",
    "IdleMemory",
    "TunnelRate",
    "http_rate",
    "idle_tunnels",
    "tunnel_rate",
]

_CONTENT_LENGTH: Final = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


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
            check_established(route, port, head)
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
                errors.append(error_text(exc))
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
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    opened.append(await _open_tunnel(loop, route, port))
                    return
                except (OSError, BenchError) as exc:
                    if errors is None or attempt == ATTEMPTS:
                        raise
                    errors.append(error_text(exc))

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
    authority = f"{TARGET_HOST}:{port}"
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

"""Shared support for the gateway tests (fixtures are re-exported by conftest.py): real servers on loopback: HTTP/HTTPS origins, a TCP echo server,
and a factory for started proxies. Fakes only at the resolver seam."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from gateway.audit import AuditLog, read_events
from gateway.resolver import Resolver
from gateway.server import ProxyConfig, ProxyServer
from policy import Mode, policy_from_rules

TOKEN = "test-token-0123456789"


class _Origin(BaseHTTPRequestHandler):
    """Echoes what it got as JSON: method, path, headers, body. ``/chunked`` answers
    chunked, ``/ws`` accepts an Upgrade and then echoes raw bytes, ``/reset`` resets."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self) -> None:
        body = self._body()
        if self.path == "/reset":
            self.connection.setsockopt(
                __import__("socket").SOL_SOCKET,
                __import__("socket").SO_LINGER,
                b"\x01\x00\x00\x00\x00\x00\x00\x00",
            )
            self.connection.close()
            self.close_connection = True
            return
        if self.path == "/ws":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while data := self.connection.recv(65536):
                self.connection.sendall(data)
            self.close_connection = True
            return
        payload = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body.decode("latin-1"),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(payload) // 2
            for part in (payload[:half], payload[half:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1234")
        self.end_headers()


@dataclass
class Origin:
    host: str
    port: int
    scheme: str = "http"
    ca_file: str | None = None

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"


def _serve(server: ThreadingHTTPServer) -> Iterator[None]:
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield
    server.shutdown()
    server.server_close()


@pytest.fixture
def http_origin() -> Iterator[Origin]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    gen = _serve(server)
    next(gen)
    yield Origin("127.0.0.1", server.server_address[1])
    next(gen, None)


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def https_origin(ca: trustme.CA, tmp_path: Path) -> Iterator[Origin]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1", "origin.test").configure_cert(ctx)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    gen = _serve(server)
    next(gen)
    yield Origin("127.0.0.1", server.server_address[1], "https", str(ca_file))
    next(gen, None)


@dataclass
class Echo:
    port: int
    server: asyncio.Server
    active: int = 0
    changed: asyncio.Event | None = None

    async def wait_idle(self) -> None:
        """Until every echo connection has been closed on the server side."""
        assert self.changed is not None
        async with asyncio.timeout(20):
            while self.active:
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    """A TCP echo server (asyncio, same loop). Half-close aware: EOF in -> EOF out."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.active += 1
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            state.active -= 1
            changed.set()

    changed = asyncio.Event()
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=2048)
    state = Echo(server.sockets[0].getsockname()[1], server, changed=changed)
    yield state
    server.close()


class StaticMap:
    """The injected resolver: names -> addresses, or a hang for timeout tests."""

    def __init__(self, table: dict[str, list[str]], *, hang: Sequence[str] = ()) -> None:
        self.table = table
        self.hang = set(hang)
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        from gateway.resolver import ResolveFailed

        self.calls.append(host)
        if host in self.hang:
            await asyncio.Event().wait()
        if host not in self.table:
            raise ResolveFailed(host, "NXDOMAIN (test map)")
        return list(self.table[host])


@dataclass
class Proxy:
    server: ProxyServer
    events_path: Path

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.proxy_url()

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events_path) if kind is None or e["type"] == kind]

    async def wait_event(self, kind: str) -> dict[str, Any]:
        """The first ``kind`` event, awaiting its emission (tunnels log when they close)."""
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[dict[str, Any]] = loop.create_future()

        def on_emit(record: dict[str, Any]) -> None:
            if record["type"] == kind and not seen.done():
                seen.set_result(record)

        unsubscribe = self.server.audit.subscribe(on_emit)
        try:
            if found := self.events(kind):
                return found[0]
            return await asyncio.wait_for(seen, 5)
        finally:
            unsubscribe()


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def make_proxy(tmp_path: Path) -> AsyncIterator[MakeProxy]:
    started: list[Proxy] = []

    async def make(
        rules: Sequence[str] = (),
        *,
        mode: Mode = Mode.ALLOWLIST,
        resolver: Resolver | None = None,
        token: str | None = TOKEN,
        silent: Sequence[str] = (),
        **limits: Any,
    ) -> Proxy:
        policy = policy_from_rules(list(rules), mode=mode, silent=list(silent), name="test")
        path = tmp_path / f"events-{len(started)}.jsonl"
        config = ProxyConfig(
            policy=policy,
            run_id="r-test",
            token=token,
            audit=AuditLog(path, "r-test"),
            resolver=resolver,
            **limits,
        )
        server = ProxyServer(config)
        await server.start()
        proxy = Proxy(server, path)
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        await proxy.server.stop()
        proxy.server.audit.close()


def auth_header(token: str = TOKEN) -> bytes:
    basic = base64.b64encode(f"agent:{token}".encode()).decode()
    return f"Proxy-Authorization: Basic {basic}\r\n".encode()


async def open_raw(proxy: Proxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def connect(
    proxy: Proxy, target: str, *, extra: bytes = b"", auth: bool = True
) -> tuple[int, dict[str, str], bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send ``CONNECT target`` (+ ``extra`` right behind the head) and read the answer head.
    Returns status, headers, body (for refusals), and the open streams."""
    reader, writer = await open_raw(proxy)
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n".encode()
    writer.write(head + (auth_header() if auth else b"") + b"\r\n" + extra)
    await writer.drain()
    status, headers, body = await read_response(reader)
    return status, headers, body, reader, writer


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return status, headers, body


async def curl(*args: str, max_time: int = 20) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-sS",
        "--max-time",
        str(max_time),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()

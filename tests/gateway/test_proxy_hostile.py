"""Malformed and hostile input, resets and limits: each answered (or cut) cleanly, and the
proxy keeps serving afterwards. Plus 1,000 concurrent tunnels without a leaked fd."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest

from gateway.audit import read_events
from tests.gateway.gw_support import (
    Echo,
    MakeProxy,
    Origin,
    Proxy,
    auth_header,
    connect,
    open_raw,
    read_response,
)


async def _still_serving(proxy: Proxy, echo: Echo) -> None:
    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200
    writer.write(b"ok?")
    assert await asyncio.wait_for(reader.readexactly(3), 5) == b"ok?"
    writer.close()


async def _send_raw(proxy: Proxy, data: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await open_raw(proxy)
    writer.write(data)
    await writer.drain()
    try:
        return await read_response(reader)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("data", "status"),
    [
        pytest.param(b"\x00\xff garbage \x01\x02\r\n\r\n", 400, id="binary-garbage"),
        pytest.param(b"hello proxy\r\n", 505, id="no-version-line"),
        pytest.param(b"hello there proxy friend\r\n", 400, id="words"),
        pytest.param(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\n", 400, id="tls-to-plain"),
        pytest.param(b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", 400, id="origin-form"),
        pytest.param(b"GET /\r\n", 505, id="http-0.9"),
        pytest.param(b"CONNECT a.test:443 HTTP/3.0\r\n\r\n", 505, id="http-3"),
        pytest.param(b"TRACE http://a.test/ HTTP/1.1\r\n\r\n", 405, id="trace"),
        pytest.param(
            b"GET http://a.test/ HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n",
            431,
            id="huge-headers",
        ),
        pytest.param(
            b"POST http://a.test/ HTTP/1.1\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n" + auth_header() + b"\r\n",
            400,
            id="smuggling-te-cl",
        ),
    ],
)
async def test_bad_input_gets_a_4xx_and_the_proxy_keeps_serving(
    make_proxy: MakeProxy, echo: Echo, data: bytes, status: int
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}", "a.test"])
    got, headers, body = await _send_raw(proxy, data)
    assert got == status
    assert headers["connection"] == "close"
    assert body.strip()  # one line saying what to do
    await _still_serving(proxy, echo)


async def test_slowloris_head_is_cut_at_the_header_timeout(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"], header_timeout=0.3)
    reader, writer = await open_raw(proxy)
    writer.write(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nX-Slow: ")  # and never finish
    status, _, _ = await read_response(reader)
    assert status == 408
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    silent_reader, silent_writer = await open_raw(proxy)  # connects, sends nothing
    status, _, _ = await read_response(silent_reader)
    assert status == 408
    silent_writer.close()
    await _still_serving(proxy, echo)


async def test_idle_tunnels_are_closed(make_proxy: MakeProxy, echo: Echo) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"], idle_timeout=0.3)
    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the idle sweep
    writer.close()
    event = await proxy.wait_event("network_connection")
    assert event["data"]["duration_ms"] >= 300


async def test_client_abort_mid_tunnel(make_proxy: MakeProxy, echo: Echo) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    status, _, _, _, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200
    writer.write(b"x" * 10_000)
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST
    event = await proxy.wait_event("network_connection")
    assert event["data"]["bytes_up"] <= 10_000
    assert not proxy.server._tunnels
    await _still_serving(proxy, echo)


async def test_upstream_reset_mid_tunnel_closes_the_client(make_proxy: MakeProxy) -> None:
    async def reset_after_hello(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await reader.readexactly(5)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()

    upstream = await asyncio.start_server(reset_after_hello, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    proxy = await make_proxy([f"127.0.0.1:{port}"])
    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{port}")
    assert status == 200
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await proxy.wait_event("network_connection")
    upstream.close()


async def test_upstream_reset_before_the_response_is_502(
    make_proxy: MakeProxy, http_origin: Origin, echo: Echo
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{http_origin.port}", f"127.0.0.1:{echo.port}"])
    got, headers, _ = await _send_raw(
        proxy, f"GET {http_origin.url('/reset')} HTTP/1.1\r\n".encode() + auth_header() + b"\r\n"
    )
    assert got == 502
    assert headers["x-netwarden-reason"] == "reset"
    (event,) = proxy.events("network_error")
    assert event["data"]["code"] == "reset"
    await _still_serving(proxy, echo)


async def test_connection_limit_answers_503(make_proxy: MakeProxy, echo: Echo) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"], max_connections=2)
    held = [await connect(proxy, f"127.0.0.1:{echo.port}") for _ in range(2)]
    assert [h[0] for h in held] == [200, 200]
    reader, writer = await open_raw(proxy)
    status, _, _ = await read_response(reader)
    assert status == 503
    writer.close()
    for *_, w in held:
        w.close()
    await proxy.wait_event("network_connection")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_thousand_concurrent_tunnels_no_error_no_leak(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    await _still_serving(proxy, echo)  # warm up: first-use fds (resolver, loop) are not leaks
    await proxy.wait_event("network_connection")
    before = _open_fds()
    count = 1000
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one(i: int) -> None:
        status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
        assert status == 200
        opened.append((reader, writer))

    async with asyncio.TaskGroup() as group:
        for i in range(count):
            group.create_task(one(i))
    assert len(proxy.server._tunnels) == count  # all open at once
    async with asyncio.TaskGroup() as group:
        for i, (reader, writer) in enumerate(opened):

            async def talk(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
                payload = f"tunnel-{n}".encode()
                w.write(payload)
                assert await asyncio.wait_for(r.readexactly(len(payload)), 20) == payload
                w.close()
                await w.wait_closed()

            group.create_task(talk(reader, writer, i))

    done = asyncio.Event()

    def on_emit(record: dict[str, object]) -> None:
        if not proxy.server._tunnels:
            done.set()

    unsubscribe = proxy.server.audit.subscribe(on_emit)
    if proxy.server._tunnels:
        await asyncio.wait_for(done.wait(), 20)
    unsubscribe()
    events = list(read_events(proxy.events_path))  # every line parses
    assert sum(e["type"] == "network_connection" for e in events) == count + 1
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert not proxy.server._clients
    assert proxy.server.dialer.open_count == 0
    await echo.wait_idle()
    assert _open_fds() <= before

"""The callback-driven handshake (gateway/handshake.py) on its less travelled paths:
answers taken from the resolver's cache still pass the address guard and produce the same
events as awaited lookups; a client lost while its fast-path dial is pending; ``stop``
while a dial is pending.

A dial is held pending by a real listener whose accept queue is full (``listen(0)`` plus
one connection nobody accepts): Linux drops further SYNs (tcp_abort_on_overflow=0) and
the dialer's connect stays in SYN_SENT until the queue is drained and the SYN is
retransmitted (~1 s).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.resolver import CachingResolver, SystemResolver
from policy import policy_from_rules
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


class CachingMap:
    """An injected ``CachingResolver``: ``resolve`` answers from ``table`` and keeps the
    answer in ``cache``; a test may change ``cache`` (a rebinding answered from memory)."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.cache: dict[str, list[str]] = {}
        self.resolved: list[str] = []  # awaited lookups
        self.hits: list[str] = []  # synchronous answers from the cache

    def cached(self, host: str) -> list[str] | None:
        answer = self.cache.get(host)
        if answer is None:
            return None
        self.hits.append(host)
        return list(answer)

    async def resolve(self, host: str, port: int) -> list[str]:
        self.resolved.append(host)
        answer = list(self.table[host])
        self.cache[host] = answer
        return list(answer)


async def _until(condition: Callable[[], object], what: str) -> None:
    """A probe of the proxy's own state, for moments no event marks ("a dial is in
    flight", "the proxy saw the client go"): yield to the loop the proxy runs on, with
    no timed sleep, until ``condition`` holds."""
    try:
        async with asyncio.timeout(5):
            while not condition():  # noqa: ASYNC110  # the proxy has no event to await here
                await asyncio.sleep(0)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def _request(
    proxy: Proxy, how: str, host: str, port: int
) -> tuple[int, dict[str, str], bytes, asyncio.StreamWriter]:
    if how == "CONNECT":
        status, headers, body, _, writer = await connect(proxy, f"{host}:{port}")
        return status, headers, body, writer
    reader, writer = await open_raw(proxy)
    writer.write(f"GET http://{host}:{port}/x HTTP/1.1\r\n".encode() + auth_header() + b"\r\n")
    await writer.drain()
    status, headers, body = await read_response(reader)
    return status, headers, body, writer


def _comparable(event: dict[str, Any]) -> dict[str, Any]:
    """An event without what differs between two proxies by time alone."""
    data = {k: v for k, v in event["data"].items() if k != "duration_ms"}
    return {**{k: v for k, v in event.items() if k != "ts"}, "data": data}


# -- answers from the resolver's cache ---------------------------------------------------


@pytest.mark.parametrize("how", ["CONNECT", "GET"])
async def test_a_rebinding_answered_from_the_cache_is_refused_by_the_address_guard(
    make_proxy: MakeProxy, echo: Echo, http_origin: Origin, how: str
) -> None:
    port = echo.port if how == "CONNECT" else http_origin.port
    resolver = CachingMap({"api.cached.test": ["127.0.0.1"]})
    assert isinstance(resolver, CachingResolver)  # so the proxy asks cached() first
    proxy = await make_proxy([f"api.cached.test:{port}", f"127.0.0.1:{port}"], resolver=resolver)
    status, _, _, writer = await _request(proxy, how, "api.cached.test", port)
    writer.close()
    assert status == 200
    assert (resolver.resolved, resolver.hits) == (["api.cached.test"], [])

    resolver.cache["api.cached.test"] = ["169.254.169.254"]  # rebound, answered from memory
    status, headers, _, writer = await _request(proxy, how, "api.cached.test", port)
    writer.close()
    assert status == 403
    assert headers["x-netwarden-reason"] == "non_public_address"
    assert (resolver.resolved, resolver.hits) == (["api.cached.test"], ["api.cached.test"])
    (event,) = proxy.events("network_blocked")
    assert event["data"]["host"] == "api.cached.test"
    assert event["data"]["code"] == "non_public_address"
    assert event["data"]["method"] == how


async def test_the_system_resolver_cache_is_checked_against_the_current_policy(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    """The real ``SystemResolver``: the second CONNECT is answered from its cache, after a
    reload took away the IP rules that let loopback through: refused."""
    port = echo.port
    proxy = await make_proxy([f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"])
    assert isinstance(proxy.server.resolver, SystemResolver)
    status, _, _, _, writer = await connect(proxy, f"localhost:{port}")
    writer.close()
    assert status == 200
    proxy.server.reload(policy_from_rules([f"localhost:{port}"], name="no-ip-rules"))
    assert proxy.server.resolver.cached("localhost") is not None  # no lookup this time
    status, headers, _, _, writer = await connect(proxy, f"localhost:{port}")
    writer.close()
    assert status == 403
    assert headers["x-netwarden-reason"] == "non_public_address"
    (event,) = proxy.events("network_blocked")
    assert (event["data"]["host"], event["data"]["code"]) == ("localhost", "non_public_address")


@pytest.mark.parametrize("how", ["CONNECT", "GET"])
@pytest.mark.parametrize(
    ("addresses", "ip_rule", "status"),
    [
        pytest.param(["127.0.0.1"], True, 200, id="allowed-by-ip-rule"),
        pytest.param(["127.0.0.1"], False, 403, id="loopback"),
        pytest.param(["169.254.169.254"], False, 403, id="metadata"),
        pytest.param(["10.0.0.1"], False, 403, id="rfc1918"),
        pytest.param(["::ffff:127.0.0.1"], False, 403, id="mapped-v6"),
        pytest.param(["93.184.216.34", "127.0.0.1"], False, 403, id="one-bad-among-good"),
    ],
)
async def test_a_cached_answer_gives_the_same_reply_and_events_as_a_lookup(
    make_proxy: MakeProxy,
    echo: Echo,
    http_origin: Origin,
    how: str,
    addresses: list[str],
    ip_rule: bool,
    status: int,
) -> None:
    port = echo.port if how == "CONNECT" else http_origin.port
    rules = [f"svc.cached.test:{port}"] + ([f"127.0.0.1:{port}"] if ip_rule else [])
    seen = []
    for warm in (False, True):
        resolver = CachingMap({"svc.cached.test": addresses})
        if warm:
            resolver.cache["svc.cached.test"] = list(addresses)
        proxy = await make_proxy(rules, resolver=resolver)
        got, headers, body, writer = await _request(proxy, how, "svc.cached.test", port)
        writer.close()
        await writer.wait_closed()
        assert got == status
        # the path taken: an awaited lookup, or the synchronous answer from memory
        expected = ([], ["svc.cached.test"]) if warm else (["svc.cached.test"], [])
        assert (resolver.resolved, resolver.hits) == expected
        if status == 200:
            await proxy.wait_event("network_connection")
        reply = (got, headers.get("x-netwarden-reason"), body if status != 200 else b"")
        events = [_comparable(e) for e in proxy.events() if e["type"] != "proxy_started"]
        seen.append((reply, events))
    (awaited, cached) = seen
    assert cached == awaited
    assert awaited[1]  # an event was logged either way


# -- a dial held pending -----------------------------------------------------------------


@dataclass
class Stalled:
    """A listener whose accept queue is full: a connect to it stays pending."""

    port: int
    listener: socket.socket
    filler: socket.socket

    async def release(self) -> socket.socket:
        """Drain the queue; the next connection accepted is the pending one."""
        loop = asyncio.get_running_loop()
        queued, _ = await loop.sock_accept(self.listener)
        queued.close()
        async with asyncio.timeout(10):  # the dialer's SYN retransmit (~1 s)
            pending, _ = await loop.sock_accept(self.listener)
        pending.setblocking(False)
        return pending


@pytest.fixture
async def stalled() -> AsyncIterator[Stalled]:
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    listener.setblocking(False)
    filler = socket.socket()
    filler.setblocking(False)
    await asyncio.wait_for(loop.sock_connect(filler, listener.getsockname()), 5)
    yield Stalled(listener.getsockname()[1], listener, filler)
    filler.close()
    listener.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _connect_pending(proxy: Proxy, port: int) -> tuple[asyncio.StreamReader, Any]:
    """Send a CONNECT to the stalled listener; return once the proxy's dial is pending."""
    reader, writer = await open_raw(proxy)
    target = f"127.0.0.1:{port}"
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n".encode() + auth_header())
    writer.write(b"\r\n")
    await writer.drain()
    await _until(lambda: proxy.server._handshakes, "the proxy dials")
    return reader, writer


async def test_a_client_lost_while_its_dial_is_pending_gets_no_tunnel(
    make_proxy: MakeProxy, echo: Echo, stalled: Stalled
) -> None:
    proxy = await make_proxy(
        [f"127.0.0.1:{stalled.port}", f"127.0.0.1:{echo.port}"], connect_timeout=30
    )
    status, _, _, _, writer = await connect(proxy, f"127.0.0.1:{echo.port}")  # warm up
    assert status == 200
    writer.close()
    await proxy.wait_event("network_connection")
    await echo.wait_idle()
    fds = _open_fds()

    _, writer = await _connect_pending(proxy, stalled.port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST: the client is gone, not merely half-closed
    await _until(lambda: not proxy.server._clients, "the proxy sees the client gone")
    assert proxy.server._handshakes  # ... while the dial is still pending

    upstream = await stalled.release()
    loop = asyncio.get_running_loop()
    try:
        got = await asyncio.wait_for(loop.sock_recv(upstream, 1), 5)
    except ConnectionResetError:
        got = b""
    upstream.close()
    assert got == b""  # the proxy closed its upstream as soon as the dial completed
    assert not proxy.server._handshakes
    assert not proxy.server._tunnels  # no half-dead tunnel kept
    assert proxy.server.dialer.open_count == 0
    assert proxy.events("network_error") == []
    assert len(proxy.events("network_connection")) == 1  # the warm-up only
    assert _open_fds() <= fds

    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200  # and the proxy keeps serving
    writer.write(b"still?")
    assert await asyncio.wait_for(reader.readexactly(6), 5) == b"still?"
    writer.close()


async def test_stop_abandons_a_pending_dial_at_once(
    make_proxy: MakeProxy, stalled: Stalled
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{stalled.port}"], connect_timeout=30, drain_timeout=0.2)
    tasks = asyncio.all_tasks()
    fds = _open_fds()
    reader, writer = await _connect_pending(proxy, stalled.port)
    assert proxy.server.dialer._pending

    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):  # far below connect_timeout
        await proxy.server.stop()
    assert loop.time() - started < 5
    assert asyncio.all_tasks() - tasks == set()  # the connect task ended with stop
    assert not proxy.server.dialer._pending
    assert not proxy.server._handshakes
    try:
        rest = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        rest = b""
    assert not rest.startswith(b"HTTP/1.1 200")  # never told it was connected
    writer.close()
    await writer.wait_closed()
    assert _open_fds() <= fds

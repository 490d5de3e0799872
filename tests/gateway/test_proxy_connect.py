"""CONNECT through a real proxy on loopback: tunnels, every refusal path with its event,
encoded-IP spellings, DNS rebinding via the injected resolver, auth, loop defence."""

from __future__ import annotations

import asyncio
import base64

import pytest

from gateway.dialer import Dialer, addr_of, came_from_us
from policy import Mode
from tests.gateway.gw_support import (
    TOKEN,
    Echo,
    MakeProxy,
    StaticMap,
    connect,
    open_raw,
    read_response,
)


async def test_tunnel_relays_both_ways_and_logs_the_connection(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200
    writer.write(b"ping" * 1000)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(4000), 5) == b"ping" * 1000
    writer.write_eof()  # half-close: the echo answers EOF with EOF
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()
    event = await proxy.wait_event("network_connection")
    assert event["data"]["host"] == "127.0.0.1"
    assert event["data"]["address"] == "127.0.0.1"
    assert event["data"]["bytes_up"] == 4000
    assert event["data"]["bytes_down"] == 4000
    assert event["data"]["rule"] == f"127.0.0.1:{echo.port}"


async def test_bytes_pipelined_behind_the_connect_head_are_forwarded(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    hello = b"\x16\x03\x01 early ClientHello"
    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}", extra=hello)
    assert status == 200
    assert await asyncio.wait_for(reader.readexactly(len(hello)), 5) == hello
    writer.close()


async def test_backpressure_bounds_buffering_with_a_slow_reader(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    """Write 32 MiB without reading: the proxy must stop reading rather than buffer it."""
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    status, _, _, _reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200
    sent = [0]

    async def flood() -> None:
        while sent[0] < 32 * 1024 * 1024:
            writer.write(b"x" * 65536)
            await writer.drain()
            sent[0] += 65536

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(flood(), 2)
    assert sent[0] < 32 * 1024 * 1024  # the writer got stuck: backpressure reached us
    (tunnel,) = proxy.server._tunnels
    assert tunnel.client.transport is not None
    assert tunnel.client.transport.get_write_buffer_size() <= 1024 * 1024
    assert tunnel.upstream.transport is not None
    assert tunnel.upstream.transport.get_write_buffer_size() <= 1024 * 1024
    writer.close()


# -- refusals: table of destinations, the code, and the event ------------------------


@pytest.mark.parametrize(
    ("target", "mode", "code"),
    [
        pytest.param("evil.site:443", Mode.ALLOWLIST, "policy_denied", id="not-on-allowlist"),
        pytest.param("allowed.test:22", Mode.ALLOWLIST, "port_not_allowed", id="port-22"),
        pytest.param("93.184.216.34:443", Mode.ALLOWLIST, "ip_literal_refused", id="ip-literal"),
        pytest.param("127.0.0.1:443", Mode.DENYLIST, "non_public_address", id="loopback"),
        pytest.param("127.1:443", Mode.DENYLIST, "non_public_address", id="127.1"),
        pytest.param("0x7f000001:443", Mode.DENYLIST, "non_public_address", id="hex-loopback"),
        pytest.param("2130706433:443", Mode.DENYLIST, "non_public_address", id="int-loopback"),
        pytest.param(
            "[::ffff:127.0.0.1]:443", Mode.DENYLIST, "non_public_address", id="mapped-v6-loopback"
        ),
        pytest.param("[::1]:443", Mode.DENYLIST, "non_public_address", id="v6-loopback"),
        pytest.param("169.254.169.254:80", Mode.DENYLIST, "non_public_address", id="metadata"),
        pytest.param("0xA9FEA9FE:80", Mode.DENYLIST, "non_public_address", id="metadata-hex"),
        pytest.param("2852039166:80", Mode.DENYLIST, "non_public_address", id="metadata-int"),
        pytest.param(
            "0251.0376.0251.0376:80", Mode.DENYLIST, "non_public_address", id="metadata-octal"
        ),
        pytest.param("169.254.43518:80", Mode.DENYLIST, "non_public_address", id="metadata-2-part"),
        pytest.param(
            "[::ffff:a9fe:a9fe]:80", Mode.DENYLIST, "non_public_address", id="metadata-mapped-hex"
        ),
        pytest.param("localhost:443", Mode.DENYLIST, "non_public_address", id="localhost"),
        pytest.param("10.0.0.1:443", Mode.DENYLIST, "non_public_address", id="rfc1918"),
        pytest.param("100.64.0.1:443", Mode.DENYLIST, "non_public_address", id="cgnat"),
        pytest.param("denied.test:443", Mode.DENYLIST, "policy_denied", id="negated-rule"),
    ],
)
async def test_refusals_answer_403_and_log_network_blocked(
    make_proxy: MakeProxy, target: str, mode: Mode, code: str
) -> None:
    resolver = StaticMap({"localhost": ["127.0.0.1", "::1"]})
    rules = ["allowed.test"] if mode is Mode.ALLOWLIST else ["!denied.test"]
    proxy = await make_proxy(rules, mode=mode, resolver=resolver)
    status, headers, body, _, writer = await connect(proxy, target)
    writer.close()
    assert status == 403
    assert headers["x-netwarden-reason"] == code
    assert body.decode().startswith("blocked by egress policy:")
    (event,) = proxy.events("network_blocked")
    assert event["data"]["code"] == code
    assert event["data"]["method"] == "CONNECT"
    assert event["data"]["port"] == int(target.rsplit(":", 1)[1])
    assert event["run_id"] == "r-test"
    # a denied name is never resolved
    if code == "policy_denied":
        assert resolver.calls == []


@pytest.mark.parametrize(
    "addresses",
    [
        pytest.param(["127.0.0.1"], id="loopback"),
        pytest.param(["169.254.169.254"], id="metadata"),
        pytest.param(["10.0.0.1"], id="rfc1918"),
        pytest.param(["::ffff:127.0.0.1"], id="mapped-v6"),
        pytest.param(["93.184.216.34", "127.0.0.1"], id="one-bad-among-good"),
    ],
)
async def test_rebinding_an_allowed_name_to_a_private_address_is_refused(
    make_proxy: MakeProxy, addresses: list[str]
) -> None:
    resolver = StaticMap({"api.allowed.test": addresses})
    proxy = await make_proxy(["api.allowed.test"], resolver=resolver)
    status, headers, _, _, writer = await connect(proxy, "api.allowed.test:443")
    writer.close()
    assert status == 403
    assert headers["x-netwarden-reason"] == "non_public_address"
    (event,) = proxy.events("network_blocked")
    assert event["data"]["host"] == "api.allowed.test"
    assert resolver.calls == ["api.allowed.test"]  # resolved once, never again


async def test_an_ip_rule_lets_a_name_resolving_to_loopback_through(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    resolver = StaticMap({"svc.internal.test": ["127.0.0.1"]})
    proxy = await make_proxy(["svc.internal.test", "127.0.0.1"], resolver=resolver)
    status, _, _, reader, writer = await connect(proxy, f"svc.internal.test:{echo.port}")
    # port-less rules in allowlist only cover default ports
    assert status == 403
    writer.close()
    proxy = await make_proxy(
        [f"svc.internal.test:{echo.port}", f"127.0.0.1:{echo.port}"], resolver=resolver
    )
    status, _, _, reader, writer = await connect(proxy, f"svc.internal.test:{echo.port}")
    assert status == 200
    writer.write(b"hi")
    assert await asyncio.wait_for(reader.readexactly(2), 5) == b"hi"
    writer.close()


async def test_silent_hosts_are_refused_without_an_event(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(["allowed.test"], silent=["ingest.sentry.test"])
    status, _, _, _, writer = await connect(proxy, "ingest.sentry.test:443")
    writer.close()
    assert status == 403
    assert proxy.events("network_blocked") == []


async def test_invalid_host_is_400(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(["allowed.test"])
    status, headers, _, _, writer = await connect(proxy, "bad..host:443")
    writer.close()
    assert status == 400
    assert headers["x-netwarden-reason"] == "invalid_host"
    (event,) = proxy.events("network_blocked")
    assert event["data"]["code"] == "invalid_host"


# -- upstream failures ------------------------------------------------------------------


async def test_refused_upstream_is_502_with_network_error(make_proxy: MakeProxy) -> None:
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    proxy = await make_proxy([f"127.0.0.1:{port}"])
    status, headers, _, _, writer = await connect(proxy, f"127.0.0.1:{port}")
    writer.close()
    assert status == 502
    assert headers["x-netwarden-reason"] == "refused"
    (event,) = proxy.events("network_error")
    assert event["data"]["code"] == "refused"


async def test_dns_failure_is_502(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(["nxdomain.test"], resolver=StaticMap({}))
    status, headers, _, _, writer = await connect(proxy, "nxdomain.test:443")
    writer.close()
    assert status == 502
    assert headers["x-netwarden-reason"] == "dns"
    assert proxy.events("network_error")[0]["data"]["code"] == "dns"


async def test_lookup_timeout_is_504(make_proxy: MakeProxy) -> None:
    resolver = StaticMap({}, hang=["slow.test"])
    proxy = await make_proxy(["slow.test"], resolver=resolver, connect_timeout=0.3)
    status, headers, _, _, writer = await connect(proxy, "slow.test:443")
    writer.close()
    assert status == 504
    assert headers["x-netwarden-reason"] == "timeout"


# -- auth -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "status"),
    [
        pytest.param(None, 407, id="missing"),
        pytest.param(
            "Basic " + base64.b64encode(b"any:" + TOKEN.encode()).decode(), 200, id="basic-any-user"
        ),
        pytest.param(f"Bearer {TOKEN}", 200, id="bearer"),
        pytest.param(
            "Basic " + base64.b64encode(b"netwarden:wrong").decode(), 407, id="wrong-token"
        ),
        pytest.param(f"Bearer {TOKEN}x", 407, id="bearer-longer"),
        pytest.param("Basic !!!notbase64", 407, id="garbage"),
    ],
)
async def test_proxy_auth(
    make_proxy: MakeProxy, echo: Echo, header: str | None, status: int
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    reader, writer = await open_raw(proxy)
    extra = f"Proxy-Authorization: {header}\r\n" if header else ""
    writer.write(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n{extra}\r\n".encode())
    got, headers, body = await read_response(reader)
    writer.close()
    assert got == status
    if status == 407:
        assert headers["proxy-authenticate"] == 'Basic realm="netwarden"'
        assert TOKEN not in body.decode()
        assert proxy.events("network_connection") == []


async def test_no_auth_mode_accepts_clients_without_a_token(
    make_proxy: MakeProxy, echo: Echo
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"], token=None)
    status, _, _, _, writer = await connect(proxy, f"127.0.0.1:{echo.port}", auth=False)
    writer.close()
    assert status == 200
    assert "@" not in proxy.url


async def test_token_never_in_events(make_proxy: MakeProxy, echo: Echo) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"])
    for target in (f"127.0.0.1:{echo.port}", "evil.test:443"):
        _, _, _, _, writer = await connect(proxy, target)
        writer.close()
    await proxy.server.stop()
    assert TOKEN not in proxy.events_path.read_text()
    assert TOKEN not in repr(proxy.server) + repr(proxy.server.config)


# -- loop defence ----------------------------------------------------------------------


async def test_connect_to_the_proxy_itself_is_refused(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(["127.0.0.1:1-65535", "**"], mode=Mode.ALLOWLIST)
    for target in (f"127.0.0.1:{proxy.port}", f"127.1:{proxy.port}"):
        status, headers, _, _, writer = await connect(proxy, target)
        writer.close()
        assert status == 403
        assert headers["x-netwarden-reason"] == "proxy_loop"


async def test_a_request_arriving_from_our_own_outbound_socket_is_refused(
    make_proxy: MakeProxy,
) -> None:
    """Proxy A may dial proxy B (another listener of this process): the request that
    enters B through A's outbound socket is a loop and B refuses it."""
    a = await make_proxy(["127.0.0.1:1-65535"], token=None)
    b = await make_proxy(["127.0.0.1:1-65535"], token=None)
    status, _, _, reader, writer = await connect(a, f"127.0.0.1:{b.port}", auth=False)
    assert status == 200
    writer.write(f"CONNECT 127.0.0.1:{a.port} HTTP/1.1\r\n\r\n".encode())
    status, headers, _ = await read_response(reader)
    writer.close()
    assert status == 403
    assert headers["x-netwarden-reason"] == "proxy_loop"
    assert b.events("network_blocked")[0]["data"]["code"] == "proxy_loop"


async def test_loop_registry_keys_on_the_whole_address_pair(echo: Echo) -> None:
    """Linux reuses an ephemeral port toward different destinations: a client whose
    address equals one of our outbound sockets' local address is NOT a loop unless it
    also arrived at that socket's remote address."""
    dialer = Dialer(connect_timeout=5)
    upstream, _ = await dialer.dial(("127.0.0.1",), echo.port)
    assert upstream.local is not None
    local, remote = upstream.local
    assert came_from_us(local, remote)
    assert not came_from_us(local, ("127.0.0.1", remote[1] + 1))
    assert addr_of(("::ffff:" + local[0], local[1], 0, 0)) == local  # mapped form folds
    upstream.close()
    dialer.close()
    assert not came_from_us(local, remote)

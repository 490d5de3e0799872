"""Start/stop/drain, reload in-process, and the system resolver."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.resolver import ResolveFailed, SystemResolver
from tests.gateway.gw_support import (
    Echo,
    MakeProxy,
    Origin,
    auth_header,
    connect,
    open_raw,
    read_response,
)


async def test_stop_closes_idle_keepalive_clients_at_once(
    make_proxy: MakeProxy, http_origin: Origin
) -> None:
    proxy = await make_proxy([f"127.0.0.1:{http_origin.port}"], drain_timeout=30)
    reader, writer = await open_raw(proxy)
    writer.write(f"GET {http_origin.url('/k')} HTTP/1.1\r\n".encode() + auth_header() + b"\r\n")
    status, _, _ = await read_response(reader)
    assert status == 200
    async with asyncio.timeout(5):  # far below drain_timeout: an idle client is not work
        await proxy.server.stop()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert proxy.events()[-1]["type"] == "proxy_stopped"
    writer.close()


async def test_stop_drains_then_aborts_open_tunnels(make_proxy: MakeProxy, echo: Echo) -> None:
    proxy = await make_proxy([f"127.0.0.1:{echo.port}"], drain_timeout=0.2)
    status, _, _, reader, writer = await connect(proxy, f"127.0.0.1:{echo.port}")
    assert status == 200
    await proxy.server.stop()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    types = [e["type"] for e in proxy.events()]
    assert types[-2:] == ["network_connection", "proxy_stopped"]
    writer.close()


async def test_reload_from_file_valid_and_invalid(make_proxy: MakeProxy, tmp_path: Path) -> None:
    proxy = await make_proxy(["a.test"])
    good = tmp_path / "good.yaml"
    good.write_text("mode: allowlist\nrules:\n  - b.test\n")
    assert proxy.server.reload_from(str(good))
    assert proxy.server.policy.decide("b.test", 443).allowed
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: allowlist\nrules:\n  - 'x*y.test'\n")
    assert not proxy.server.reload_from(str(bad))
    assert not proxy.server.reload_from(str(tmp_path / "missing.yaml"))
    assert proxy.server.policy.decide("b.test", 443).allowed  # the good one stays
    oks = [e["data"]["ok"] for e in proxy.events("policy_reloaded")]
    assert oks == [True, False, False]


async def test_system_resolver_localhost_and_cache() -> None:
    resolver = SystemResolver(cache_ttl=60)
    first = await resolver.resolve("localhost", 443)
    assert "127.0.0.1" in first or "::1" in first
    assert await resolver.resolve("localhost", 443) == first


async def test_system_resolver_failure_is_resolve_failed() -> None:
    resolver = SystemResolver(cache_ttl=0)
    with pytest.raises(ResolveFailed, match=r"does-not-exist\.invalid"):
        await resolver.resolve("does-not-exist.invalid", 443)

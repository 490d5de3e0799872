"""Plain-HTTP forwarding and HTTPS tunnels with real clients (curl, urllib, http.client)
through a real proxy to real local origins (HTTP, and HTTPS with a trustme CA)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import socket
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.gw_support import (
    TOKEN,
    MakeProxy,
    Origin,
    _Origin,
    auth_header,
    curl,
    open_raw,
    read_response,
)


def _rule(origin: Origin) -> str:
    return f"127.0.0.1:{origin.port}"


async def test_curl_get_through_the_proxy(make_proxy: MakeProxy, http_origin: Origin) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    rc, out, err = await curl("-x", proxy.url, http_origin.url("/hello?x=1"))
    assert rc == 0, err
    seen = json.loads(out)
    assert seen["path"] == "/hello?x=1"
    assert seen["headers"]["host"] == f"127.0.0.1:{http_origin.port}"
    assert "proxy-authorization" not in seen["headers"]  # never forwarded upstream
    assert "proxy-connection" not in seen["headers"]
    event = await proxy.wait_event("network_connection")
    assert event["data"]["method"] == "GET"
    assert event["data"]["bytes_down"] > 0


async def test_curl_https_via_connect(make_proxy: MakeProxy, https_origin: Origin) -> None:
    assert https_origin.ca_file is not None
    proxy = await make_proxy([_rule(https_origin)])
    rc, out, err = await curl(
        "-x", proxy.url, "--cacert", https_origin.ca_file, https_origin.url("/secure")
    )
    assert rc == 0, err
    assert json.loads(out)["path"] == "/secure"
    event = await proxy.wait_event("network_connection")
    assert event["data"]["method"] == "CONNECT"


async def test_curl_refused_https_gets_403_and_event(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(["allowed.test"])
    rc, _, err = await curl("-x", proxy.url, "https://evil.test/")
    assert rc != 0
    assert "403" in err
    (event,) = proxy.events("network_blocked")
    assert (event["data"]["host"], event["data"]["port"]) == ("evil.test", 443)


async def test_curl_without_credentials_gets_407(
    make_proxy: MakeProxy, http_origin: Origin
) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    bare = f"http://127.0.0.1:{proxy.port}"
    rc, out, _ = await curl("-x", bare, "-o", "/dev/null", "-w", "%{http_code}", http_origin.url())
    assert rc == 0
    assert out == "407"


async def test_post_bodies_content_length_and_chunked(
    make_proxy: MakeProxy, http_origin: Origin, tmp_path: Path
) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    body = "a" * 3_000_000  # big enough for curl to send Expect: 100-continue
    (tmp_path / "body").write_text(body)
    rc, out, err = await curl(
        "-x", proxy.url, "--data-binary", f"@{tmp_path / 'body'}", http_origin.url("/cl")
    )
    assert rc == 0, err
    assert json.loads(out)["body"] == body
    rc, out, err = await curl(
        "-x",
        proxy.url,
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        "chunky",
        http_origin.url("/te"),
    )
    assert rc == 0, err
    assert json.loads(out)["body"] == "chunky"


async def test_chunked_response_and_head(make_proxy: MakeProxy, http_origin: Origin) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    rc, out, err = await curl("-x", proxy.url, http_origin.url("/chunked"))
    assert rc == 0, err
    assert json.loads(out)["path"] == "/chunked"
    rc, out, err = await curl("-x", proxy.url, "-I", http_origin.url("/head"))
    assert rc == 0, err
    assert "Content-Length: 1234" in out


def _urllib_get(proxy_url: str, url: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url})
    )
    with opener.open(url, timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


async def test_python_urllib_client(make_proxy: MakeProxy, http_origin: Origin) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    seen = await asyncio.to_thread(_urllib_get, proxy.url, http_origin.url("/urllib"))
    assert seen["path"] == "/urllib"


def _keepalive_session(port: int, origin: Origin) -> list[tuple[int, str | None, bytes]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    basic = base64.b64encode(f"x:{TOKEN}".encode()).decode()
    results = []
    for target in (origin.url("/one"), origin.url("/two"), "http://denied.test/three"):
        conn.request("GET", target, headers={"Proxy-Authorization": f"Basic {basic}"})
        response = conn.getresponse()
        results.append((response.status, response.getheader("X-Netwarden-Reason"), response.read()))
    conn.close()
    return results


async def test_keepalive_decides_every_request(make_proxy: MakeProxy, http_origin: Origin) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    results = await asyncio.to_thread(_keepalive_session, proxy.port, http_origin)
    assert [r[0] for r in results] == [200, 200, 403]
    assert results[2][1] == "policy_denied"
    assert proxy.server.connections_served == 1  # one client connection for all three
    (blocked,) = proxy.events("network_blocked")
    assert blocked["data"]["host"] == "denied.test"
    assert blocked["data"]["method"] == "GET"


async def test_host_header_is_the_decided_target(
    make_proxy: MakeProxy, http_origin: Origin
) -> None:
    """A client cannot steer the upstream with its own Host header."""
    proxy = await make_proxy([_rule(http_origin)])
    rc, out, err = await curl("-x", proxy.url, "-H", "Host: evil.test", http_origin.url("/h"))
    assert rc == 0, err
    assert json.loads(out)["headers"]["host"] == f"127.0.0.1:{http_origin.port}"


async def test_hop_by_hop_headers_are_stripped(make_proxy: MakeProxy, http_origin: Origin) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    rc, out, err = await curl(
        "-x",
        proxy.url,
        "-H",
        "Connection: X-Secret",
        "-H",
        "X-Secret: 1",
        "-H",
        "Keep-Alive: 5",
        "-H",
        "X-Kept: yes",
        http_origin.url("/hop"),
    )
    assert rc == 0, err
    headers = json.loads(out)["headers"]
    assert "x-secret" not in headers
    assert "keep-alive" not in headers
    assert headers["x-kept"] == "yes"


async def test_websocket_upgrade_becomes_a_tunnel(
    make_proxy: MakeProxy, http_origin: Origin
) -> None:
    proxy = await make_proxy([_rule(http_origin)])
    reader, writer = await open_raw(proxy)
    writer.write(
        f"GET {http_origin.url('/ws')} HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".encode()
        + auth_header()
        + b"\r\n"
    )
    status, headers, _ = await read_response(reader)
    assert status == 101
    assert headers["upgrade"] == "websocket"
    writer.write(b"\x81\x05hello")
    assert await asyncio.wait_for(reader.readexactly(7), 5) == b"\x81\x05hello"
    writer.close()
    event = await proxy.wait_event("network_connection")
    assert event["data"]["method"] == "GET"


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


async def test_ipv6_origin_gets_a_bracketed_host_header(make_proxy: MakeProxy) -> None:
    try:
        server = _V6Server(("::1", 0), _Origin)
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proxy = await make_proxy([f"[::1]:{port}"])
        rc, out, err = await curl("-x", proxy.url, f"http://[::1]:{port}/six")
        assert rc == 0, err
        assert json.loads(out)["headers"]["host"] == f"[::1]:{port}"
    finally:
        server.shutdown()
        server.server_close()

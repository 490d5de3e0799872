"""Absolute-form HTTP forwarding (``GET http://host/path``), one request at a time.

Each request on a kept-alive client connection is admitted on its own (a second request
to another host is decided again). The request goes upstream in origin-form with
``Host`` set to the decided target (so the upstream routes on what we decided, not on a
client-supplied Host), hop-by-hop headers and ``Proxy-Authorization`` removed, and the
body relayed byte for byte as framed (``framing``). The upstream connection is kept for
the next request to the same host:port. A ``101 Switching Protocols`` answer to an
``Upgrade`` request (WebSocket) turns the pair into a tunnel.
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Final

from gateway.audit import NetworkConnection, NetworkError
from gateway.framing import Framer, UntilClose, request_framer, response_framer
from gateway.parser import (
    Headers,
    RequestHead,
    RequestRejected,
    ResponseHead,
    parse_response_head,
)
from gateway.relay import Endpoint
from gateway.replies import reply

if TYPE_CHECKING:
    from gateway.server import ProxyServer

__all__ = ["Outcome", "Session", "forward"]

# RFC 9110 §7.6.1 plus the proxy-specific ones clients send.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
        "host",
        "expect",
    }
)


class Outcome(enum.Enum):
    KEEP = "keep"  # serve the next request on this client connection
    CLOSE = "close"  # close the client connection
    HANDED_OFF = "handed_off"  # the connection became a tunnel


class _Gone(Exception):
    """A side went away mid-message."""


class Session:
    """Per-client-connection state: the upstream kept alive for the next request."""

    __slots__ = ("address", "key", "upstream")

    def __init__(self) -> None:
        self.upstream: Endpoint | None = None
        self.key: tuple[str, int] | None = None
        self.address = ""

    def reusable(self, key: tuple[str, int], addresses: tuple[str, ...]) -> Endpoint | None:
        up = self.upstream
        if up is None or up.lost or up.eof or up.buffer or self.key != key:
            self.close()
            return None
        if self.address not in addresses:  # re-checked every request
            self.close()
            return None
        return up

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        self.upstream = None
        self.key = None


def _connection_tokens(headers: Headers) -> set[str]:
    return {
        t.strip().lower()
        for k, v in headers
        if k.lower() in ("connection", "proxy-connection")
        for t in v.split(",")
    }


def _authority(host: str, port: int) -> str:
    """The Host header for the decided destination (RFC 9110 §7.2; IPv6 in brackets)."""
    if ":" in host:
        host = f"[{host}]"
    return host if port == 80 else f"{host}:{port}"


def _request_bytes(head: RequestHead, host: str, upgrade: bool) -> bytes:
    drop = _HOP_BY_HOP | _connection_tokens(head.headers)
    lines = [f"{head.method} {head.path} HTTP/1.1", f"Host: {_authority(host, head.port)}"]
    lines.extend(f"{k}: {v}" for k, v in head.headers if k.lower() not in drop)
    if upgrade:
        lines.extend(f"Upgrade: {v}" for v in head.get("upgrade"))
        lines.append("Connection: Upgrade")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _response_bytes(head: ResponseHead, *, close: bool, upgrade: bool) -> bytes:
    drop = _HOP_BY_HOP | _connection_tokens(head.headers)
    lines = [f"HTTP/1.1 {head.status} {head.reason}".rstrip()]
    lines.extend(f"{k}: {v}" for k, v in head.headers if k.lower() not in drop)
    if upgrade:
        lines.extend(f"Upgrade: {v}" for v in head.get("upgrade"))
        lines.append("Connection: Upgrade")
    elif close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _pump(src: Endpoint, dst: Endpoint, framer: Framer, idle: float) -> int:
    """Relay one framed body from ``src`` to ``dst``; returns the bytes relayed."""
    moved = 0
    while not framer.done:
        if src.buffer:
            take = framer.feed(src.buffer)
            chunk = src.take(take)
            moved += len(chunk)
            dst.write(chunk)
            if dst.lost:
                raise _Gone
            await dst.drain()
            continue
        if src.eof:
            if isinstance(framer, UntilClose):
                framer.done = True
                break
            raise _Gone
        async with asyncio.timeout(idle):
            await src.wait_data()
    return moved


async def _read_response_head(upstream: Endpoint, limit: int, idle: float) -> ResponseHead:
    async with asyncio.timeout(idle):
        while True:
            end = _response_end(upstream.buffer, limit)
            if end is not None:
                return parse_response_head(upstream.take(end))
            if upstream.eof:
                raise _Gone
            await upstream.wait_data()


def _response_end(buf: bytearray, limit: int) -> int | None:
    # (parser.find_head_end checks a *request* line early; a response only needs its end)
    for sep in (b"\r\n\r\n", b"\n\n"):
        i = buf.find(sep, 0, limit + 4)
        if i >= 0:
            return i + len(sep)
    if len(buf) > limit:
        raise RequestRejected(502, "upstream response head too large")
    return None


async def forward(
    server: ProxyServer, session: Session, client: Endpoint, head: RequestHead
) -> Outcome:
    cfg = server.config
    req_framer = request_framer(head)  # RequestRejected (400/501) before any decision
    admission = await server.admit(client, head)
    if admission is None:
        return Outcome.CLOSE
    host = admission.decision.host
    port = head.port
    key = (host, port)
    started = asyncio.get_running_loop().time()
    upstream = session.reusable(key, admission.addresses)
    if upstream is None:
        dialed = await server.dial(client, host, port, admission, head.method)
        if dialed is None:
            return Outcome.CLOSE
        upstream, session.address = dialed
        session.upstream, session.key = upstream, key
    address = session.address

    tokens = _connection_tokens(head.headers)
    wants_upgrade = "upgrade" in tokens and bool(head.get("upgrade"))
    client_close = "close" in tokens or head.version == "HTTP/1.0"
    if any(v.strip().lower() == "100-continue" for v in head.get("expect")):
        client.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    sent = len(head_bytes := _request_bytes(head, host, wants_upgrade))
    upstream.write(head_bytes)
    try:
        sent += await _pump(client, upstream, req_framer, cfg.idle_timeout)
        while True:
            resp = await _read_response_head(upstream, cfg.max_header_bytes, cfg.idle_timeout)
            if 100 <= resp.status < 200 and resp.status != 101:
                continue  # 100 Continue was answered by us already; drop interim responses
            break
    except _Gone:
        if client.lost:
            session.close()
            return Outcome.CLOSE
        _upstream_error(server, host, port, "upstream closed before responding", "reset", head)
        client.write(reply(502, f"{host}:{port} closed the connection", code="reset"))
        session.close()
        return Outcome.CLOSE
    except TimeoutError:
        _upstream_error(server, host, port, "upstream did not respond in time", "timeout", head)
        client.write(reply(504, f"{host}:{port} did not respond in time", code="timeout"))
        session.close()
        return Outcome.CLOSE
    except RequestRejected as exc:
        _upstream_error(server, host, port, exc.detail, "error", head)
        client.write(reply(502, exc.detail, code="error"))
        session.close()
        return Outcome.CLOSE

    if resp.status == 101 and wants_upgrade:
        client.write(_response_bytes(resp, close=False, upgrade=True))
        session.upstream = None  # the tunnel owns it now
        server.start_tunnel(client, upstream, host, port, address, admission, method=head.method)
        return Outcome.HANDED_OFF

    resp_framer = response_framer(resp, request_method=head.method)
    upstream_close = "close" in _connection_tokens(resp.headers) or resp.version == "HTTP/1.0"
    close = client_close or isinstance(resp_framer, UntilClose) or resp.status == 101
    client.write(_response_bytes(resp, close=close, upgrade=False))
    received = resp.size
    try:
        received += await _pump(upstream, client, resp_framer, cfg.idle_timeout)
    except (_Gone, TimeoutError):
        _upstream_error(server, host, port, "response cut short", "reset", head)
        session.close()
        client.abort()  # the client must not take a truncated body for a whole one
        return Outcome.CLOSE
    server._emit(
        NetworkConnection(
            host=host,
            port=port,
            address=address,
            bytes_up=sent,
            bytes_down=received,
            duration_ms=int((asyncio.get_running_loop().time() - started) * 1000),
            method=head.method,
            rule=admission.decision.rule,
        )
    )
    if upstream_close or close:
        session.close()
    return Outcome.CLOSE if close else Outcome.KEEP


def _upstream_error(
    server: ProxyServer, host: str, port: int, error: str, code: str, head: RequestHead
) -> None:
    server._emit(NetworkError(host=host, port=port, error=error, code=code, method=head.method))

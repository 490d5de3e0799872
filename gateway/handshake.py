"""One client connection, from accept to hand-off: read the request head, screen it
(loop defence, proxy auth), admit its destination and either hand the client to a tunnel
or forward its plain-HTTP requests. ``server.py`` owns the listener this runs under and
the shared services used here (``admit``, ``refuse``, ``dial``, ``start_tunnel``).

Per client connection::

    read head (header timeout, size limit)      -> 400/405/408/414/431/505 and close
    loop defence: the client is our own outbound socket -> 403 proxy_loop
    Proxy-Authorization carries the run token?  -> else 407 and close
    CONNECT  -> admit -> ConnectHandler (tunnel: dial, 200, splice; callbacks from then on)
    http://  -> admit -> forward, keep-alive: the next request is decided again

Every refusal is a 403 with ``X-Netwarden-Reason`` (400 for an invalid host) and a
``network_blocked`` event (unless the host is on the policy's silent list). Any
unexpected error in handling a connection is logged with its traceback and the
connection is closed: nothing is let through by an error.

Until its first head is complete a client is driven by callbacks (``Client``,
``_greet``): a CONNECT whose destination needs no lookup (IP literal, or a name still
in the resolver's cache) is admitted and dialed without any coroutine
(``_connect_now`` -> ``_dial_now`` -> ``_dialed``). Everything else runs in a task
(``_serve``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gateway.admission import Admission, admit_now
from gateway.audit import NetworkError
from gateway.auth import is_authorized
from gateway.dialer import Dialed, UpstreamFailed, addr_of, came_from_us
from gateway.parser import (
    RequestHead,
    RequestRejected,
    find_head_end,
    parse_request_head,
)
from gateway.relay import Endpoint
from gateway.replies import CONNECT_ESTABLISHED, reply
from gateway.tunnel import ConnectContext
from policy import Code, deny

if TYPE_CHECKING:
    from gateway.server import ProxyServer

__all__ = ["Client", "head_timeout"]

log = logging.getLogger("netwarden.proxy")


class Client(Endpoint):
    """A client connection. Until its first request head is complete it is driven by
    callbacks (``_greet``), with one timer for the header deadline: a CONNECT that
    needs no lookup becomes a tunnel without any coroutine (a task per client was most
    of the Python cost of a new tunnel). Anything else gets a task.
    """

    __slots__ = ("greeting", "not_a_loop", "server", "timer")

    def __init__(self, server: ProxyServer) -> None:
        super().__init__(on_lost=server.client_gone)
        self.server = server
        self.greeting = True
        self.not_a_loop = False  # the loop defence passed (once per connection)
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server._accepted(self)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.greeting:
            _greet(self.server, self)

    def eof_received(self) -> bool:
        keep = super().eof_received()
        if self.greeting:
            _greet(self.server, self)
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)


# -- serving one client ------------------------------------------------------------


async def _serve(server: ProxyServer, client: Client, first: RequestHead) -> None:
    """Serve ``client`` from its first head on (everything but the fast path)."""
    from gateway.forward import Outcome, Session, forward

    session = Session()
    handed_off = False
    try:
        head: RequestHead | None = first
        while True:
            if head is None:
                head = await _read_head(server, client)
                if head is None:
                    return
            if not _screen(server, client, head):
                return
            if head.is_connect:
                handed_off = await _connect(server, client, head)
                return
            outcome = await forward(server, session, client, head)
            head = None
            if outcome is Outcome.HANDED_OFF:
                handed_off = True
                return
            if outcome is Outcome.CLOSE:
                return
    except RequestRejected as exc:
        client.write(reply(exc.status, exc.detail))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("error while serving a client; connection closed")
        client.write(reply(500, "internal proxy error; the request was not forwarded"))
    finally:
        session.close()
        if not handed_off:
            client.close()


async def _read_head(server: ProxyServer, client: Client) -> RequestHead | None:
    """The next keep-alive request head, or None when the client is done (EOF or idle).

    Between keep-alive requests a client may idle for ``idle_timeout``; once its
    next bytes arrive the head must be complete within ``header_timeout``
    (slowloris). The common case, a whole head in one segment, takes no timer.
    (The first head is read by callbacks: ``_greet``.)
    """
    limit = server.config.max_header_bytes
    loop = asyncio.get_running_loop()
    if not client.buffer and not client.eof:
        server._idle.add(client)  # stop() closes idle clients at once
        try:
            async with asyncio.timeout(server.config.idle_timeout):
                await client.wait_data()
        except TimeoutError:
            return None
        finally:
            server._idle.discard(client)
    deadline = loop.time() + server.config.header_timeout
    end = find_head_end(client.buffer, max_size=limit)
    if end is not None:
        return parse_request_head(client.take(end))
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                if client.eof:
                    if client.buffer:
                        raise RequestRejected(400, "connection closed in the middle of a head")
                    return None
                await client.wait_data()
                end = find_head_end(client.buffer, max_size=limit)
                if end is not None:
                    return parse_request_head(client.take(end))
    except TimeoutError:
        raise RequestRejected(408, "request head not received in time") from None


# -- the first head, by callbacks ------------------------------------------------


def _greet(server: ProxyServer, client: Client) -> None:
    """Bytes (or EOF) arrived before the first head was complete."""
    try:
        end = find_head_end(client.buffer, max_size=server.config.max_header_bytes)
        if end is None:
            if client.eof:
                _greeted(server, client)
                if client.buffer:
                    client.write(reply(400, "connection closed in the middle of a head"))
                client.close()
            return
        _greeted(server, client)
        head = parse_request_head(client.take(end))
        if head.is_connect and server._fast_connect:
            _connect_now(server, client, head)
        else:
            server.spawn(_serve(server, client, head))
    except RequestRejected as exc:
        _greeted(server, client)
        client.write(reply(exc.status, exc.detail))
        client.close()
    except Exception:  # fail closed: nothing is let through by an error
        log.exception("error while serving a client; connection closed")
        _greeted(server, client)
        client.write(reply(500, "internal proxy error; the request was not forwarded"))
        client.close()


def _greeted(server: ProxyServer, client: Client) -> None:
    client.greeting = False
    server._idle.discard(client)
    if client.timer is not None:
        client.timer.cancel()
        client.timer = None


def head_timeout(server: ProxyServer, client: Client) -> None:
    client.timer = None
    if client.greeting:
        _greeted(server, client)
        client.write(reply(408, "request head not received in time"))
        client.close()


def _connect_now(server: ProxyServer, client: Client, head: RequestHead) -> None:
    """CONNECT without a coroutine when the destination needs no lookup."""
    if not _screen(server, client, head):
        client.close()
        return
    admission = admit_now(
        server.policy, head.host, head.port, cached=server._cached, own=server._own
    )
    if admission is None:  # the name needs a lookup
        server.spawn(_connect_after_lookup(server, client, head))
    elif not admission.allowed:
        server.refuse(client, admission.decision, head.method)
        client.close()
    else:
        _dial_now(server, client, head, admission)


async def _connect_after_lookup(server: ProxyServer, client: Endpoint, head: RequestHead) -> None:
    try:
        admission = await server.admit(client, head)
    except asyncio.CancelledError:
        client.close()
        raise
    except Exception:
        log.exception("error while serving a client; connection closed")
        client.write(reply(500, "internal proxy error; the request was not forwarded"))
        admission = None
    if admission is None:
        client.close()  # admit() answered the refusal
    else:
        _dial_now(server, client, head, admission)


def _dial_now(
    server: ProxyServer, client: Endpoint, head: RequestHead, admission: Admission
) -> None:
    host = admission.decision.host
    port = head.port
    server._handshakes.add(client)

    def dialed(result: Dialed) -> None:
        server._handshakes.discard(client)
        try:
            _dialed(server, client, host, port, admission, result)
        finally:
            server._settle()

    server.dialer.dial_soon(admission.addresses, port, dialed)


def _dialed(
    server: ProxyServer,
    client: Endpoint,
    host: str,
    port: int,
    admission: Admission,
    result: Dialed,
) -> None:
    if isinstance(result, UpstreamFailed):
        server._emit(
            NetworkError(
                host=host, port=port, error=result.detail, code=result.code, method="CONNECT"
            )
        )
        status = 504 if result.code == "timeout" else 502
        client.write(
            reply(status, f"cannot reach {host}:{port}: {result.detail}", code=result.code)
        )
        client.close()
        return
    upstream, address = result
    if client.lost:  # the client left while we dialed: no tunnel to start
        upstream.abort()
        return
    client.write(CONNECT_ESTABLISHED)
    server.start_tunnel(client, upstream, host, port, address, admission, method="CONNECT")


def _screen(server: ProxyServer, client: Client, head: RequestHead) -> bool:
    """Loop defence on the client side, then proxy auth. False: answered and done.

    The loop defence looks at the connection's two addresses, which never change:
    it runs for the first request only (two syscalls saved per keep-alive request).
    """
    if not client.not_a_loop and _came_from_us(server, client):
        server.refuse(
            client,
            deny(
                Code.PROXY_LOOP,
                head.host,
                head.port,
                "the request came back from this proxy; refused to avoid a loop",
                policy_name=server.policy.name,
            ),
            head.method,
        )
        return False
    token = server.config.token
    if token is not None and not is_authorized(head.get("proxy-authorization"), token):
        client.write(
            reply(
                407,
                "proxy authentication required: use the proxy_url netwarden printed",
                headers=(("Proxy-Authenticate", 'Basic realm="netwarden"'),),
            )
        )
        return False
    return True


def _came_from_us(server: ProxyServer, client: Client) -> bool:
    transport = client.transport
    peer = addr_of(transport.get_extra_info("peername")) if transport else None
    ours = addr_of(transport.get_extra_info("sockname")) if transport else None
    if peer is not None and ours is not None and came_from_us(peer, ours):
        return True
    client.not_a_loop = True
    return False


async def _connect(server: ProxyServer, client: Endpoint, head: RequestHead) -> bool:
    admission = await server.admit(client, head)
    if admission is None:
        return False
    await server.connect_handler.handle(ConnectContext(server, client, head, admission))
    return client.peer is not None

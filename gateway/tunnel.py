"""What happens to a client connection after its CONNECT was allowed (the pluggable step).

``ConnectHandler`` is the seam DESIGN.md "Coming next" asks for: today ``TunnelHandler``
dials a checked address, answers ``200 Connection Established`` and splices the two
sockets; the TLS-inspection engine will be another handler (answer 200, terminate TLS,
then dial) chosen per destination. A handler gets a ``ConnectContext`` and must either
hand the client to a ``Tunnel`` or close it.

``Tunnel`` is the bookkeeping of one spliced pair: no task, a few slots, and one
``network_connection`` event when both sides are gone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.admission import Admission
from gateway.audit import NetworkConnection
from gateway.parser import RequestHead
from gateway.relay import Endpoint, splice
from gateway.replies import CONNECT_ESTABLISHED

if TYPE_CHECKING:
    from gateway.server import ProxyServer

__all__ = ["ConnectContext", "ConnectHandler", "Tunnel", "TunnelHandler"]


@dataclass(frozen=True, slots=True)
class ConnectContext:
    server: ProxyServer
    client: Endpoint
    head: RequestHead
    admission: Admission

    @property
    def host(self) -> str:
        return self.admission.decision.host

    @property
    def port(self) -> int:
        return self.head.port


class ConnectHandler(Protocol):
    async def handle(self, ctx: ConnectContext) -> None: ...


class TunnelHandler:
    """The plain tunnel: dial, 200, splice."""

    __slots__ = ()

    async def handle(self, ctx: ConnectContext) -> None:
        dialed = await ctx.server.dial(ctx.client, ctx.host, ctx.port, ctx.admission, "CONNECT")
        if dialed is None:
            return  # dial() answered 502/504 and logged network_error
        upstream, address = dialed
        ctx.client.write(CONNECT_ESTABLISHED)
        ctx.server.start_tunnel(
            ctx.client, upstream, ctx.host, ctx.port, address, ctx.admission, method="CONNECT"
        )


class Tunnel:
    __slots__ = (
        "_gone",
        "address",
        "client",
        "host",
        "method",
        "port",
        "rule",
        "server",
        "started",
        "upstream",
    )

    def __init__(
        self,
        server: ProxyServer,
        client: Endpoint,
        upstream: Endpoint,
        host: str,
        port: int,
        address: str,
        rule: str | None,
        method: str,
    ) -> None:
        self.server = server
        self.client = client
        self.upstream = upstream
        self.host = host
        self.port = port
        self.address = address
        self.rule = rule
        self.method = method
        self.started = asyncio.get_running_loop().time()
        self._gone = 0
        client.on_lost = self._side_lost
        upstream.on_lost = self._side_lost
        splice(client, upstream)
        # splice may already have closed a side that was gone; connection_lost comes later.

    def _side_lost(self, endpoint: Endpoint) -> None:
        self._gone += 1
        if endpoint is self.client:
            self.server.client_gone(endpoint)
        else:
            self.server.upstream_gone(endpoint)
        if self._gone == 2:
            self.server.tunnel_done(self)

    def event(self) -> NetworkConnection:
        now = asyncio.get_running_loop().time()
        return NetworkConnection(
            host=self.host,
            port=self.port,
            address=self.address,
            bytes_up=self.client.bytes_in,
            bytes_down=self.upstream.bytes_in,
            duration_ms=int((now - self.started) * 1000),
            method=self.method,
            rule=self.rule,
        )

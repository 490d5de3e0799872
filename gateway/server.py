"""The proxy server: accepts clients, reads one request head at a time, and carries out
what admission decided. Parsing (``parser``), deciding (``admission`` + ``policy``),
relaying (``relay``/``tunnel``) and HTTP forwarding (``forward``) live elsewhere; this
module only wires them to sockets.

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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Self

from gateway.admission import Admission, ListenAddr, admit, admit_now
from gateway.audit import (
    AuditLog,
    NetworkBlocked,
    NetworkError,
    PolicyReloaded,
    ProxyStarted,
    ProxyStopped,
)
from gateway.auth import PROXY_USER, is_authorized
from gateway.config import ProxyConfig
from gateway.dialer import Dialed, Dialer, UpstreamFailed, addr_of, came_from_us
from gateway.parser import (
    RequestHead,
    RequestRejected,
    find_head_end,
    parse_request_head,
)
from gateway.relay import Endpoint
from gateway.replies import CONNECT_ESTABLISHED, reply
from gateway.resolver import CachingResolver, ResolveFailed, Resolver, SystemResolver
from gateway.tunnel import ConnectContext, ConnectHandler, Tunnel, TunnelHandler
from policy import Code, Decision, Policy, PolicyError, deny, load_policy

__all__ = ["ProxyConfig", "ProxyServer"]

log = logging.getLogger("netwarden.proxy")


class _Client(Endpoint):
    """A client connection. Until its first request head is complete it is driven by
    callbacks (``ProxyServer._greet``), with one timer for the header deadline: a
    CONNECT that needs no lookup becomes a tunnel without any coroutine (a task per
    client was most of the Python cost of a new tunnel). Anything else gets a task.
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
            self.server._greet(self)

    def eof_received(self) -> bool:
        keep = super().eof_received()
        if self.greeting:
            self.server._greet(self)
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.policy = config.policy
        self.audit = config.audit if config.audit is not None else AuditLog(None, config.run_id)
        if config.token:
            self.audit.add_secret(config.token)
        self.resolver: Resolver = config.resolver or SystemResolver()
        self.connect_handler: ConnectHandler = config.connect_handler or TunnelHandler()
        # The plain tunnel has a callback-driven fast path; another handler gets a task.
        self._fast_connect = type(self.connect_handler) is TunnelHandler
        self._cached = (
            self.resolver.cached if isinstance(self.resolver, CachingResolver) else _no_cache
        )
        self._server: asyncio.Server | None = None
        self._own: list[ListenAddr] = []
        self.dialer = Dialer(config.connect_timeout)
        self._clients: set[Endpoint] = set()
        self._idle: set[Endpoint] = set()  # waiting for a request, nothing in flight
        self._tunnels: set[Tunnel] = set()
        self._handshakes: set[Endpoint] = set()  # fast-path clients waiting for a dial
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None  # set while stop() waits
        self._started = 0.0
        self.connections_served = 0

    def __repr__(self) -> str:
        return f"ProxyServer(listen={self._listen_text()!r}, policy={self.policy.name!r})"

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host = self.config.listen_host.strip("[]")
        self._server = await loop.create_server(
            lambda: _Client(self), host, self.config.listen_port, backlog=4096, reuse_address=True
        )
        for sock in self._server.sockets:
            name = sock.getsockname()
            self._own.append((str(name[0]), int(name[1])))
        self._started = loop.time()
        self._schedule_sweep()
        self.audit.emit(
            ProxyStarted(
                listen=self._listen_text(),
                policy=self.policy.name,
                mode=self.policy.mode.value,
                auth=self.config.token is not None,
            )
        )

    async def stop(self) -> None:
        """Stop accepting, let work in flight finish for ``drain_timeout``, then abort."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for client in list(self._idle):
            client.close()
        loop = asyncio.get_running_loop()
        # Drain: handshakes and forwarded requests in flight finish, tunnels get the
        # same grace; whatever is left after drain_timeout is aborted.
        try:
            async with asyncio.timeout(self.config.drain_timeout):
                while self._tasks or self._tunnels or self._handshakes:
                    if self._tasks:
                        await asyncio.wait(list(self._tasks))
                    else:
                        self._drained = loop.create_future()
                        await self._drained
        except TimeoutError:
            pass
        for task in list(self._tasks):
            task.cancel()
        self.dialer.cancel_pending()
        for tunnel in list(self._tunnels):
            tunnel.client.abort()
            tunnel.upstream.abort()
        for client in list(self._clients):
            client.abort()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        await server.wait_closed()
        self.dialer.close()
        self.audit.emit(
            ProxyStopped(
                listen=self._listen_text(),
                connections_served=self.connections_served,
                uptime_ms=int((loop.time() - self._started) * 1000),
            )
        )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if not self._own:
            raise RuntimeError("the proxy is not started; await start() first")
        return self._own[0][1]

    @property
    def own_endpoints(self) -> list[ListenAddr]:
        return list(self._own)

    def add_own_endpoint(self, host: str, port: int) -> None:
        """Register another of our listeners (per-run apps) the proxy must never dial."""
        self._own.append((host, port))

    def proxy_url(self, host: str | None = None) -> str:
        host = host or self.config.listen_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        creds = f"{PROXY_USER}:{self.config.token}@" if self.config.token else ""
        return f"http://{creds}{host}:{self.port}"

    def _listen_text(self) -> str:
        if not self._own:
            return f"{self.config.listen_host}:{self.config.listen_port}"
        host, port = self._own[0]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def reload(self, policy: Policy, *, path: str | None = None) -> None:
        """Swap the policy; requests decided from now on use it."""
        self.policy = policy
        self.audit.emit(PolicyReloaded(ok=True, path=path, policy=policy.name))

    def reload_from(self, path: str) -> bool:
        """Load ``path`` and swap it in; on error keep the old policy and say why."""
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            self.audit.emit(PolicyReloaded(ok=False, path=path, error=str(exc)))
            log.error("policy reload failed, keeping %s: %s", self.policy.name, exc)
            return False
        except OSError as exc:
            self.audit.emit(PolicyReloaded(ok=False, path=path, error=f"cannot read: {exc}"))
            log.error("policy reload failed, keeping %s: %s", self.policy.name, exc)
            return False
        self.reload(policy, path=path)
        return True

    # -- connection accounting -------------------------------------------------------

    def _accepted(self, client: _Client) -> None:
        if self._server is None or len(self._clients) >= self.config.max_connections:
            client.greeting = False
            client.write(reply(503, "proxy is at its connection limit; retry later"))
            client.close()
            client.on_lost = None
            return
        self._clients.add(client)
        self.connections_served += 1
        self._idle.add(client)  # stop() closes clients still waiting for a head at once
        client.timer = asyncio.get_running_loop().call_later(
            self.config.header_timeout, self._head_timeout, client
        )

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def client_gone(self, client: Endpoint) -> None:
        self._clients.discard(client)

    def upstream_gone(self, upstream: Endpoint) -> None:
        self.dialer.forget(upstream)

    def tunnel_done(self, tunnel: Tunnel) -> None:
        self._tunnels.discard(tunnel)
        self._emit(tunnel.event())
        self._settle()

    def _settle(self) -> None:
        """Wake stop() once no tunnel and no fast-path handshake is left."""
        drained = self._drained
        busy = self._tunnels or self._handshakes
        if drained is not None and not drained.done() and not busy:
            drained.set_result(None)

    def _emit(self, event: Any) -> None:
        try:
            self.audit.emit(event)
        except OSError:
            log.exception("cannot write the audit log")

    def _schedule_sweep(self) -> None:
        interval = max(0.05, min(self.config.idle_timeout / 4, 30.0))
        self._sweeper = asyncio.get_running_loop().call_later(interval, self._sweep)

    def _sweep(self) -> None:
        """Close tunnels idle for longer than ``idle_timeout`` (one timer for all)."""
        now = asyncio.get_running_loop().time()
        limit = self.config.idle_timeout
        for tunnel in list(self._tunnels):
            if now - tunnel.client.last_active > limit:
                tunnel.client.abort()
                tunnel.upstream.abort()
        if self._server is not None:
            self._schedule_sweep()

    # -- serving one client ----------------------------------------------------------------

    async def _serve(self, client: _Client, first: RequestHead) -> None:
        """Serve ``client`` from its first head on (everything but the fast path)."""
        from gateway.forward import Outcome, Session, forward

        session = Session()
        handed_off = False
        try:
            head: RequestHead | None = first
            while True:
                if head is None:
                    head = await self._read_head(client)
                    if head is None:
                        return
                if not self._screen(client, head):
                    return
                if head.is_connect:
                    handed_off = await self._connect(client, head)
                    return
                outcome = await forward(self, session, client, head)
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

    async def _read_head(self, client: _Client) -> RequestHead | None:
        """The next keep-alive request head, or None when the client is done (EOF or idle).

        Between keep-alive requests a client may idle for ``idle_timeout``; once its
        next bytes arrive the head must be complete within ``header_timeout``
        (slowloris). The common case, a whole head in one segment, takes no timer.
        (The first head is read by callbacks: ``_greet``.)
        """
        limit = self.config.max_header_bytes
        loop = asyncio.get_running_loop()
        if not client.buffer and not client.eof:
            self._idle.add(client)  # stop() closes idle clients at once
            try:
                async with asyncio.timeout(self.config.idle_timeout):
                    await client.wait_data()
            except TimeoutError:
                return None
            finally:
                self._idle.discard(client)
        deadline = loop.time() + self.config.header_timeout
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

    def _greet(self, client: _Client) -> None:
        """Bytes (or EOF) arrived before the first head was complete."""
        try:
            end = find_head_end(client.buffer, max_size=self.config.max_header_bytes)
            if end is None:
                if client.eof:
                    self._greeted(client)
                    if client.buffer:
                        client.write(reply(400, "connection closed in the middle of a head"))
                    client.close()
                return
            self._greeted(client)
            head = parse_request_head(client.take(end))
            if head.is_connect and self._fast_connect:
                self._connect_now(client, head)
            else:
                self.spawn(self._serve(client, head))
        except RequestRejected as exc:
            self._greeted(client)
            client.write(reply(exc.status, exc.detail))
            client.close()
        except Exception:  # fail closed: nothing is let through by an error
            log.exception("error while serving a client; connection closed")
            self._greeted(client)
            client.write(reply(500, "internal proxy error; the request was not forwarded"))
            client.close()

    def _greeted(self, client: _Client) -> None:
        client.greeting = False
        self._idle.discard(client)
        if client.timer is not None:
            client.timer.cancel()
            client.timer = None

    def _head_timeout(self, client: _Client) -> None:
        client.timer = None
        if client.greeting:
            self._greeted(client)
            client.write(reply(408, "request head not received in time"))
            client.close()

    def _connect_now(self, client: _Client, head: RequestHead) -> None:
        """CONNECT without a coroutine when the destination needs no lookup."""
        if not self._screen(client, head):
            client.close()
            return
        admission = admit_now(self.policy, head.host, head.port, cached=self._cached, own=self._own)
        if admission is None:  # the name needs a lookup
            self.spawn(self._connect_after_lookup(client, head))
        elif not admission.allowed:
            self.refuse(client, admission.decision, head.method)
            client.close()
        else:
            self._dial_now(client, head, admission)

    async def _connect_after_lookup(self, client: Endpoint, head: RequestHead) -> None:
        try:
            admission = await self.admit(client, head)
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
            self._dial_now(client, head, admission)

    def _dial_now(self, client: Endpoint, head: RequestHead, admission: Admission) -> None:
        host = admission.decision.host
        port = head.port
        self._handshakes.add(client)

        def dialed(result: Dialed) -> None:
            self._handshakes.discard(client)
            try:
                self._dialed(client, host, port, admission, result)
            finally:
                self._settle()

        self.dialer.dial_soon(admission.addresses, port, dialed)

    def _dialed(
        self, client: Endpoint, host: str, port: int, admission: Admission, result: Dialed
    ) -> None:
        if isinstance(result, UpstreamFailed):
            self._emit(
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
        self.start_tunnel(client, upstream, host, port, address, admission, method="CONNECT")

    def _screen(self, client: _Client, head: RequestHead) -> bool:
        """Loop defence on the client side, then proxy auth. False: answered and done.

        The loop defence looks at the connection's two addresses, which never change:
        it runs for the first request only (two syscalls saved per keep-alive request).
        """
        if not client.not_a_loop and self._came_from_us(client):
            self.refuse(
                client,
                deny(
                    Code.PROXY_LOOP,
                    head.host,
                    head.port,
                    "the request came back from this proxy; refused to avoid a loop",
                    policy_name=self.policy.name,
                ),
                head.method,
            )
            return False
        token = self.config.token
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

    def _came_from_us(self, client: _Client) -> bool:
        transport = client.transport
        peer = addr_of(transport.get_extra_info("peername")) if transport else None
        ours = addr_of(transport.get_extra_info("sockname")) if transport else None
        if peer is not None and ours is not None and came_from_us(peer, ours):
            return True
        client.not_a_loop = True
        return False

    def refuse(self, client: Endpoint, decision: Decision, method: str) -> None:
        try:
            silent = self.policy.is_silent(decision.host)
        except Exception:  # an error here must not cost us the refusal or its event
            log.exception("policy.is_silent failed; logging the refusal")
            silent = False
        if not silent:
            self._emit(NetworkBlocked.from_decision(decision, method=method))
        status = 400 if decision.code is Code.INVALID_HOST else 403
        client.write(reply(status, decision.message, code=decision.code.value))

    async def admit(self, client: Endpoint, head: RequestHead) -> Admission | None:
        """Admission for ``head``'s destination, or None after answering the refusal."""
        admission = admit_now(self.policy, head.host, head.port, cached=self._cached, own=self._own)
        if admission is not None:  # decided without a lookup
            if not admission.allowed:
                self.refuse(client, admission.decision, head.method)
                return None
            return admission
        try:
            admission = await admit(
                self.policy,
                head.host,
                head.port,
                resolver=self.resolver,
                own=self._own,
                lookup_timeout=self.config.connect_timeout,
            )
        except ResolveFailed as exc:
            self._emit(
                NetworkError(
                    host=exc.host, port=head.port, error=exc.why, code="dns", method=head.method
                )
            )
            client.write(reply(502, f"cannot resolve {exc.host}", code="dns"))
            return None
        except TimeoutError:
            self._emit(
                NetworkError(
                    host=head.host,
                    port=head.port,
                    error="name lookup timed out",
                    code="timeout",
                    method=head.method,
                )
            )
            client.write(reply(504, f"name lookup for {head.host} timed out", code="timeout"))
            return None
        if not admission.allowed:
            self.refuse(client, admission.decision, head.method)
            return None
        return admission

    async def _connect(self, client: Endpoint, head: RequestHead) -> bool:
        admission = await self.admit(client, head)
        if admission is None:
            return False
        await self.connect_handler.handle(ConnectContext(self, client, head, admission))
        return client.peer is not None

    async def dial(
        self, client: Endpoint, host: str, port: int, admission: Admission, method: str
    ) -> tuple[Endpoint, str] | None:
        """Connect to the first reachable checked address; on failure answer 502/504."""
        try:
            return await self.dialer.dial(admission.addresses, port)
        except UpstreamFailed as exc:
            self._emit(
                NetworkError(host=host, port=port, error=exc.detail, code=exc.code, method=method)
            )
            status = 504 if exc.code == "timeout" else 502
            client.write(reply(status, f"cannot reach {host}:{port}: {exc.detail}", code=exc.code))
            return None

    def start_tunnel(
        self,
        client: Endpoint,
        upstream: Endpoint,
        host: str,
        port: int,
        address: str,
        admission: Admission,
        *,
        method: str,
    ) -> None:
        tunnel = Tunnel(
            self, client, upstream, host, port, address, admission.decision.rule, method
        )
        self._tunnels.add(tunnel)


def _no_cache(_host: str) -> list[str] | None:
    return None

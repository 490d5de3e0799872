"""The proxy server: the listener and what all its connections share.

``ProxyServer`` owns the listening socket and its lifecycle (``start``; ``stop``: stop
accepting, close idle clients, drain handshakes, requests and tunnels for
``drain_timeout``, then abort what is left), the connection limit, the idle-tunnel
sweep, policy reloads, our own endpoints (loop defence) and the ``proxy_started`` /
``proxy_stopped`` / ``policy_reloaded`` events. It also offers the services every
connection handler uses: ``admit`` (policy + address guard, refusal answered and
logged), ``dial``, ``start_tunnel``.

What happens on one client connection (the per-connection contract) is in
``handshake``; parsing (``parser``), deciding (``admission`` + ``policy``), relaying
(``relay``/``tunnel``) and HTTP forwarding (``forward``) live in their own modules.
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
from gateway.auth import PROXY_USER
from gateway.config import ProxyConfig
from gateway.dialer import Dialer, UpstreamFailed
from gateway.handshake import Client, head_timeout
from gateway.parser import RequestHead
from gateway.relay import Endpoint
from gateway.replies import reply
from gateway.resolver import CachingResolver, ResolveFailed, Resolver, SystemResolver
from gateway.tunnel import ConnectHandler, Tunnel, TunnelHandler
from policy import Code, Decision, Policy, PolicyError, load_policy

__all__ = ["ProxyConfig", "ProxyServer"]

log = logging.getLogger("netwarden.proxy")


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
            lambda: Client(self), host, self.config.listen_port, backlog=4096, reuse_address=True
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

    def _accepted(self, client: Client) -> None:
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
            self.config.header_timeout, head_timeout, self, client
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

    # -- services for the connection handlers (handshake, forward, tunnel) -------------

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

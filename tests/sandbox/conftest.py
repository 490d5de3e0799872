"""Fixtures for container tests: a real docker engine, or a visible skip.

``engine`` skips with the reason printed ONLY where no engine can run, and fails
instead when ``NETWARDEN_REQUIRE_DOCKER=1`` (CI sets it). The base image is built once
per session if missing. Every test scopes its leftover checks to its own run id: other
runs may share the engine.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import pytest_asyncio

from policy.errors import DockerUnavailable
from sandbox import DEFAULT_IMAGE, ProxyEndpoint, run_key
from sandbox.firewall import firewall_rules_for, probe_privilege
from sandbox.names import LABEL_RUN
from sandbox.runtime import DockerRuntime, connect

REPO = Path(__file__).resolve().parents[2]
HELLO = b"hello-from-host\n"
UPSTREAM_BODY = b"upstream says hi\n"


def _unavailable(reason: str) -> None:
    if os.environ.get("NETWARDEN_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (NETWARDEN_REQUIRE_DOCKER=1: container tests must run here)")
    print(f"\nSKIP container tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine() -> Iterator[DockerRuntime]:
    try:
        runtime = connect(timeout=10)
    except DockerUnavailable as exc:
        _unavailable(f"no docker engine can run here: {exc}")
        raise
    problem = probe_privilege()
    if problem is not None:
        _unavailable(f"egress cannot be confined here: {problem}")
    if not runtime.image_present(DEFAULT_IMAGE):
        runtime.build_base_image(DEFAULT_IMAGE)
    yield runtime
    runtime.close()


def leftovers(engine: DockerRuntime, run_id: str) -> list[str]:
    """Every container, network and firewall rule run ``run_id`` still has."""
    found = [f"{r.kind} {r.name}" for r in engine.list_labelled(f"{LABEL_RUN}={run_id}")]
    return found + firewall_rules_for(run_key(run_id))


def host_address() -> str:
    """This host's primary address (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        return str(probe.getsockname()[0])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def hello_port() -> AsyncIterator[int]:
    """A host service on every address (0.0.0.0) that says hello: what a bypass wants."""

    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HELLO)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "0.0.0.0", 0)
    async with server:
        yield int(server.sockets[0].getsockname()[1])


class StandinProxy:
    """A TCP listener standing in for the proxy: it greets whoever connects."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []

    async def __call__(self, bind_host: str, advertise_host: str) -> ProxyEndpoint:
        async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"standin-proxy\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(greet, bind_host, 0)
        self.servers.append(server)
        port = int(server.sockets[0].getsockname()[1])
        return ProxyEndpoint(port=port, url=f"http://netwarden:t0ken@{advertise_host}:{port}")

    async def close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(UPSTREAM_BODY)))
        self.end_headers()
        self.wfile.write(UPSTREAM_BODY)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    """An HTTP upstream on the host (every address); the proxy reaches it on 127.0.0.2."""
    server = ThreadingHTTPServer(("0.0.0.0", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    thread.join()
    server.server_close()


def netwarden(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )

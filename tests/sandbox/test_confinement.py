"""Enforced egress on a real engine: from inside a sandbox, a process that ignores the
proxy variables reaches nothing but the proxy port, and fails FAST (rejected, not left
to time out). A control container on docker's default bridge shows the same targets are
live for an unconfined container, so each refusal below is the lockdown's doing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from policy.errors import DockerUnavailable
from sandbox import Egress, ProxyEndpoint, Sandbox, SandboxSpec
from sandbox.runtime import DockerRuntime

from .conftest import HELLO, StandinProxy, host_address, leftovers

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

_FAST = 2.0  # seconds; a dropped (not rejected) connection would take the full timeout


@dataclass
class Pair:
    confined: Sandbox
    other: Sandbox
    other_ip: str


class _Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, chunk: bytes) -> int:
        self.data += chunk
        return len(chunk)

    def flush(self) -> None:
        return


async def sh(sandbox: Sandbox, script: str) -> tuple[int, str, float]:
    out = _Sink()
    started = time.monotonic()
    code = await sandbox.exec(["sh", "-c", script], stdout=out, stderr=out)  # type: ignore[arg-type]
    return code, out.data.decode(errors="replace"), time.monotonic() - started


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pair(engine: DockerRuntime) -> AsyncIterator[Pair]:
    proxy = StandinProxy()
    suffix = uuid.uuid4().hex[:8]
    try:
        async with (
            Sandbox(SandboxSpec(), run_id=f"t-a-{suffix}", runtime=engine, proxy=proxy) as a,
            Sandbox(SandboxSpec(), run_id=f"t-b-{suffix}", runtime=engine, proxy=proxy) as b,
        ):
            assert a.egress is Egress.ENFORCED
            # the other sandbox serves on 8080; probe until it answers (no fixed sleep)
            code, out, _ = await sh(
                b,
                "nc -ll -p 8080 -e echo other-sandbox >/dev/null 2>&1 </dev/null &\n"
                "for i in $(seq 100); do nc 127.0.0.1 8080 </dev/null | grep -q other && "
                "exec hostname -i; usleep 20000; done; exit 1",
            )
            assert code == 0, out
            yield Pair(a, b, out.split()[0])
    finally:
        await proxy.close()
    assert leftovers(engine, f"t-a-{suffix}") == []
    assert leftovers(engine, f"t-b-{suffix}") == []


async def test_proxy_port_is_reachable(pair: Pair) -> None:
    port = pair.confined.proxy_port
    code, out, _ = await sh(pair.confined, f"timeout 3 nc host.docker.internal {port} </dev/null")
    assert code == 0, out
    assert "standin-proxy" in out


BYPASSES = [
    ("bridge-gateway-other-port", "gateway", "hello"),
    ("docker0", "172.17.0.1", "hello"),
    ("host-eth0", "eth0", "hello"),
    ("metadata", "169.254.169.254", "80"),
    ("outside-ip", "1.1.1.1", "443"),
    ("outside-ip-http", "8.8.8.8", "80"),
    ("other-sandbox", "other", "8080"),
    ("other-sandbox-gateway-proxy-port", "other-gateway", "other-proxy"),
]


@pytest.mark.parametrize(("where", "port"), [b[1:] for b in BYPASSES], ids=[b[0] for b in BYPASSES])
async def test_direct_connection_fails_fast(
    pair: Pair, hello_port: int, where: str, port: str
) -> None:
    target = {
        "gateway": pair.confined.gateway_ip,
        "eth0": host_address(),
        "other": pair.other_ip,
        "other-gateway": pair.other.gateway_ip,
    }.get(where, where)
    number = {"hello": hello_port, "other-proxy": pair.other.proxy_port}.get(port, port)
    code, out, took = await sh(pair.confined, f"timeout 5 nc {target} {number} </dev/null")
    assert code != 0, out
    assert HELLO.decode().strip() not in out
    assert "other-sandbox" not in out
    assert "standin-proxy" not in out
    assert took < _FAST, f"took {took:.2f}s: dropped, not rejected ({out})"


async def test_dns_fails_fast(pair: Pair) -> None:
    code, out, took = await sh(pair.confined, "nslookup example.com")
    assert code != 0, out
    assert took < _FAST, f"DNS took {took:.2f}s to fail"


async def test_ipv6_is_off(pair: Pair) -> None:
    code, out, _ = await sh(pair.confined, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
    assert (code, out.strip()) == (0, "1")


async def test_hardening(pair: Pair) -> None:
    code, out, _ = await sh(
        pair.confined,
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        "touch /etc/x 2>&1; touch /tmp/x /workspace/x && echo writable; pwd; "
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
    )
    assert code == 0, out
    lines = out.split("\n")
    assert lines[0] == "1000"
    assert "CapEff:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    assert "Read-only file system" in out
    assert "writable" in out
    assert "/workspace" in lines
    assert "256" in lines


async def test_proxy_env_is_set_and_minimal(pair: Pair) -> None:
    _, out, _ = await sh(pair.confined, "env | grep -i _proxy= | sort")
    port = pair.confined.proxy_port
    url = f"http://netwarden:t0ken@host.docker.internal:{port}"
    assert out.split() == sorted(
        [
            f"HTTPS_PROXY={url}",
            f"HTTP_PROXY={url}",
            "NO_PROXY=localhost,127.0.0.1,::1",
            f"http_proxy={url}",
            f"https_proxy={url}",
            "no_proxy=localhost,127.0.0.1,::1",
        ]
    )


async def test_control_unconfined_container_reaches_the_targets(
    engine: DockerRuntime, hello_port: int
) -> None:
    """Without netwarden's network the same host targets answer: the refusals above are
    the lockdown's, not an accident of the environment."""
    run_id = f"t-control-{uuid.uuid4().hex[:8]}"
    container = await asyncio.to_thread(
        engine.run_container,
        image="netwarden/base:local",
        command=["sleep", "infinity"],
        init=True,
        labels={"netwarden.run-id": run_id},
    )
    try:
        for target in ("172.17.0.1", host_address()):
            out = _Sink()
            code = await asyncio.to_thread(
                engine.exec_stream,
                container,
                ["sh", "-c", f"timeout 5 nc {target} {hello_port} </dev/null"],
                on_stdout=out.data.extend,
                on_stderr=out.data.extend,
            )
            assert (code, bytes(out.data)) == (0, HELLO), target
    finally:
        await asyncio.to_thread(engine.remove_container, container)


class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("fail_at", ["proxy", "container"])
async def test_failed_start_leaves_nothing(engine: DockerRuntime, fail_at: str) -> None:
    run_id = f"t-fail-{fail_at}-{uuid.uuid4().hex[:8]}"
    proxy = StandinProxy()

    async def failing_proxy(bind_host: str, advertise_host: str) -> ProxyEndpoint:
        if fail_at == "proxy":
            raise _Boom("proxy would not start")
        return await proxy(bind_host, advertise_host)

    spec = SandboxSpec(image="netwarden/base:local", user="1000:1000")
    if fail_at == "container":  # the engine refuses to create the container
        spec = spec.model_copy(update={"memory": "1k"})
    sandbox = Sandbox(spec, run_id=run_id, runtime=engine, proxy=failing_proxy)
    with pytest.raises((_Boom, DockerUnavailable)):
        async with sandbox:
            pytest.fail("the sandbox should not have started")
    await proxy.close()
    assert sandbox.teardown_errors == []
    assert leftovers(engine, run_id) == []

"""``netwarden run``: policy + proxy + sandbox for one command, then teardown.

The order of a run, and who undoes what (an ``AsyncExitStack``, so every step's undo
runs on normal exit, error, Ctrl-C and SIGTERM, in reverse):

1. reap leftovers of dead runs (``sandbox.reaper``; never a live run's);
2. pick where the command runs (``--sandbox``):
   ``auto``   docker when an engine answers, else the host with the proxy env set and a
              ``sandbox_skipped`` event plus a stderr warning;
   ``docker`` docker, or exit 125 with the reason (no engine, no firewall privilege);
   ``none``   the host, with a warning and a ``sandbox_skipped`` event;
3. the proxy (``gateway.server.ProxyServer``): in docker, bound to the run network's
   gateway IP that only the run's bridge may reach (``sandbox.Sandbox`` does the network
   and the firewall and calls back ``_ProxyLauncher``); on the host, bound to 127.0.0.1.
   A policy in ``mode: open`` starts no proxy at all;
4. the command, its stdout/stderr passed through, its exit code returned.

Exit codes: the command's own; 125 when netwarden could not run it (engine, firewall,
spec); 2 for an invalid policy; 130 on Ctrl-C; 143 on SIGTERM. In ``auto`` mode a
missing firewall privilege does not stop the run: it emits ``sandbox_egress_unenforced``
and warns on stderr, never silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO, Final, TextIO

from gateway.audit import AuditLog
from gateway.run_events import (
    SandboxEgressUnenforced,
    SandboxSkipped,
    SandboxStarted,
    SandboxStopped,
)
from policy import Mode, Policy
from policy.errors import GatewayError, OperatorError
from sandbox import Egress, ProxyEndpoint, Sandbox, SandboxSpec, proxy_env
from sandbox.reaper import reap_orphans
from sandbox.runtime import ContainerRuntime, connect

__all__ = [
    "EXIT_CANNOT_RUN",
    "RunRequest",
    "SandboxMode",
    "default_events_path",
    "new_run_id",
    "run_command",
    "run_sync",
]

EXIT_CANNOT_RUN: Final = 125
EXIT_SIGINT: Final = 130
EXIT_SIGTERM: Final = 143


class SandboxMode(StrEnum):
    AUTO = "auto"
    DOCKER = "docker"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class RunRequest:
    argv: tuple[str, ...]
    policy: Policy
    run_id: str
    sandbox: SandboxMode = SandboxMode.AUTO
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    events: Path | None = None


def new_run_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def default_events_path() -> Path:
    """``$XDG_STATE_HOME/netwarden/events.jsonl`` (``~/.local/state/...``)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "netwarden" / "events.jsonl"


class _ProxyLauncher:
    """Satisfies ``sandbox.ProxyStarter``: starts the run's proxy where it is told to."""

    def __init__(self, stack: AsyncExitStack, policy: Policy, run_id: str, audit: AuditLog) -> None:
        self._stack = stack
        self._policy = policy
        self._run_id = run_id
        self._audit = audit
        self._token = secrets.token_urlsafe(24)
        audit.add_secret(self._token)

    def __repr__(self) -> str:
        return f"_ProxyLauncher(run_id={self._run_id!r})"

    async def __call__(self, bind_host: str, advertise_host: str) -> ProxyEndpoint:
        from gateway.server import ProxyConfig, ProxyServer

        server = ProxyServer(
            ProxyConfig(
                policy=self._policy,
                listen_host=bind_host,
                listen_port=0,
                run_id=self._run_id,
                token=self._token,
                audit=self._audit,
            )
        )
        await server.start()
        self._stack.push_async_callback(server.stop)
        return ProxyEndpoint(port=server.port, url=server.proxy_url(advertise_host))


def _warn(stderr: TextIO, text: str) -> None:
    stderr.write(f"netwarden: warning: {text}\n")
    stderr.flush()


async def run_command(
    request: RunRequest,
    *,
    stdout: BinaryIO,
    stderr: BinaryIO,
    errors: TextIO,
    connector: Callable[[], ContainerRuntime] = connect,
) -> int:
    """Run the request (module docstring); the exit code. Raises ``OperatorError`` when
    the command cannot be run as asked (the CLI maps it to 125)."""
    audit = AuditLog(request.events, request.run_id)
    try:
        return await _run(
            request, audit, stdout=stdout, stderr=stderr, errors=errors, connector=connector
        )
    finally:
        audit.close()


async def _run(
    request: RunRequest,
    audit: AuditLog,
    *,
    stdout: BinaryIO,
    stderr: BinaryIO,
    errors: TextIO,
    connector: Callable[[], ContainerRuntime],
) -> int:
    runtime: ContainerRuntime | None = None
    skipped_reason = ""
    if request.sandbox is not SandboxMode.NONE:
        try:
            runtime = await asyncio.to_thread(connector)
        except GatewayError as exc:
            if request.sandbox is SandboxMode.DOCKER:
                raise
            skipped_reason = str(exc)
    report = await asyncio.to_thread(reap_orphans, runtime)
    if report.removed:
        errors.write(
            f"netwarden: removed leftovers of dead runs: {len(report.containers)} containers, "
            f"{len(report.networks)} networks, {len(report.firewall_keys)} firewall chains\n"
        )
    proxied = request.policy.mode is not Mode.OPEN
    async with AsyncExitStack() as stack:
        launcher = _ProxyLauncher(stack, request.policy, request.run_id, audit)
        if runtime is None:
            reason = skipped_reason or "--sandbox none"
            audit.emit(
                SandboxSkipped(requested=request.sandbox.value, reason=reason, proxied=proxied)
            )
            _warn(
                errors,
                f"running on this host, NOT in a sandbox ({reason}); egress goes "
                "through the proxy only for programs that honour HTTPS_PROXY",
            )
            return await _run_on_host(
                request, audit, launcher if proxied else None, stdout=stdout, stderr=stderr
            )
        return await _run_in_docker(
            request,
            audit,
            runtime,
            launcher if proxied else None,
            stdout=stdout,
            stderr=stderr,
            errors=errors,
        )
    raise AssertionError("unreachable")  # pragma: no cover


async def _run_in_docker(
    request: RunRequest,
    audit: AuditLog,
    runtime: ContainerRuntime,
    launcher: _ProxyLauncher | None,
    *,
    stdout: BinaryIO,
    stderr: BinaryIO,
    errors: TextIO,
) -> int:
    sandbox = Sandbox(
        request.spec,
        run_id=request.run_id,
        runtime=runtime,
        proxy=launcher,
        enforce=request.sandbox is SandboxMode.DOCKER,
    )
    outcome, code = "error", None
    try:
        async with sandbox:
            audit.emit(
                SandboxStarted(
                    image=request.spec.image,
                    container=(sandbox.container_id or "")[:12],
                    network=sandbox.network,
                    egress=sandbox.egress.value,
                    gateway_ip=sandbox.gateway_ip,
                    proxy_port=sandbox.proxy_port,
                )
            )
            if sandbox.egress is Egress.UNENFORCED:
                reason = sandbox.unenforced_reason or "firewall unavailable"
                audit.emit(SandboxEgressUnenforced(reason=reason))
                _warn(
                    errors,
                    f"EGRESS IS NOT CONFINED: {reason}. The sandbox can reach this "
                    "host's ports directly; run as root or use --sandbox docker to refuse",
                )
            try:
                code = await sandbox.exec(list(request.argv), stdout=stdout, stderr=stderr)
                outcome = "exited"
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
    finally:
        audit.emit(
            SandboxStopped(
                where="docker",
                outcome=outcome,
                exit_code=code,
                duration_ms=sandbox.duration_ms,
                teardown_errors=list(sandbox.teardown_errors),
            )
        )
        for problem in sandbox.teardown_errors:
            _warn(errors, f"teardown left {problem}; `netwarden sandbox reap` will retry")
    return code if code is not None and code >= 0 else EXIT_CANNOT_RUN


async def _run_on_host(
    request: RunRequest,
    audit: AuditLog,
    launcher: _ProxyLauncher | None,
    *,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    env = dict(os.environ)
    if launcher is not None:
        endpoint = await launcher("127.0.0.1", "127.0.0.1")
        env.update(proxy_env(endpoint.url))
    started = time.monotonic()
    outcome, code = "error", None
    try:
        process = await asyncio.create_subprocess_exec(
            *request.argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise OperatorError(
            f"cannot start {request.argv[0]!r}: {exc.strerror}; check the command name and PATH"
        ) from exc
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        async with asyncio.TaskGroup() as pumps:
            pumps.create_task(_pump(process.stdout, stdout))
            pumps.create_task(_pump(process.stderr, stderr))
        code = await process.wait()
        outcome = "exited"
    except asyncio.CancelledError:
        outcome = "cancelled"
        await _stop_process(process)
        raise
    finally:
        audit.emit(
            SandboxStopped(
                where="host",
                outcome=outcome,
                exit_code=code,
                duration_ms=int((time.monotonic() - started) * 1000),
            )
        )
    return code if code >= 0 else 128 - code


async def _pump(source: asyncio.StreamReader, sink: BinaryIO) -> None:
    while chunk := await source.read(65536):
        sink.write(chunk)
        sink.flush()


async def _stop_process(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), timeout=5)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def run_sync(
    request: RunRequest,
    *,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    errors: TextIO | None = None,
    connector: Callable[[], ContainerRuntime] = connect,
) -> int:
    """Run ``request`` in a fresh event loop. SIGTERM and Ctrl-C cancel the run (so its
    teardown runs) and give 143 and 130."""
    terminated = False

    async def main() -> int:
        nonlocal terminated
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            if task is not None:
                task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await run_command(
                request,
                stdout=stdout or sys.stdout.buffer,
                stderr=stderr or sys.stderr.buffer,
                errors=errors or sys.stderr,
                connector=connector,
            )
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if terminated:
            return EXIT_SIGTERM
        raise
    except KeyboardInterrupt:
        return EXIT_SIGINT

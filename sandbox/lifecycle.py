"""One run's sandbox, start to teardown: ``Sandbox`` (an async context manager).

Start, in this order (each step's undo is registered before the next step runs):

1. spec safety (``check_spec_safety``) and the image (the default one is built if
   missing; any other must exist);
2. the per-run network ``netwarden-<key>`` on bridge ``nw-<key>``: ``--internal`` when a
   proxy is the way out, a plain NAT'd bridge for ``mode: open`` policies;
3. the proxy, bound to the network's gateway IP (``ProxyStarter``, supplied by the
   gateway: this package never imports it);
4. the firewall lockdown (``firewall.Lockdown``) so that proxy port is the ONLY thing the
   bridge reaches; when the firewall cannot be changed, ``enforce=True`` raises
   ``EnforcementUnavailable`` and ``enforce=False`` continues with ``egress`` set to
   ``Egress.UNENFORCED`` for the caller to report loudly;
5. ONE container: ``sleep infinity`` under ``--init`` (so removal is instant), hardened
   (no capabilities, no-new-privileges, uid 1000, read-only root, tmpfs /tmp and
   /workspace, pids/memory/cpu limits, IPv6 off), ``host.docker.internal`` pointing at
   the gateway IP, a bind-mounted ``resolv.conf`` of ``nameserver 127.0.0.1`` so DNS
   fails in milliseconds instead of hanging ~20 s, and the proxy variables.

Teardown (``__aexit__``, also after a failed start) removes the container, the firewall
rules, the network and the temp dir, each attempted even if another fails; it runs
synchronously so a second cancellation cannot interrupt it halfway. Whatever it could not
remove is in ``teardown_errors`` and left for the reaper (labels carry the owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final, Protocol, TypeVar

from policy.errors import EnforcementUnavailable, SpecInvalid

from . import firewall
from .image import DEFAULT_IMAGE
from .names import (
    LABEL_CREATED,
    LABEL_HOST,
    LABEL_KEY,
    LABEL_OWNER,
    LABEL_RUN,
    RUN_ID_PATTERN,
    bridge_name,
    container_name,
    network_name,
    run_key,
)
from .owner import Owner, current_owner
from .runtime import ContainerRuntime
from .spec import NetworkMode, SandboxSpec, check_spec_safety

__all__ = ["PROXY_HOSTNAME", "Egress", "ProxyEndpoint", "ProxyStarter", "Sandbox", "proxy_env"]

PROXY_HOSTNAME: Final = "host.docker.internal"
_T = TypeVar("_T")
_NO_PROXY: Final = "localhost,127.0.0.1,::1"


class Egress(StrEnum):
    ENFORCED = "enforced"  # the proxy port is the only way out
    UNENFORCED = "unenforced"  # proxy env set, but the firewall could not be installed
    OPEN = "open"  # policy mode open: no proxy, NAT'd egress
    NONE = "none"  # no network at all


@dataclass(frozen=True, slots=True)
class ProxyEndpoint:
    """Where the run's proxy listens. ``listener_ports``: other per-run listeners on the
    same bind (MCP ask-user, board) that the sandbox may reach too; nothing else is."""

    port: int
    url: str = field(repr=False)  # carries the run's proxy credentials
    listener_ports: tuple[int, ...] = ()


class ProxyStarter(Protocol):
    """Start the run's proxy listening on ``bind_host`` (port chosen by the OS) and
    return its port and the URL a client reaches it by through ``advertise_host``.
    Stopping it is the caller's business (the gateway's run orchestration)."""

    def __call__(self, bind_host: str, advertise_host: str) -> Awaitable[ProxyEndpoint]: ...


def proxy_env(url: str) -> dict[str, str]:
    """The variables every HTTP client looks for, upper- and lowercase. NO_PROXY holds
    only the sandbox's own loopback: never the proxy's address, never a wildcard."""
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": _NO_PROXY,
        "no_proxy": _NO_PROXY,
    }


def _owner_opts(user: str) -> str:
    """tmpfs ``uid=,gid=`` so the sandbox user owns its workspace (1000 for a user name)."""
    uid, _, gid = user.partition(":")
    uid = uid if uid.isdigit() else "1000"
    gid = gid if gid.isdigit() else uid
    return f"uid={uid},gid={gid}"


class Sandbox:
    """See the module docstring. ``proxy=None`` means no proxy (``mode: open``)."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        run_id: str,
        runtime: ContainerRuntime,
        proxy: ProxyStarter | None,
        enforce: bool = True,
        owner: Owner | None = None,
        home: Path | None = None,
    ) -> None:
        if not RUN_ID_PATTERN.match(run_id):
            raise SpecInvalid(
                f"run id {run_id!r} must be 1-64 letters, digits, '_', '.' or '-' "
                "starting with a letter or digit"
            )
        self.spec = spec
        self.run_id = run_id
        self.key = run_key(run_id)
        self._runtime = runtime
        self._proxy = proxy
        self._enforce = enforce
        self._owner = owner or current_owner()
        self._home = home
        self.egress = Egress.NONE
        self.unenforced_reason: str | None = None
        self.network: str | None = None
        self.gateway_ip: str | None = None
        self.container_id: str | None = None
        self.proxy_port: int | None = None
        self.teardown_errors: list[str] = []
        self._lockdown: firewall.Lockdown | None = None
        self._tmpdir: Path | None = None
        self._started = 0.0
        self._network_attempted: str | None = None
        self._container_attempted: str | None = None

    def __repr__(self) -> str:
        return f"Sandbox(run_id={self.run_id!r}, egress={self.egress.value})"

    @property
    def labels(self) -> dict[str, str]:
        return {
            LABEL_RUN: self.run_id,
            LABEL_KEY: self.key,
            LABEL_OWNER: self._owner.tag,
            LABEL_HOST: self._owner.host,
            LABEL_CREATED: str(int(time.time())),
        }

    async def __aenter__(self) -> Sandbox:
        self._started = time.monotonic()
        try:
            await self._start()
        except BaseException:
            self._teardown()
            raise
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._teardown()

    async def _start(self) -> None:
        spec, runtime = self.spec, self._runtime
        check_spec_safety(spec, home=self._home)
        if not await asyncio.to_thread(runtime.image_present, spec.image):
            if spec.image != DEFAULT_IMAGE:
                raise SpecInvalid(
                    f"image {spec.image!r} is not present locally and nothing can be pulled "
                    f"here; build it, or use the default ({DEFAULT_IMAGE})"
                )
            await asyncio.to_thread(runtime.build_base_image, DEFAULT_IMAGE)

        env = dict(spec.env)
        run_kwargs: dict[str, object] = {}
        if spec.network is NetworkMode.NONE:
            run_kwargs["network_mode"] = "none"
        else:
            if self._proxy is not None:
                problem = await asyncio.to_thread(firewall.probe_privilege)
                if problem is not None:
                    if self._enforce:
                        raise EnforcementUnavailable(
                            f"--sandbox docker cannot confine egress: {problem}; or use "
                            "--sandbox auto to run unconfined with a loud warning"
                        )
                    self.unenforced_reason = problem
            name = network_name(self.key)
            self._network_attempted = name
            _, gateway = await self._step(
                runtime.create_network,
                name,
                bridge=bridge_name(self.key),
                internal=self._proxy is not None,
                labels=self.labels,
            )
            self.network, self.gateway_ip = name, gateway
            run_kwargs["network"] = name
            run_kwargs["extra_hosts"] = {PROXY_HOSTNAME: gateway}
            if self._proxy is None:
                self.egress = Egress.OPEN
            else:
                endpoint = await self._proxy(gateway, PROXY_HOSTNAME)
                self.proxy_port = endpoint.port
                env.update(proxy_env(endpoint.url))
                if self.unenforced_reason is None:
                    self._lockdown = firewall.Lockdown(
                        key=self.key,
                        run_id=self.run_id,
                        owner_tag=self._owner.tag,
                        bridge=bridge_name(self.key),
                        gateway_ip=gateway,
                        proxy_port=endpoint.port,
                        listener_ports=endpoint.listener_ports,
                    )
                    await self._step(self._lockdown.install)
                    self.egress = Egress.ENFORCED
                else:
                    self.egress = Egress.UNENFORCED

        volumes = await self._step(self._prepare_volumes)
        self._container_attempted = container_name(self.key)
        self.container_id = await self._step(
            runtime.run_container,
            image=spec.image,
            command=["sleep", "infinity"],
            name=container_name(self.key),
            init=True,
            user=spec.user,
            working_dir=spec.workdir,
            environment=env,
            labels=self.labels,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={  # the container's own /tmp, a private tmpfs
                "/tmp": f"rw,nosuid,nodev,size={spec.tmp_size},mode=1777",  # noqa: S108
                spec.workdir: f"rw,nosuid,nodev,size={spec.workspace_size},{_owner_opts(spec.user)}"
                ",mode=0755",
            },
            pids_limit=spec.pids_limit,
            mem_limit=spec.memory,
            nano_cpus=int(spec.cpus * 1_000_000_000),
            volumes=volumes,
            sysctls=(
                {"net.ipv6.conf.all.disable_ipv6": "1"}
                if spec.network is NetworkMode.PROXY
                else None
            ),
            **run_kwargs,
        )

    async def _step(self, fn: Callable[..., _T], /, *args: object, **kwargs: object) -> _T:
        """Run a blocking step that creates something, in a thread, to completion.

        Cancelling ``to_thread`` would leave the step running unseen and its resource
        (a network, a container, rules) created after teardown looked for it. So a
        cancelled step is still awaited before the cancellation goes on; teardown then
        finds the resource by its deterministic name.
        """
        future = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(fn, *args, **kwargs)
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await future
            raise

    def _prepare_volumes(self) -> dict[str, dict[str, str]]:
        self._tmpdir = Path(tempfile.mkdtemp(prefix=f"netwarden-{self.key}-"))
        self._tmpdir.chmod(0o755)  # the container's uid 1000 must read resolv.conf
        resolv = self._tmpdir / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\n")
        resolv.chmod(0o644)
        volumes = {str(resolv): {"bind": "/etc/resolv.conf", "mode": "ro"}}
        for mount in self.spec.mounts:
            # the same resolution check_spec_safety judged
            source = str(Path(mount.source).expanduser().resolve(strict=False))
            volumes[source] = {"bind": mount.target, "mode": "ro" if mount.read_only else "rw"}
        return volumes

    async def exec(
        self,
        argv: list[str],
        *,
        stdout: BinaryIO,
        stderr: BinaryIO,
    ) -> int:
        """Run ``argv`` in the sandbox, streaming its output; its exit code."""
        if self.container_id is None:
            raise RuntimeError("Sandbox.exec before the sandbox started")
        container = self.container_id

        def write(stream: BinaryIO) -> Callable[[bytes], None]:
            def _write(chunk: bytes) -> None:
                stream.write(chunk)
                stream.flush()

            return _write

        return await asyncio.to_thread(
            self._runtime.exec_stream,
            container,
            argv,
            on_stdout=write(stdout),
            on_stderr=write(stderr),
            workdir=self.spec.workdir,
            user=self.spec.user,
        )

    @property
    def duration_ms(self) -> int:
        return int((time.monotonic() - self._started) * 1000)

    def _teardown(self) -> None:
        steps: list[tuple[str, Callable[[], object]]] = []
        container = self.container_id or self._container_attempted
        if container is not None:
            steps.append(("container", lambda: self._runtime.remove_container(container)))
        steps.append(("firewall", lambda: firewall.reap_firewall(only_keys={self.key})))
        network = self.network or self._network_attempted
        if network is not None:
            steps.append(("network", lambda: self._runtime.remove_network(network)))
        if self._tmpdir is not None:
            tmpdir = self._tmpdir
            steps.append(("tempdir", lambda: shutil.rmtree(tmpdir, ignore_errors=True)))
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # every step is attempted; the reaper gets the rest
                self.teardown_errors.append(f"{what}: {exc}")
        self.container_id = self._container_attempted = None
        self.network = self._network_attempted = None
        self._tmpdir = None
        self._lockdown = None

"""The container engine seam: ``ContainerRuntime`` (Protocol) and its docker implementation.

This is the only module that imports ``docker``. The SDK is synchronous (DOCKER.md):
callers in asyncio code reach it through ``asyncio.to_thread``. Engine errors are
wrapped at this boundary into ``DockerUnavailable`` with the engine's own words and
what to do.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import docker
import docker.errors
import requests.exceptions

from policy.errors import DockerUnavailable

from .image import DEFAULT_IMAGE, build_rootfs_tar, find_busybox

__all__ = ["ContainerRuntime", "DockerRuntime", "EngineInfo", "Resource", "connect"]


@dataclass(frozen=True, slots=True)
class EngineInfo:
    version: str
    api_version: str


@dataclass(frozen=True, slots=True)
class Resource:
    """A labelled container or network, as the reaper sees it."""

    kind: str  # "container" | "network"
    id: str
    name: str
    labels: Mapping[str, str]


class ContainerRuntime(Protocol):
    """What the sandbox lifecycle, reaper and doctor need from an engine."""

    def info(self) -> EngineInfo: ...
    def image_present(self, image: str) -> bool: ...
    def build_base_image(self, image: str = DEFAULT_IMAGE) -> str: ...
    def create_network(
        self, name: str, *, bridge: str, internal: bool, labels: Mapping[str, str]
    ) -> tuple[str, str]: ...
    def remove_network(self, name: str) -> None: ...
    def run_container(self, **kwargs: Any) -> str: ...
    def exec_stream(
        self,
        container: str,
        argv: list[str],
        *,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None],
        workdir: str | None = None,
        user: str | None = None,
    ) -> int: ...
    def remove_container(self, container: str) -> None: ...
    def list_labelled(self, label: str) -> list[Resource]: ...


def connect(timeout: float = 10.0) -> DockerRuntime:
    """A runtime on the engine ``DOCKER_HOST`` (or the default socket) names, once it answers.

    The API version is asked for with the oldest version the SDK speaks (1.24) from a
    client we close ourselves: ``version="auto"`` asks inside the SDK's constructor and
    leaks that client's socket when no engine answers.
    """
    _preflight_unix_socket(timeout)
    probe: docker.DockerClient | None = None
    try:
        probe = docker.from_env(version="1.24", timeout=int(timeout))
        api_version = str(probe.version().get("ApiVersion") or "1.24")
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise DockerUnavailable(
            f"no docker engine answers ({_short(exc)}); start one (scripts/ensure-docker), "
            "fix DOCKER_HOST, or run with --sandbox none"
        ) from exc
    finally:
        if probe is not None:
            probe.close()
    return DockerRuntime(docker.from_env(version=api_version, timeout=int(timeout)))


def _preflight_unix_socket(timeout: float) -> None:
    """Connect to a unix-socket engine address once with a socket we close ourselves.

    docker's unix transport does not close its socket when connect fails (a
    ResourceWarning per attempt, an fd leak in a long-lived process), so the common
    "no engine here" case is answered before the SDK is involved.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return
    path = host.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(path)
        except OSError as exc:
            raise DockerUnavailable(
                f"no docker engine answers at {host} ({exc.strerror or exc}); start one "
                "(scripts/ensure-docker), fix DOCKER_HOST, or run with --sandbox none"
            ) from exc


class DockerRuntime:
    def __init__(self, client: docker.DockerClient) -> None:
        self._client = client
        self._api = client.api

    def close(self) -> None:
        self._client.close()

    def info(self) -> EngineInfo:
        with _engine("read the engine version"):
            version = self._client.version()
        return EngineInfo(version=str(version.get("Version")), api_version=self._api.api_version)

    def image_present(self, image: str) -> bool:
        with _engine(f"look up image {image}"):
            try:
                self._client.images.get(image)
            except docker.errors.ImageNotFound:
                return False
        return True

    def build_base_image(self, image: str = DEFAULT_IMAGE) -> str:
        repository, _, tag = image.rpartition(":")
        if not repository:
            repository, tag = image, "latest"
        data = build_rootfs_tar(find_busybox())
        with _engine(f"import image {image}"):
            self._api.import_image_from_data(data, repository=repository, tag=tag)
            return str(self._client.images.get(image).id)

    def create_network(
        self, name: str, *, bridge: str, internal: bool, labels: Mapping[str, str]
    ) -> tuple[str, str]:
        """Create a bridge network named ``name`` on Linux bridge ``bridge``.

        Returns (network id, gateway IP). Docker creates the bridge device with the
        gateway address at once, so a listener can bind there before any container runs.
        """
        with _engine(f"create network {name}"):
            net = self._client.networks.create(
                name,
                driver="bridge",
                internal=internal,
                enable_ipv6=False,
                options={"com.docker.network.bridge.name": bridge},
                labels=dict(labels),
            )
            net.reload()
            configs = (net.attrs.get("IPAM") or {}).get("Config") or []
        gateways = [c["Gateway"] for c in configs if c.get("Gateway") and ":" not in c["Gateway"]]
        if not gateways:
            self.remove_network(name)
            raise DockerUnavailable(
                f"network {name} got no IPv4 gateway from the engine; check the engine's "
                "default-address-pools"
            )
        return str(net.id), gateways[0]

    def remove_network(self, name: str) -> None:
        with _engine(f"remove network {name}"):
            try:
                self._client.networks.get(name).remove()
            except docker.errors.NotFound:
                return

    def run_container(self, **kwargs: Any) -> str:
        image = kwargs.get("image", "?")
        with _engine(f"start a container from {image}"):
            container = self._client.containers.run(detach=True, **kwargs)
            return str(container.id)

    def exec_stream(
        self,
        container: str,
        argv: list[str],
        *,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None],
        workdir: str | None = None,
        user: str | None = None,
    ) -> int:
        """Run ``argv`` in ``container``, feeding its output as it comes; its exit code.

        -1 when the engine reports none (the container was removed mid-exec).
        """
        with _engine("exec in the sandbox"):
            created = self._api.exec_create(
                container, argv, stdout=True, stderr=True, workdir=workdir, user=user or ""
            )
            # a docker CancellableStream: close() releases the engine connection
            stream = self._api.exec_start(created["Id"], stream=True, demux=True)
            try:
                frames: Iterator[tuple[bytes | None, bytes | None]] = stream
                for out, err in frames:
                    if out:
                        on_stdout(out)
                    if err:
                        on_stderr(err)
            except (requests.exceptions.RequestException, OSError):
                return -1
            finally:
                _close_stream(stream)
            code = self._api.exec_inspect(created["Id"]).get("ExitCode")
        return int(code) if code is not None else -1

    def remove_container(self, container: str) -> None:
        with _engine(f"remove container {container[:12]}"):
            try:
                self._api.remove_container(container, force=True, v=True)
            except docker.errors.NotFound:
                return

    def list_labelled(self, label: str) -> list[Resource]:
        with _engine("list netwarden resources"):
            containers = self._api.containers(all=True, filters={"label": label})
            networks = self._api.networks(filters={"label": label})
        found = [
            Resource("container", c["Id"], (c.get("Names") or ["?"])[0], c.get("Labels") or {})
            for c in containers
        ]
        found += [
            Resource("network", n["Id"], n.get("Name", "?"), n.get("Labels") or {})
            for n in networks
        ]
        return found


class _engine:  # lowercase: reads as a context manager, like contextlib's
    """Wrap engine errors into DockerUnavailable naming what we were doing."""

    def __init__(self, doing: str) -> None:
        self.doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if isinstance(exc, docker.errors.NotFound):
            return  # let callers that expect it handle it
        if isinstance(exc, docker.errors.DockerException | requests.exceptions.RequestException):
            raise DockerUnavailable(f"docker could not {self.doing}: {_short(exc)}") from exc


def _close_stream(stream: Any) -> None:
    """Release an exec stream's engine connection for good.

    docker's ``CancellableStream.close`` does nothing once urllib3 saw the end of the
    response, and the unix socket under it stays open (a ResourceWarning per exec, an
    fd per exec in a long run): close the socket objects themselves too.
    """
    response = getattr(stream, "_response", None)
    fp = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    socket_io = getattr(fp, "raw", None)
    sock = getattr(socket_io, "_sock", None)
    for thing in (stream, socket_io, sock, response):
        close = getattr(thing, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]

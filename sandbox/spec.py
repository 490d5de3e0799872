"""What a sandbox is made of, validated at the edge: ``SandboxSpec`` and its safety checks.

Two layers, both run before every start and by ``netwarden doctor``:

* ``load_spec(data)`` validates the shape (pydantic, ``extra="forbid"``, frozen) and the
  strings that reach docker: image, user, workdir and mount paths may hold no control
  characters and may not start with ``-`` (an argument-injection shape); env names may
  hold neither ``=`` nor control characters; netwarden's own proxy variables cannot be
  overridden; the user may not be root.
* ``check_spec_safety(spec, home=...)`` resolves each bind-mount source (``~``, ``..``
  and symlinks) and refuses sources that would hand the sandbox the host: the docker,
  podman and containerd sockets, ``/``, ``/proc``, ``/sys``, ``/etc``, ``/root``,
  ``/boot``, and credential paths under the home directory — the path itself, anything
  inside it, or any directory containing it (mounting ``~`` exposes ``~/.ssh``).

Every refusal is a ``SpecInvalid`` whose message names the field, the value and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from policy.errors import SpecInvalid, escape_control

from .image import DEFAULT_IMAGE

__all__ = [
    "PROXY_ENV_NAMES",
    "Mount",
    "NetworkMode",
    "SandboxSpec",
    "check_spec_safety",
    "load_spec",
]

PROXY_ENV_NAMES: Final = frozenset(
    {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"}
    | {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
)
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_ROOT_USERS: Final = frozenset({"0", "root", "0:0", "root:root", "root:0", "0:root"})

# Paths whose bind-mount would hand the sandbox the host or its container engine.
_ENGINE_SOCKETS: Final = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/podman/podman.sock",
    "/var/run/podman/podman.sock",
    "/run/containerd/containerd.sock",
)
_SYSTEM_DIRS: Final = ("/proc", "/sys", "/etc", "/root", "/boot")
_HOME_CREDENTIALS: Final = (
    ".ssh",
    ".aws",
    ".docker",
    ".kube",
    ".gnupg",
    ".config/gcloud",
    ".azure",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".gitconfig",
)
_SOCKET_NAMES: Final = frozenset({"docker.sock", "podman.sock", "containerd.sock"})
_FORBIDDEN_TARGETS: Final = ("/proc", "/sys", "/dev")
_PINNED_TARGETS: Final = ("/etc/resolv.conf", "/etc/hosts")


class NetworkMode(StrEnum):
    """``proxy``: the run's only way out is the netwarden proxy. ``none``: no network at all."""

    PROXY = "proxy"
    NONE = "none"


def _check_arg(field: str, value: str) -> str:
    if not value:
        raise ValueError(f"{field} is empty; give a value")
    if _CONTROL.search(value):
        raise ValueError(f"{field} {_show(value)} contains a control character; remove it")
    if value.startswith("-"):
        raise ValueError(
            f"{field} {_show(value)} starts with '-', which a command line reads as an option; "
            "remove the leading '-'"
        )
    return value


class Mount(BaseModel):
    """A host path bound into the sandbox (read-only unless ``read_only`` is false)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    target: str
    read_only: bool = True

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _check_arg("mount source", value)

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        _check_arg("mount target", value)
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(
                f"mount target {_show(value)} must be an absolute path without '..'; "
                "write e.g. /workspace/data"
            )
        if str(path) == "/" or any(_within(path, PurePosixPath(t)) for t in _FORBIDDEN_TARGETS):
            raise ValueError(
                f"mount target {_show(value)} would cover /, /proc, /sys or /dev; "
                "mount under /workspace instead"
            )
        if str(path) in _PINNED_TARGETS:
            raise ValueError(
                f"mount target {_show(value)} is set by netwarden to confine DNS and the "
                "proxy address; mount elsewhere"
            )
        return value


class SandboxSpec(BaseModel):
    """One run's container. Defaults are the hardened ones (DOCKER.md "Running")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = DEFAULT_IMAGE
    user: str = "1000:1000"
    workdir: str = "/workspace"
    env: Mapping[str, str] = Field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    network: NetworkMode = NetworkMode.PROXY
    memory: str = "512m"
    pids_limit: int = Field(default=256, ge=16, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=64)
    tmp_size: str = "64m"
    workspace_size: str = "256m"

    @field_validator("image", "workdir")
    @classmethod
    def _strings(cls, value: str, info: Any) -> str:
        return _check_arg(info.field_name, value)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        _check_arg("user", value)
        if value.strip() in _ROOT_USERS:
            raise ValueError(
                f"user {_show(value)} is root; the sandbox runs unprivileged: use 1000:1000"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir {_show(value)} must be absolute; write e.g. /workspace")
        return value

    @field_validator("memory", "tmp_size", "workspace_size")
    @classmethod
    def _size(cls, value: str, info: Any) -> str:
        if not re.fullmatch(r"[1-9][0-9]*[kmg]?", value):
            raise ValueError(f"{info.field_name} {_show(value)} is not a size; write e.g. 512m")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: Mapping[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not name or "=" in name or _CONTROL.search(name):
                raise ValueError(
                    f"env name {_show(name)} is empty or contains '=' or a control "
                    "character; use a name like MY_VAR"
                )
            if name in PROXY_ENV_NAMES:
                raise ValueError(
                    f"env {name} is set by netwarden to route egress through its proxy; "
                    "remove it from the spec"
                )
            if "\x00" in text:
                raise ValueError(f"env {name} value contains a NUL byte; remove it")
        return dict(value)


def load_spec(data: Mapping[str, Any] | None = None, **overrides: Any) -> SandboxSpec:
    """Validate ``data`` (plus keyword overrides) into a spec, or raise ``SpecInvalid``."""
    merged = {**(data or {}), **overrides}
    try:
        return SandboxSpec.model_validate(merged)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            text = error["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {text}" if where else text)
        raise SpecInvalid("sandbox spec invalid: " + "; ".join(problems)) from exc


def check_spec_safety(spec: SandboxSpec, *, home: Path | None = None) -> None:
    """Refuse mounts that would expose the host (module docstring). Raises ``SpecInvalid``."""
    home_dir = (home or Path.home()).resolve()
    forbidden: list[tuple[Path, str]] = [
        *((Path(p), "a container engine socket") for p in _ENGINE_SOCKETS),
        *((Path(p), f"the host's {p}") for p in _SYSTEM_DIRS),
        *((home_dir / c, f"credentials (~/{c})") for c in _HOME_CREDENTIALS),
    ]
    for index, mount in enumerate(spec.mounts):
        where = f"mounts[{index}].source {_show(mount.source)}"
        raw = Path(mount.source).expanduser()
        # The lexical form first (so /proc/1/root is refused before anything reads it),
        # then the resolved one (symlinks and ".."); a path that cannot be resolved is
        # refused too: we would not know what it names.
        _refuse_forbidden(where, Path(os.path.normpath(raw.absolute())), mount.source, forbidden)
        try:
            source = raw.resolve(strict=False)
        except (OSError, RuntimeError) as exc:
            raise SpecInvalid(
                f"{where} cannot be resolved ({exc.__class__.__name__}); mount a plain "
                "project directory"
            ) from exc
        _refuse_forbidden(where, source, mount.source, forbidden)


def _refuse_forbidden(
    where: str, source: Path, given: str, forbidden: list[tuple[Path, str]]
) -> None:
    shown = f" (resolves to {source})" if str(source) != given else ""
    if source == Path("/"):
        raise SpecInvalid(f"{where}{shown} is the host's root; mount a project directory")
    if source.name in _SOCKET_NAMES:
        raise SpecInvalid(
            f"{where}{shown} is a container engine socket, which is root on the host; "
            "remove the mount"
        )
    for path, what in forbidden:
        bad = Path(os.path.normpath(path))
        for candidate in {bad, _resolved(bad)}:
            if source == candidate or _within(source, candidate):
                raise SpecInvalid(
                    f"{where}{shown} exposes {what}; remove the mount or mount a project "
                    "directory instead"
                )
            if _within(candidate, source):
                raise SpecInvalid(
                    f"{where}{shown} contains {what}; mount a narrower project directory"
                )


def _resolved(path: Path) -> Path:
    try:
        return path.resolve(strict=False)
    except (OSError, RuntimeError):
        return path


def _within(path: PurePosixPath | Path, parent: PurePosixPath | Path) -> bool:
    """True if ``path`` is strictly inside ``parent``."""
    return path != parent and path.is_relative_to(parent)


def _show(value: str) -> str:
    escaped = escape_control(value).replace('"', '\\"')
    return f'"{escaped[:120]}"'

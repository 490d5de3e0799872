"""Spec safety: every refusal names what and how to fix it (messages pinned)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policy.errors import SpecInvalid
from sandbox.spec import SandboxSpec, check_spec_safety, load_spec


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "project").mkdir()
    (home / "sneaky").symlink_to(home / ".ssh")
    (home / "project" / "up").symlink_to(home)
    return home


def _mount(source: str, target: str = "/workspace/m") -> dict[str, Any]:
    return {"mounts": [{"source": source, "target": target}]}


# (id, source relative to "~" = the fixture home unless absolute, expected message tail)
MOUNT_REFUSALS = [
    ("docker-socket", "/var/run/docker.sock", "is a container engine socket, which is root on the host; remove the mount"),
    ("docker-socket-dir", "/run", "contains a container engine socket; mount a narrower project directory"),
    ("podman-socket", "/run/podman/podman.sock", "is a container engine socket, which is root on the host; remove the mount"),
    ("proc", "/proc", "exposes the host's /proc; remove the mount or mount a project directory instead"),
    ("proc-child", "/proc/1/root", "exposes the host's /proc; remove the mount or mount a project directory instead"),
    ("sys", "/sys/fs", "exposes the host's /sys; remove the mount or mount a project directory instead"),
    ("root-fs", "/", "is the host's root; mount a project directory"),
    ("root-fs-dotdot", "/tmp/../", "is the host's root; mount a project directory"),
    ("etc", "/etc", "exposes the host's /etc; remove the mount or mount a project directory instead"),
    ("etc-dotdot", "/tmp/../etc/shadow", "exposes the host's /etc; remove the mount or mount a project directory instead"),
    ("root-home", "/root", "exposes the host's /root; remove the mount or mount a project directory instead"),
    ("boot", "/boot", "exposes the host's /boot; remove the mount or mount a project directory instead"),
    ("ssh", "~/.ssh", "exposes credentials (~/.ssh); remove the mount or mount a project directory instead"),
    ("ssh-key", "~/.ssh/id_ed25519", "exposes credentials (~/.ssh); remove the mount or mount a project directory instead"),
    ("ssh-via-symlink", "~/sneaky", "exposes credentials (~/.ssh); remove the mount or mount a project directory instead"),
    ("home-via-symlink", "~/project/up", "contains credentials (~/.ssh); mount a narrower project directory"),
    ("home-itself", "~", "contains credentials (~/.ssh); mount a narrower project directory"),
    ("aws", "~/.aws", "exposes credentials (~/.aws); remove the mount or mount a project directory instead"),
    ("docker-config", "~/.docker/config.json", "exposes credentials (~/.docker); remove the mount or mount a project directory instead"),
    ("kube", "~/.kube", "exposes credentials (~/.kube); remove the mount or mount a project directory instead"),
    ("gnupg", "~/.gnupg", "exposes credentials (~/.gnupg); remove the mount or mount a project directory instead"),
    ("gcloud", "~/.config/gcloud", "exposes credentials (~/.config/gcloud); remove the mount or mount a project directory instead"),
    ("azure", "~/.azure", "exposes credentials (~/.azure); remove the mount or mount a project directory instead"),
    ("netrc", "~/.netrc", "exposes credentials (~/.netrc); remove the mount or mount a project directory instead"),
    ("npmrc", "~/.npmrc", "exposes credentials (~/.npmrc); remove the mount or mount a project directory instead"),
    ("pypirc", "~/.pypirc", "exposes credentials (~/.pypirc); remove the mount or mount a project directory instead"),
    ("gitconfig", "~/.gitconfig", "exposes credentials (~/.gitconfig); remove the mount or mount a project directory instead"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "tail"), [r[1:] for r in MOUNT_REFUSALS], ids=[r[0] for r in MOUNT_REFUSALS]
)
def test_mount_refused(home: Path, source: str, tail: str) -> None:
    real = str(home) + source[1:] if source.startswith("~") else source
    spec = load_spec(_mount(real))
    with pytest.raises(SpecInvalid) as caught:
        check_spec_safety(spec, home=home)
    message = str(caught.value)
    assert message.startswith(f'mounts[0].source "{real}"'), message
    assert message.endswith(tail), message


def test_project_mount_allowed(home: Path) -> None:
    spec = load_spec(_mount(str(home / "project")))
    check_spec_safety(spec, home=home)


SHAPE_REFUSALS = [
    ("image-control", {"image": "busybox\nrm"}, 'image: image "busybox\\nrm" contains a control character; remove it'),
    ("image-dash", {"image": "--privileged"}, "image: image \"--privileged\" starts with '-', which a command line reads as an option; remove the leading '-'"),
    ("user-dash", {"user": "-u0"}, "user: user \"-u0\" starts with '-', which a command line reads as an option; remove the leading '-'"),
    ("user-root", {"user": "0:0"}, 'user: user "0:0" is root; the sandbox runs unprivileged: use 1000:1000'),
    ("user-root-name", {"user": "root"}, 'user: user "root" is root; the sandbox runs unprivileged: use 1000:1000'),
    ("workdir-control", {"workdir": "/w\x00"}, 'workdir: workdir "/w\\x00" contains a control character; remove it'),
    ("workdir-relative", {"workdir": "w"}, 'workdir: workdir "w" must be absolute; write e.g. /workspace'),
    ("mount-source-dash", _mount("-v/:/host"), "mounts.0.source: mount source \"-v/:/host\" starts with '-', which a command line reads as an option; remove the leading '-'"),
    ("mount-target-control", _mount("/tmp/x", "/w\r"), 'mounts.0.target: mount target "/w\\r" contains a control character; remove it'),
    ("mount-target-proc", _mount("/tmp/x", "/proc/sys"), 'mounts.0.target: mount target "/proc/sys" would cover /, /proc, /sys or /dev; mount under /workspace instead'),
    ("mount-target-resolv", _mount("/tmp/x", "/etc/resolv.conf"), 'mounts.0.target: mount target "/etc/resolv.conf" is set by netwarden to confine DNS and the proxy address; mount elsewhere'),
    ("env-equals", {"env": {"A=B": "x"}}, "env: env name \"A=B\" is empty or contains '=' or a control character; use a name like MY_VAR"),
    ("env-control", {"env": {"A\nB": "x"}}, "env: env name \"A\\nB\" is empty or contains '=' or a control character; use a name like MY_VAR"),
    ("env-proxy", {"env": {"NO_PROXY": "*"}}, "env: env NO_PROXY is set by netwarden to route egress through its proxy; remove it from the spec"),
    ("unknown-field", {"privileged": True}, "privileged: Extra inputs are not permitted"),
    ("memory", {"memory": "lots"}, 'memory: memory "lots" is not a size; write e.g. 512m'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "message"), [r[1:] for r in SHAPE_REFUSALS], ids=[r[0] for r in SHAPE_REFUSALS]
)
def test_spec_shape_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecInvalid) as caught:
        load_spec(data)
    assert str(caught.value) == f"sandbox spec invalid: {message}"


def test_defaults_are_hardened() -> None:
    spec = SandboxSpec()
    assert spec.user == "1000:1000"
    assert spec.image == "netwarden/base:local"
    with pytest.raises(Exception, match="frozen"):
        spec.user = "0"  # type: ignore[misc]  # proving it is frozen

"""The local base image: busybox-static in a tiny rootfs, imported without any registry.

DOCKER.md "Images without a registry": no registry can be reached on these machines, so
the image is assembled from Debian's ``busybox-static`` binary: ``bin/busybox`` plus one
symlink per applet, an ``/etc/passwd`` with root and the uid-1000 ``agent`` user the
sandbox runs as, and empty ``/tmp`` and ``/workspace``; then ``docker import`` (about
0.5 s, 2 MB). Everything is built in memory as a tar stream.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Final

from policy.errors import OperatorError

__all__ = ["BUSYBOX_CANDIDATES", "DEFAULT_IMAGE", "build_rootfs_tar", "find_busybox"]

DEFAULT_IMAGE: Final = "netwarden/base:local"
BUSYBOX_CANDIDATES: Final = ("/bin/busybox", "/usr/bin/busybox")

# /etc/passwd lines: no password in them
_PASSWD: Final = (
    "root:x:0:0:root:/root:/bin/sh\n"  # noqa: S105
    "agent:x:1000:1000:netwarden agent:/workspace:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
_GROUP: Final = "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n"


def find_busybox() -> Path:
    """The host's static busybox, or an OperatorError saying how to get one."""
    for candidate in (shutil.which("busybox"), *BUSYBOX_CANDIDATES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise OperatorError(
        "no busybox binary found to build the sandbox image; "
        "install it with `apt-get install busybox-static`"
    )


def build_rootfs_tar(busybox: Path) -> bytes:
    """A tar of the rootfs described in the module docstring."""
    listing = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True, timeout=10
    )
    applets = sorted({name for name in listing.stdout.split() if name and "/" not in name})
    now = int(time.time())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add_dir(name: str, mode: int = 0o755, uid: int = 0) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            info.uid = info.gid = uid
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))

        for directory in ("bin", "etc", "root", "proc", "sys", "dev", "usr", "usr/bin", "sbin"):
            add_dir(directory, 0o700 if directory == "root" else 0o755)
        add_dir("tmp", 0o1777)
        add_dir("workspace", 0o755, uid=1000)
        add_file("bin/busybox", busybox.read_bytes(), 0o755)
        for applet in applets:
            if applet == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "busybox", now
            tar.addfile(link)
        add_file("etc/passwd", _PASSWD.encode())
        add_file("etc/group", _GROUP.encode())
        add_file("etc/hosts", b"127.0.0.1 localhost\n")
        add_file("etc/resolv.conf", b"nameserver 127.0.0.1\n")
    return buf.getvalue()

"""Who owns a run's resources, and whether that owner still lives.

Every container, network and firewall chain a run creates carries its owner as
``PID:STARTTIME`` plus the host name. ``STARTTIME`` is field 22 of ``/proc/PID/stat``
(clock ticks since boot), so a recycled pid is not mistaken for the original owner:
the owner is alive only if ``/proc/PID`` exists AND its start time is the recorded one.
Resources labelled with another host name are never judged (we cannot see its pids).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Final

__all__ = ["Owner", "current_owner", "owner_alive"]

_TAG: Final = re.compile(r"^(\d+):(\d+)$")


@dataclass(frozen=True, slots=True)
class Owner:
    pid: int
    start: int
    host: str

    @property
    def tag(self) -> str:
        return f"{self.pid}:{self.start}"


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the LAST ')'.
    rest = stat.rsplit(")", 1)[-1].split()
    try:
        return int(rest[19])  # field 22 overall; rest starts at field 3
    except (IndexError, ValueError):
        return None


def current_owner() -> Owner:
    pid = os.getpid()
    start = _start_time(pid)
    if start is None:
        raise RuntimeError("cannot read /proc/self/stat: netwarden needs Linux /proc")
    return Owner(pid=pid, start=start, host=socket.gethostname())


def owner_alive(tag: str | None, host: str | None = None) -> bool:
    """Whether the owner recorded as ``tag`` (``PID:STARTTIME``) still runs.

    A resource from another host counts as alive (not ours to judge); a malformed or
    missing tag counts as dead: it was not written by a live netwarden run.
    """
    if host is not None and host != socket.gethostname():
        return True
    match = _TAG.match(tag or "")
    if match is None:
        return False
    pid, start = int(match.group(1)), int(match.group(2))
    return _start_time(pid) == start

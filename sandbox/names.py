"""Names and labels of a run's resources, derived from its run id.

``run_key`` is 8 hex digits of SHA-256 of the run id: short enough for a bridge name
(``nw-<key>``, Linux allows 15 bytes) and an iptables chain (``NETWARDEN-<key>-IN``,
28 allowed), and free of whatever characters a run id holds.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = [
    "LABEL_CREATED",
    "LABEL_HOST",
    "LABEL_KEY",
    "LABEL_OWNER",
    "LABEL_RUN",
    "RUN_ID_PATTERN",
    "bridge_name",
    "container_name",
    "network_name",
    "run_key",
]

LABEL_RUN: Final = "netwarden.run-id"
LABEL_KEY: Final = "netwarden.key"
LABEL_OWNER: Final = "netwarden.pid"
LABEL_HOST: Final = "netwarden.host"
LABEL_CREATED: Final = "netwarden.created"

RUN_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def run_key(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


def bridge_name(key: str) -> str:
    return f"nw-{key}"


def container_name(key: str) -> str:
    return f"netwarden-{key}"


def network_name(key: str) -> str:
    return f"netwarden-{key}"

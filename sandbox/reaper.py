"""Remove what dead runs left behind: containers, networks, firewall rules.

A run that is SIGKILLed cannot tear down. Its resources carry labels (containers,
networks) or comments (firewall jumps and chain markers) naming the owner as
``PID:STARTTIME`` and the host; ``owner.owner_alive`` decides. A live run's resources,
and resources labelled with another host, are never touched. Runs on every
``netwarden run`` start and on ``netwarden sandbox reap``.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import firewall
from .names import LABEL_HOST, LABEL_KEY, LABEL_OWNER, LABEL_RUN
from .owner import owner_alive
from .runtime import ContainerRuntime

__all__ = ["ReapReport", "reap_orphans"]


@dataclass(slots=True)
class ReapReport:
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    firewall_keys: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def removed(self) -> int:
        return len(self.containers) + len(self.networks) + len(self.firewall_keys)


def _dead(tag: str | None) -> bool:
    return not owner_alive(tag)


def reap_orphans(runtime: ContainerRuntime | None, *, firewall_too: bool = True) -> ReapReport:
    """Remove every netwarden resource whose owning run is dead (module docstring)."""
    report = ReapReport()
    dead_keys: set[str] = set()
    if runtime is not None:
        resources = runtime.list_labelled(LABEL_RUN)
        # containers first: a network with a container attached cannot be removed
        for resource in sorted(resources, key=lambda r: r.kind != "container"):
            labels = resource.labels
            if owner_alive(labels.get(LABEL_OWNER), labels.get(LABEL_HOST)):
                continue
            try:
                if resource.kind == "container":
                    runtime.remove_container(resource.id)
                    report.containers.append(resource.name)
                else:
                    runtime.remove_network(resource.id)
                    report.networks.append(resource.name)
            except Exception as exc:  # keep reaping the rest; report what stayed
                report.errors.append(f"{resource.kind} {resource.name}: {exc}")
            if labels.get(LABEL_KEY):
                dead_keys.add(labels[LABEL_KEY])
    if firewall_too:
        try:
            report.firewall_keys = firewall.reap_firewall(is_dead=_dead)
        except Exception as exc:
            report.errors.append(f"firewall: {exc}")
    dead_keys |= set(report.firewall_keys)
    for key in dead_keys:
        for leftover in Path(tempfile.gettempdir()).glob(f"netwarden-{key}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
    return report

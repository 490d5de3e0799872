"""Host firewall rules that leave a run's bridge exactly one way out: the proxy port.

Mechanism (DOCKER.md "what confined a container completely"): the run's network is
``--internal`` (docker drops its forwarded traffic and gives it no NAT), but every host
address is still delivered to the host's INPUT chain from that bridge. So, for packets
arriving on the run's bridge, in a chain of the run's own:

    NETWARDEN-<key>-IN   (jumped to from INPUT for -i <bridge>)
      # marker comment naming the owner pid:start (the reaper reads it)
      ESTABLISHED,RELATED       ACCEPT
      tcp to GATEWAY:PROXY_PORT ACCEPT  (and the run's listener ports, if any)
      tcp                       REJECT tcp-reset        (connect fails at once)
      everything else           REJECT icmp-port-unreachable (DNS to the gateway too)
    NETWARDEN-<key>-FWD  (jumped to from DOCKER-USER for -i <bridge> and -o <bridge>)
      tcp REJECT tcp-reset, else REJECT   (other networks, other sandboxes, outside)
    ip6tables NETWARDEN-<key>-IN6 DROP  (from INPUT and FORWARD; link-local v6 reaches
      host services bound to [::] otherwise)

Every jump carries the comment ``netwarden key=<key> run=<run id> owner=<pid:start>``.
Install and removal are each ONE ``iptables-restore --noflush`` transaction, so a run
is never half-locked, and a concurrent reaper never sees a chain without its owner.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from policy.errors import EnforcementUnavailable

__all__ = [
    "Lockdown",
    "firewall_rules_for",
    "probe_privilege",
    "reap_firewall",
]

_CHAIN: Final = re.compile(r"^NETWARDEN-([0-9a-f]{8})-(IN|FWD|IN6)$")
_COMMENT: Final = re.compile(r"netwarden key=([0-9a-f]{8}) run=(\S+) owner=(\S+)")
_TIMEOUT: Final = 15


def _ipv6_present() -> bool:
    return Path("/proc/net/if_inet6").exists()


def _run(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=_TIMEOUT, check=False
    )


def probe_privilege() -> str | None:
    """None if this process can add and remove iptables rules, else why not (with a fix)."""
    for tool in ("iptables", "iptables-restore"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; install it with `apt-get install iptables`"
    # Creating and deleting a chain is the smallest real proof of the privilege we need.
    probe = "NETWARDEN-probe"
    batch = f"*filter\n:{probe} - [0:0]\n-X {probe}\nCOMMIT\n"
    done = _run(["iptables-restore", "--noflush", "-w", "5"], batch)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        return (
            f"cannot change the host firewall ({reason}); run netwarden as root or with "
            "CAP_NET_ADMIN"
        )
    return None


@dataclass(slots=True)
class Lockdown:
    """The firewall rules of one run (module docstring). ``install`` then ``remove``."""

    key: str
    run_id: str
    owner_tag: str
    bridge: str
    gateway_ip: str
    proxy_port: int
    listener_ports: tuple[int, ...] = ()
    installed: bool = field(default=False, init=False)

    @property
    def comment(self) -> str:
        return f"netwarden key={self.key} run={self.run_id} owner={self.owner_tag}"

    def _jumps4(self) -> list[str]:
        c, key, br = _q(self.comment), self.key, self.bridge
        return [
            f"INPUT -i {br} -m comment --comment {c} -j NETWARDEN-{key}-IN",
            f"{_forward_chain()} -i {br} -m comment --comment {c} -j NETWARDEN-{key}-FWD",
            f"{_forward_chain()} -o {br} -m comment --comment {c} -j NETWARDEN-{key}-FWD",
        ]

    def _jumps6(self) -> list[str]:
        c, key, br = _q(self.comment), self.key, self.bridge
        return [
            f"INPUT -i {br} -m comment --comment {c} -j NETWARDEN-{key}-IN6",
            f"FORWARD -i {br} -m comment --comment {c} -j NETWARDEN-{key}-IN6",
            f"FORWARD -o {br} -m comment --comment {c} -j NETWARDEN-{key}-IN6",
        ]

    def install(self) -> None:
        key, marker = self.key, f"-m comment --comment {_q(self.comment)}"
        inp, fwd = f"NETWARDEN-{key}-IN", f"NETWARDEN-{key}-FWD"
        v4 = [
            "*filter",
            f":{inp} - [0:0]",
            f":{fwd} - [0:0]",
            f"-A {inp} {marker}",
            f"-A {inp} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            *(
                f"-A {inp} -p tcp -d {self.gateway_ip}/32 --dport {port} -j ACCEPT"
                for port in (self.proxy_port, *self.listener_ports)
            ),
            f"-A {inp} -p tcp -j REJECT --reject-with tcp-reset",
            f"-A {inp} -j REJECT --reject-with icmp-port-unreachable",
            f"-A {fwd} {marker}",
            f"-A {fwd} -p tcp -j REJECT --reject-with tcp-reset",
            f"-A {fwd} -j REJECT --reject-with icmp-port-unreachable",
            *(f"-I {jump.split(' ', 1)[0]} 1 {jump.split(' ', 1)[1]}" for jump in self._jumps4()),
            "COMMIT",
        ]
        _apply("iptables-restore", v4, what=f"install the firewall of run {self.run_id}")
        self.installed = True
        if _ipv6_present():
            in6 = f"NETWARDEN-{key}-IN6"
            v6 = [
                "*filter",
                f":{in6} - [0:0]",
                f"-A {in6} {marker}",
                f"-A {in6} -j DROP",
                *(f"-I {j.split(' ', 1)[0]} 1 {j.split(' ', 1)[1]}" for j in self._jumps6()),
                "COMMIT",
            ]
            try:
                _apply("ip6tables-restore", v6, what=f"install the IPv6 firewall of {self.run_id}")
            except EnforcementUnavailable:
                self.remove()
                raise

    def remove(self) -> None:
        """Delete every rule and chain of this run (whatever of it exists)."""
        reap_firewall(only_keys={self.key})
        self.installed = False


def _forward_chain() -> str:
    # DOCKER-USER is evaluated first in FORWARD and docker never flushes it. Without it
    # (an engine started with iptables=false) FORWARD itself is the place.
    done = _run(["iptables", "-w", "5", "-S", "DOCKER-USER"])
    return "DOCKER-USER" if done.returncode == 0 else "FORWARD"


def _apply(tool: str, lines: Iterable[str], *, what: str) -> None:
    done = _run([tool, "--noflush", "-w", "5"], "\n".join(lines) + "\n")
    if done.returncode != 0:
        raise EnforcementUnavailable(
            f"could not {what}: {tool} failed: {done.stderr.strip()[:400]}; "
            "run `netwarden doctor` to check the firewall privilege"
        )


@dataclass(frozen=True, slots=True)
class _Rule:
    chain: str
    spec: list[str]  # the arguments after "-A CHAIN"


@dataclass(slots=True)
class _TableState:
    chains: set[str] = field(default_factory=set)
    rules: list[_Rule] = field(default_factory=list)


def _read_table(tool: str) -> _TableState | None:
    if shutil.which(tool) is None:
        return None
    done = _run([tool, "-w", "5", "-S"])
    if done.returncode != 0:
        return None
    state = _TableState()
    for line in done.stdout.splitlines():
        parts = shlex.split(line)
        if len(parts) >= 2 and parts[0] == "-N":
            state.chains.add(parts[1])
        elif len(parts) >= 3 and parts[0] == "-A":
            state.rules.append(_Rule(parts[1], parts[2:]))
    return state


def firewall_rules_for(key: str) -> list[str]:
    """Every iptables/ip6tables line that mentions run ``key`` (for tests and doctor)."""
    lines: list[str] = []
    for tool in ("iptables", "ip6tables"):
        state = _read_table(tool)
        if state is None:
            continue
        lines += [f"{tool}: -N {c}" for c in sorted(state.chains) if key in c]
        lines += [
            f"{tool}: -A {r.chain} {' '.join(r.spec)}"
            for r in state.rules
            if key in r.chain or key in " ".join(r.spec)
        ]
    return lines


def reap_firewall(
    *,
    only_keys: set[str] | None = None,
    is_dead: Callable[[str | None], bool] | None = None,
) -> list[str]:
    """Remove the rules and chains of the given run keys (or of every key whose owner
    ``is_dead``) in one transaction per table. Returns the keys removed."""
    removed: set[str] = set()
    for tool in ("iptables", "ip6tables"):
        state = _read_table(tool)
        if state is None:
            continue
        owners: dict[str, str | None] = {}
        for chain in state.chains:
            match = _CHAIN.match(chain)
            if match:
                owners.setdefault(match.group(1), None)
        for rule in state.rules:
            found = _COMMENT.search(" ".join(rule.spec))
            if found:
                owners[found.group(1)] = found.group(3)
        if only_keys is not None:
            doomed = {k for k in owners if k in only_keys}
        elif is_dead is not None:
            doomed = {k for k, tag in owners.items() if is_dead(tag)}
        else:
            doomed = set()
        if not doomed:
            continue
        batch = ["*filter"]
        for rule in state.rules:
            if _CHAIN.match(rule.chain):
                continue  # flushed with its chain below
            target = _target(rule.spec)
            found = _CHAIN.match(target or "")
            if found and found.group(1) in doomed:
                batch.append(f"-D {rule.chain} {' '.join(_q(a) for a in rule.spec)}")
        for chain in sorted(state.chains):
            found = _CHAIN.match(chain)
            if found and found.group(1) in doomed:
                batch += [f"-F {chain}", f"-X {chain}"]
        batch.append("COMMIT")
        _apply(tool.replace("tables", "tables-restore"), batch, what="remove netwarden rules")
        removed |= doomed
    return sorted(removed)


def _q(arg: str) -> str:
    """Quote for iptables-restore, which knows double quotes only. Comments are built
    from a validated run id and hex keys: no quote or backslash can occur in them."""
    return f'"{arg}"' if (" " in arg or not arg) else arg


def _target(spec: list[str]) -> str | None:
    for flag in ("-j", "-g"):
        if flag in spec:
            index = spec.index(flag)
            if index + 1 < len(spec):
                return spec[index + 1]
    return None

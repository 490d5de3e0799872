"""Compiled rule indexes: a decision looks up a few buckets instead of scanning.

Buckets hold rule indexes in ascending order: exact names, ``*.x`` keyed by the
suffix after the first label, ``**.x`` keyed by every proper suffix, ``**``, and
IP/CIDR rules keyed by (prefix length, network). ``last_match`` returns exactly
what a reverse scan of the rule list returns (tests/policy/test_properties.py
checks it against a naive reference on random rule lists).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

from policy.patterns import Kind, Rule

__all__ = ["Matcher"]

PortCheck = Callable[[int, int], bool]  # (rule index, port) -> whether the rule's ports admit port


class Matcher:
    __slots__ = ("_any", "_exact", "_multi", "_nets", "_one", "rules")

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self._exact: dict[str, list[int]] = {}
        self._one: dict[str, list[int]] = {}
        self._multi: dict[str, list[int]] = {}
        self._any: list[int] = []
        # version -> prefixlen -> network int -> indexes; prefix lengths longest first
        self._nets: dict[int, dict[int, dict[int, list[int]]]] = {4: {}, 6: {}}
        for index, rule in enumerate(self.rules):
            if rule.kind is Kind.EXACT:
                self._exact.setdefault(rule.value, []).append(index)
            elif rule.kind is Kind.ONE_LABEL:
                self._one.setdefault(rule.value, []).append(index)
            elif rule.kind is Kind.MULTI_LABEL:
                self._multi.setdefault(rule.value, []).append(index)
            elif rule.kind is Kind.ANY:
                self._any.append(index)
            else:
                assert rule.network is not None
                net = rule.network
                by_len = self._nets[net.version].setdefault(net.prefixlen, {})
                by_len.setdefault(int(net.network_address), []).append(index)
        for version, table in self._nets.items():
            self._nets[version] = dict(sorted(table.items(), reverse=True))

    def last_match(self, host: str, host_is_ip: bool, port: int, port_ok: PortCheck) -> int | None:
        """Index of the last rule matching ``host`` (canonical) on ``port``, or None."""
        best = -1
        if host_is_ip:
            best = self._best_net(ipaddress.ip_address(host), port, port_ok, best)
        else:
            best = _best(self._exact.get(host), port, port_ok, best)
            _, dot, rest = host.partition(".")
            if dot:
                best = _best(self._one.get(rest), port, port_ok, best)
                multi = self._multi
                while dot:
                    best = _best(multi.get(rest), port, port_ok, best)
                    _, dot, rest = rest.partition(".")
        best = _best(self._any, port, port_ok, best)
        return None if best < 0 else best

    def last_address_match(
        self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, port_ok: PortCheck
    ) -> int | None:
        """Index of the last IP/CIDR rule (not ``**``) covering ``address`` on ``port``."""
        best = self._best_net(address, port, port_ok, -1)
        return None if best < 0 else best

    def _best_net(
        self,
        address: ipaddress.IPv4Address | ipaddress.IPv6Address,
        port: int,
        port_ok: PortCheck,
        best: int,
    ) -> int:
        value = int(address)
        bits = address.max_prefixlen
        for prefixlen, networks in self._nets[address.version].items():
            key = (value >> (bits - prefixlen)) << (bits - prefixlen) if prefixlen else 0
            best = _best(networks.get(key), port, port_ok, best)
        return best


def _best(indexes: list[int] | None, port: int, port_ok: PortCheck, best: int) -> int:
    if not indexes or indexes[-1] <= best:
        return best
    for index in reversed(indexes):
        if index <= best:
            return best
        if port_ok(index, port):
            return index
    return best

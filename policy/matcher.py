"""Compiled rule indexes: a decision looks up a few buckets instead of scanning.

Buckets hold rule indexes in ascending order: exact names, ``*.x`` keyed by the
suffix after the first label, ``**.x`` keyed by every proper suffix, ``**``, and
IP/CIDR rules keyed by (prefix length, network). ``last_match`` returns exactly
what a reverse scan of the rule list returns (tests/policy/test_properties.py
checks it against a naive reference on random rule lists).

Ports are checked against an ``admit`` table chosen by the caller: for each rule,
None (any port) or the port ranges it admits, so the hot path calls no functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from policy.patterns import Kind, Rule

__all__ = ["Admit", "Matcher"]

# Per rule: None admits every port, else the (low, high) ranges admitted.
Admit = Sequence[tuple[tuple[int, int], ...] | None]
IPValue = tuple[int, int]  # (version, integer value)


class Matcher:
    __slots__ = ("_any", "_exact", "_multi", "_nets", "_one", "rules")

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self._exact: dict[str, list[int]] = {}
        self._one: dict[str, list[int]] = {}
        self._multi: dict[str, list[int]] = {}
        self._any: list[int] = []
        nets: dict[int, dict[int, dict[int, list[int]]]] = {4: {}, 6: {}}
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
                by_len = nets[net.version].setdefault(net.prefixlen, {})
                by_len.setdefault(int(net.network_address), []).append(index)
        # version -> [(bits to shift away, {network value >> shift: indexes})], longest first
        self._nets: dict[int, list[tuple[int, dict[int, list[int]]]]] = {
            version: [
                (
                    width - prefixlen,
                    {value >> (width - prefixlen): idx for value, idx in table.items()},
                )
                for prefixlen, table in sorted(by_prefix.items(), reverse=True)
            ]
            for version, width, by_prefix in ((4, 32, nets[4]), (6, 128, nets[6]))
        }

    def last_match(self, host: str, ip: IPValue | None, port: int, admit: Admit) -> int | None:
        """Index of the last rule matching ``host`` (canonical; ``ip`` set when it is
        an address) whose ports admit ``port``, or None."""
        if ip is not None:
            best = self._best_net(ip, port, admit, -1)
        else:
            best = _best(self._exact.get(host), port, admit, -1)
            _, dot, rest = host.partition(".")
            if dot:
                best = _best(self._one.get(rest), port, admit, best)
                multi = self._multi
                while dot:
                    best = _best(multi.get(rest), port, admit, best)
                    _, dot, rest = rest.partition(".")
        best = _best(self._any, port, admit, best)
        return None if best < 0 else best

    def last_address_match(self, ip: IPValue, port: int, admit: Admit) -> int | None:
        """Index of the last IP/CIDR rule (never ``**``) covering ``ip``, or None."""
        best = self._best_net(ip, port, admit, -1)
        return None if best < 0 else best

    def _best_net(self, ip: IPValue, port: int, admit: Admit, best: int) -> int:
        version, value = ip
        for shift, networks in self._nets[version]:
            best = _best(networks.get(value >> shift), port, admit, best)
        return best


def _best(indexes: list[int] | None, port: int, admit: Admit, best: int) -> int:
    if not indexes or indexes[-1] <= best:
        return best
    for index in reversed(indexes):
        if index <= best:
            return best
        ranges = admit[index]
        if ranges is None:
            return index
        for low, high in ranges:
            if low <= port <= high:
                return index
    return best

"""Median decision time at 10, 1,000 and 10,000 rules (`make bench`; not a timed test).

Targets (issue 2): under 5 µs at 10,000 rules, and at 10,000 rules no more than 2x
the time at 10. Each decision includes canonicalising the host (cached, as in the
gateway), the index lookups and building the Decision value.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from policy import Policy, policy_from_rules

pytestmark = pytest.mark.bench


def make_rules(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    rules = ["api.anthropic.com", "**.githubusercontent.com", "10.0.0.0/8"]
    while len(rules) < n:
        name = f"h{rng.randrange(10**6)}.svc{rng.randrange(1000)}.example"
        form = rng.random()
        if form < 0.5:
            rule = name
        elif form < 0.7:
            rule = "*." + name
        elif form < 0.85:
            rule = "**." + name
        elif form < 0.95:
            rule = f"{rng.randrange(1, 223)}.{rng.randrange(256)}.{rng.randrange(256)}.0/24"
        else:
            rule = "!" + name
        rules.append(rule)
    return rules[:n]


QUERIES = {
    "allowed-name": ("api.anthropic.com", 443),
    "deep-wildcard": ("a.b.c.objects.githubusercontent.com", 443),
    "no-match-name": ("evil.attacker.example", 443),
    "ip-literal": ("10.1.2.3", 443),
}


@pytest.fixture(scope="module", params=[10, 1_000, 10_000], ids=lambda n: f"{n}-rules")
def policy(request: pytest.FixtureRequest) -> Policy:
    return policy_from_rules(make_rules(request.param))


@pytest.mark.parametrize("query", list(QUERIES))
def test_decide(benchmark: Callable[..., object], policy: Policy, query: str) -> None:
    host, port = QUERIES[query]
    expected = policy.decide(host, port)
    result = benchmark(policy.decide, host, port)
    assert result == expected

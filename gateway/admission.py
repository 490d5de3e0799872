"""Admission: may this client reach ``host:port``, and at which checked addresses?

The order is the DNS-rebinding defence of DESIGN.md "Address guard":

1. decide on the NAME (``policy.decide``); a denied name is never resolved;
2. an IP-literal destination needs no lookup; a name is resolved once;
3. ``policy.check_addresses`` on EVERY resolved address (non-public refused unless an
   IP/CIDR rule allows it);
4. loop defence: an address that is one of the proxy's own listening endpoints (or a
   wildcard listen reached over loopback) is refused with ``Code.PROXY_LOOP``;
5. the caller dials only ``Admission.addresses``, never the name again.

Any exception on the way is a deny with ``Code.DECISION_ERROR``: never an allow.
``admit_now`` is the same sequence without a coroutine, for the CONNECT fast path: it
answers when no lookup is needed (IP literal, or a name still in the resolver's cache)
and returns None otherwise. A resolver failure is not a policy decision: it raises ``ResolveFailed`` (502), or
``TimeoutError`` after ``lookup_timeout`` (504).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Collection
from dataclasses import dataclass

from gateway.resolver import ResolveFailed, Resolver
from policy import Code, Decision, Policy, deny
from policy.hosts import is_ip

__all__ = ["Admission", "ListenAddr", "admit", "admit_now", "is_own_endpoint"]

ListenAddr = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Admission:
    decision: Decision
    addresses: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.decision.allowed and bool(self.addresses)


def is_own_endpoint(address: str, port: int, own: Collection[ListenAddr]) -> bool:
    """Whether ``address:port`` reaches one of our listeners (``own``)."""
    if not any(own_port == port for _, own_port in own):
        return False  # the common case, decided without parsing anything
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for own_host, own_port in own:
        if own_port != port:
            continue
        own_ip = ipaddress.ip_address(own_host)
        if ip == own_ip:
            return True
        if own_ip.is_unspecified and (ip.is_loopback or ip.is_unspecified):
            return True
        if own_ip.is_loopback and (ip.is_loopback or ip.is_unspecified):
            return True
    return False


def _decision_error(policy: Policy, host: str, port: int, exc: Exception) -> Admission:
    return Admission(
        deny(
            Code.DECISION_ERROR,
            host[:253],
            port,
            f"internal error while deciding ({type(exc).__name__}); refused",
            policy_name=getattr(policy, "name", "policy"),
        )
    )


def _guard(
    policy: Policy,
    decision: Decision,
    port: int,
    addresses: list[str],
    own: Collection[ListenAddr],
) -> Admission:
    """Steps 3 and 4 on the addresses of an allowed name."""
    canonical = decision.host
    checked = policy.check_addresses(canonical, port, addresses)
    if not checked.allowed:
        return Admission(checked)
    for address in addresses:
        if is_own_endpoint(address, port, own):
            return Admission(
                deny(
                    Code.PROXY_LOOP,
                    canonical,
                    port,
                    f"{canonical}:{port} is this proxy itself; refused to avoid a loop",
                    policy_name=policy.name,
                )
            )
    return Admission(decision, tuple(addresses))


def admit_now(
    policy: Policy,
    host: str,
    port: int,
    *,
    cached: Callable[[str], list[str] | None],
    own: Collection[ListenAddr] = (),
) -> Admission | None:
    """``admit`` without a coroutine when no lookup is needed: an IP literal, or a name
    whose answer ``cached`` (the resolver's cache, never the network) still holds.

    None means the name needs a lookup: the caller awaits ``admit``, which decides the
    name again (cheap, and the policy may have been reloaded meanwhile).
    """
    try:
        decision = policy.decide(host, port)
        if not decision.allowed:
            return Admission(decision)
        canonical = decision.host
        if is_ip(canonical):
            return _guard(policy, decision, port, [canonical], own)
        addresses = cached(canonical)
        if addresses is None:
            return None
        return _guard(policy, decision, port, addresses, own)
    except Exception as exc:  # fail closed: an error in deciding is a deny
        return _decision_error(policy, host, port, exc)


async def admit(
    policy: Policy,
    host: str,
    port: int,
    *,
    resolver: Resolver,
    own: Collection[ListenAddr] = (),
    lookup_timeout: float = 10.0,
) -> Admission:
    try:
        decision = policy.decide(host, port)
        if not decision.allowed:
            return Admission(decision)
        canonical = decision.host
        if is_ip(canonical):
            addresses = [canonical]
        else:
            async with asyncio.timeout(lookup_timeout):
                addresses = await resolver.resolve(canonical, port)
        return _guard(policy, decision, port, addresses, own)
    except (ResolveFailed, TimeoutError):
        raise  # not a policy decision: the caller answers 502/504
    except Exception as exc:  # fail closed: an error in deciding is a deny
        return _decision_error(policy, host, port, exc)

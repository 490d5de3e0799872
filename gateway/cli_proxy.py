"""`netwarden proxy`: run the gateway proxy until SIGINT/SIGTERM.

    netwarden proxy --policy FILE [--listen 127.0.0.1:0] [--events PATH] [--run-id ID]
                    [--no-auth] [--max-connections N] [--connect-timeout S]
                    [--idle-timeout S] [--header-timeout S] [--max-header-bytes N]

When ready it prints ONE JSON line on stdout and flushes it::

    {"type": "ready", "proxy_url": "http://netwarden:TOKEN@127.0.0.1:PORT", "run_id": ...,
     "listen": "127.0.0.1:PORT", "policy": NAME}

SIGHUP reloads the policy file atomically (an invalid file keeps the old policy and
writes a ``policy_reloaded`` event with ``ok: false`` and the reason). SIGINT/SIGTERM
stop accepting, drain, and exit 0. Exit 2: invalid policy or usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from gateway.audit import AuditLog
from gateway.auth import new_token
from gateway.server import ProxyConfig, ProxyServer
from policy import Mode, Policy, PolicyError, load_policy, policy_from_rules

__all__ = ["parse_listen", "register"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) -> (host, port); raises ValueError with the fix."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:0 or [::1]:0")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"--listen {text!r}: put an IPv6 address in brackets, e.g. [::1]:0")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"--listen {text!r}: the port must be 0-65535 (0 picks a free one)")
    return host, int(port_text)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "proxy",
        help="run the egress proxy",
        description="Run the egress proxy; prints one JSON ready line on stdout.",
    )
    p.add_argument("--policy", metavar="FILE", help="policy file (YAML)")
    p.add_argument("--preset", action="append", default=[], help="preset name (no --policy)")
    p.add_argument("--rule", action="append", default=[], help="rule (no --policy)")
    p.add_argument("--mode", choices=[m.value for m in Mode], default="allowlist")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    p.add_argument("--events", metavar="PATH", help="append audit events to PATH (jsonl)")
    p.add_argument("--run-id", help="run id in events (default: random)")
    p.add_argument(
        "--no-auth", action="store_true", help="accept clients without the run token (UNSAFE)"
    )
    p.add_argument("--max-connections", type=int, default=4096, metavar="N")
    p.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--idle-timeout", type=float, default=300.0, metavar="SECONDS")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--max-header-bytes", type=int, default=64 * 1024, metavar="N")
    p.set_defaults(func=run_proxy)


def _load(args: argparse.Namespace) -> Policy:
    if args.policy:
        if args.preset or args.rule:
            raise PolicyError("use either --policy FILE or --preset/--rule, not both")
        return load_policy(args.policy)
    if not args.preset and not args.rule:
        raise PolicyError("no policy: pass --policy FILE (or --preset NAME / --rule RULE)")
    return policy_from_rules(
        list(args.rule), mode=Mode(args.mode), presets=list(args.preset), name="inline"
    )


def run_proxy(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="netwarden proxy: %(message)s")
    try:
        policy = _load(args)
        host, port = parse_listen(args.listen)
    except (PolicyError, ValueError) as exc:
        print(f"netwarden proxy: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"netwarden proxy: cannot read the policy: {exc}", file=sys.stderr)
        return 2
    for name in ("max_connections", "max_header_bytes"):
        if getattr(args, name) < 1:
            print(f"netwarden proxy: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    for name in ("connect_timeout", "idle_timeout", "header_timeout"):
        if getattr(args, name) <= 0:
            print(f"netwarden proxy: --{name.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    if args.no_auth:
        print(
            "netwarden proxy: WARNING: --no-auth: ANY local process can use this proxy "
            "without credentials; use only for local experiments",
            file=sys.stderr,
        )
    run_id = args.run_id or f"r-{secrets.token_hex(4)}"
    try:
        audit = AuditLog(Path(args.events) if args.events else None, run_id)
    except OSError as exc:
        print(f"netwarden proxy: cannot open --events {args.events}: {exc}", file=sys.stderr)
        return 2
    config = ProxyConfig(
        policy=policy,
        listen_host=host,
        listen_port=port,
        run_id=run_id,
        token=None if args.no_auth else new_token(),
        audit=audit,
        max_connections=args.max_connections,
        connect_timeout=args.connect_timeout,
        idle_timeout=args.idle_timeout,
        header_timeout=args.header_timeout,
        max_header_bytes=args.max_header_bytes,
    )
    try:
        return _run(_serve(config, args.policy))
    finally:
        audit.close()


def _run(coro: Any) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is optional (extra "fast")
        return asyncio.run(coro)  # type: ignore[no-any-return]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)  # type: ignore[no-any-return]


async def _serve(config: ProxyConfig, policy_path: str | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    server = ProxyServer(config)
    try:
        await server.start()
    except OSError as exc:
        print(
            f"netwarden proxy: cannot listen on {config.listen_host}:{config.listen_port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if policy_path is not None:
        loop.add_signal_handler(signal.SIGHUP, server.reload_from, policy_path)
    ready = {
        "type": "ready",
        "proxy_url": server.proxy_url(),
        "run_id": config.run_id,
        "listen": server.proxy_url().rsplit("@", 1)[-1].removeprefix("http://"),
        "policy": server.policy.name,
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0

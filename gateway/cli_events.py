"""`netwarden events`: read an audit log (events.jsonl).

    netwarden events [PATH] [--type T]... [--run R] [--since ISO|10m|2h|1d]
                     [--summary] [--json] [--follow]

PATH defaults to $NETWARDEN_EVENTS, else ./events.jsonl. Default output is one line per
event (``ts type run key=value...``); ``--json`` prints the event lines as stored;
``--summary`` counts events by type and refusals by host and code; ``--follow`` keeps
printing new events until interrupted. Exit 2: no such file, a corrupt line, bad flags.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.audit import read_events

__all__ = ["parse_since", "register"]

_RELATIVE = re.compile(r"(\d+)\s*([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``10m``/``2h``/``30s``/``1d`` ago, or an ISO 8601 time (UTC if no zone)."""
    now = now or datetime.now(UTC)
    match = _RELATIVE.fullmatch(text.strip())
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {text!r}: use a duration like 10m, 2h, 1d or an ISO time "
            "like 2026-12-01T10:00:00Z"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "events", help="show audit events", description="Show events from an events.jsonl."
    )
    p.add_argument(
        "path", nargs="?", help="events file (default $NETWARDEN_EVENTS or ./events.jsonl)"
    )
    p.add_argument("--type", action="append", default=[], help="only this event type (repeatable)")
    p.add_argument("--run", help="only this run id")
    p.add_argument("--since", help="only events since ISO time or duration ago (10m, 2h, 1d)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--summary", action="store_true", help="counts instead of events")
    out.add_argument("--json", action="store_true", help="print event lines as JSON")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.set_defaults(func=show_events)


def _matches(event: dict[str, Any], args: argparse.Namespace, since: datetime | None) -> bool:
    if args.type and event.get("type") not in args.type:
        return False
    if args.run and event.get("run_id") != args.run:
        return False
    if since is not None:
        try:
            ts = datetime.fromisoformat(str(event.get("ts", "")).replace("Z", "+00:00"))
        except ValueError:
            return False
        if ts < since:
            return False
    return True


def _human(event: dict[str, Any]) -> str:
    data = event.get("data") or {}
    fields = " ".join(
        f"{k}={v}" for k, v in data.items() if k != "run_id" and v is not None and v != ""
    )
    return (
        f"{event.get('ts', '?')} {event.get('type', '?'):<18} {event.get('run_id', '?')} {fields}"
    )


def _summary(events: list[dict[str, Any]]) -> str:
    by_type = Counter(str(e.get("type")) for e in events)
    blocked = Counter(
        (str(e["data"].get("host")), str(e["data"].get("code")))
        for e in events
        if e.get("type") == "network_blocked" and isinstance(e.get("data"), dict)
    )
    lines = [f"{len(events)} events"]
    lines += [f"  {n:>6}  {t}" for t, n in by_type.most_common()]
    if blocked:
        lines.append("refused destinations:")
        lines += [f"  {n:>6}  {h} ({c})" for (h, c), n in blocked.most_common(20)]
    return "\n".join(lines)


def _follow(path: Path) -> Iterator[dict[str, Any]]:
    """Yield events appended to ``path`` from now on (polls; ends on Ctrl-C)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        pending = b""
        while True:
            chunk = fh.readline()
            if not chunk:
                time.sleep(0.2)  # a CLI tail, not a readiness wait
                continue
            pending += chunk
            if not pending.endswith(b"\n"):
                continue
            line, pending = pending, b""
            if line.strip():
                yield json.loads(line)


def show_events(args: argparse.Namespace) -> int:
    path = Path(args.path or os.environ.get("NETWARDEN_EVENTS") or "events.jsonl")
    try:
        since = parse_since(args.since) if args.since else None
        events = [e for e in read_events(path) if _matches(e, args, since)]
    except FileNotFoundError:
        print(
            f"netwarden events: {path}: no such file; pass the --events path the proxy wrote",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:
        print(f"netwarden events: {exc}", file=sys.stderr)
        return 2
    if args.summary:
        print(_summary(events))
        return 0
    for event in events:
        print(json.dumps(event) if args.json else _human(event))
    if args.follow:
        sys.stdout.flush()
        try:
            for event in _follow(path):
                if _matches(event, args, since):
                    print(json.dumps(event) if args.json else _human(event), flush=True)
        except KeyboardInterrupt:
            return 0
    return 0

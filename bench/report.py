"""Results of one benchmark run: a readable table and one JSON summary line.

Every figure of a proxy stands next to the direct figure from the same run and the
ratio between them; the issue's targets (issue 3, "Speed and memory") are marked
PASS or MISS next to the figures they judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from bench.measure import HttpRate, IdleMemory, TunnelRate
from bench.throughput import Throughput

__all__ = ["TARGETS", "Results", "render_table", "summary"]


@dataclass
class Results:
    """What was measured for one route (``direct``, ``netwarden``, ``reference``...)."""

    name: str
    up1: Throughput | None = None
    down1: Throughput | None = None
    up16: Throughput | None = None
    rate: TunnelRate | None = None
    http: HttpRate | None = None
    idle: IdleMemory | None = None
    retried_setups: list[str] = field(default_factory=list)  # failures outside the rate phase
    notes: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float | None]:
        """Every figure by its stable key (JSON summary and table rows)."""
        rate, http, idle = self.rate, self.http, self.idle
        return {
            "tunnel_upload_mb_s": self.up1.mb_per_s if self.up1 else None,
            "tunnel_download_mb_s": self.down1.mb_per_s if self.down1 else None,
            "tunnels16_upload_mb_s": self.up16.mb_per_s if self.up16 else None,
            "upload_proxy_busy_pct": _scaled(self.up1.proxy_busy if self.up1 else None, 100),
            "upload_mb_per_proxy_cpu_s": self.up1.mb_per_cpu_second if self.up1 else None,
            "download_proxy_busy_pct": _scaled(self.down1.proxy_busy if self.down1 else None, 100),
            "download_mb_per_proxy_cpu_s": self.down1.mb_per_cpu_second if self.down1 else None,
            "new_tunnels_per_s": rate.per_second if rate else None,
            "setup_p50_ms": rate.percentile(0.50) * 1e3 if rate and rate.latencies else None,
            "setup_p99_ms": rate.percentile(0.99) * 1e3 if rate and rate.latencies else None,
            "setup_errors": float((rate.errors if rate else 0) + len(self.retried_setups)),
            "cpu_per_tunnel_us": _scaled(rate.cpu_per_tunnel if rate else None, 1e6),
            "kernel_cpu_per_tunnel_us": _scaled(rate.kernel_cpu_per_tunnel if rate else None, 1e6),
            "http_requests_per_s": http.per_second if http else None,
            "http_reconnects": float(http.reconnects) if http else None,
            "cpu_per_http_request_us": _scaled(http.cpu_per_request if http else None, 1e6),
            "idle_tunnels": float(idle.tunnels) if idle else None,
            "rss_per_idle_tunnel_kib": idle.per_tunnel / 1024 if idle else None,
            "rss_before_mib": idle.rss_before / 2**20 if idle else None,
            "rss_after_mib": idle.rss_after / 2**20 if idle else None,
        }


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


@dataclass(frozen=True)
class _Target:
    """``key`` judged by ``passes(value, direct value)``; ``text`` shown in the table."""

    text: str
    passes: Callable[[float, float | None], bool]


TARGETS: Final[dict[str, _Target]] = {
    "tunnel_upload_mb_s": _Target(">=0.6x", lambda v, d: d is not None and v >= 0.6 * d),
    "tunnel_download_mb_s": _Target(">=0.6x", lambda v, d: d is not None and v >= 0.6 * d),
    "cpu_per_tunnel_us": _Target("<=150", lambda v, _d: v <= 150.0),
    "rss_per_idle_tunnel_kib": _Target("<=4.0", lambda v, _d: v <= 4.0),
}

_ROWS: Final = (
    ("tunnel_upload_mb_s", "1 tunnel upload, MB/s", "{:.0f}"),
    ("upload_proxy_busy_pct", "  proxy CPU busy, % of a core", "{:.0f}"),
    ("upload_mb_per_proxy_cpu_s", "  MB per proxy CPU-second", "{:.0f}"),
    ("tunnel_download_mb_s", "1 tunnel download, MB/s", "{:.0f}"),
    ("download_proxy_busy_pct", "  proxy CPU busy, % of a core", "{:.0f}"),
    ("download_mb_per_proxy_cpu_s", "  MB per proxy CPU-second", "{:.0f}"),
    ("tunnels16_upload_mb_s", "16 tunnels upload, MB/s total", "{:.0f}"),
    ("new_tunnels_per_s", "new tunnels/s (concurrency 32)", "{:.0f}"),
    ("setup_p50_ms", "  setup latency p50, ms", "{:.2f}"),
    ("setup_p99_ms", "  setup latency p99, ms", "{:.2f}"),
    ("setup_errors", "  tunnel setups that failed", "{:.0f}"),
    ("cpu_per_tunnel_us", "proxy CPU per new tunnel, µs", "{:.0f}"),
    ("kernel_cpu_per_tunnel_us", "  of which in the kernel, µs", "{:.0f}"),
    ("http_requests_per_s", "plain HTTP keep-alive req/s", "{:.0f}"),
    ("cpu_per_http_request_us", "proxy CPU per HTTP request, µs", "{:.0f}"),
    ("rss_per_idle_tunnel_kib", "RSS per idle tunnel, KiB", "{:.2f}"),
    ("rss_after_mib", "  RSS with idle tunnels open, MiB", "{:.1f}"),
)


def _cell(fmt: str, value: float | None) -> str:
    return "-" if value is None else fmt.format(value)


def _ratio(value: float | None, direct: float | None) -> str:
    if value is None or not direct:
        return ""
    return f"{value / direct:.2f}x"


def _verdict(key: str, value: float | None, direct: float | None) -> str:
    target = TARGETS.get(key)
    if target is None or value is None:
        return ""
    return f"{target.text} {'PASS' if target.passes(value, direct) else 'MISS'}"


def render_table(direct: Results, subjects: list[Results]) -> str:
    """Rows of figures; columns: direct, then per proxy its figure, ratio and target."""
    base = direct.figures()
    figures = [subject.figures() for subject in subjects]
    header = ["metric", "direct"]
    for subject in subjects:
        header += [subject.name, "x direct", "target"]
    rows = [header]
    for key, label, fmt in _ROWS:
        row = [label, _cell(fmt, base[key])]
        for values in figures:
            row += [_cell(fmt, values[key]), _ratio(values[key], base[key])]
            row.append(_verdict(key, values[key], base[key]))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(widths[i]) for i, cell in enumerate(row) if i
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("-" * len(lines[0]))
    for result in (direct, *subjects):
        lines += [f"note ({result.name}): {note}" for note in result.notes]
    return "\n".join(lines)


def summary(direct: Results, subjects: list[Results], *, config: dict[str, object]) -> str:
    """One JSON line: config, figures per route, and each target's verdict per proxy."""
    base = direct.figures()
    verdicts: dict[str, dict[str, object]] = {}
    for subject in subjects:
        values = subject.figures()
        for key, target in TARGETS.items():
            value = values[key]
            verdicts.setdefault(subject.name, {})[key] = {
                "value": value,
                "direct": base[key],
                "target": target.text,
                "pass": None if value is None else target.passes(value, base[key]),
            }
    routes = {result.name: result.figures() for result in (direct, *subjects)}
    notes = {result.name: result.notes for result in (direct, *subjects) if result.notes}
    line = {
        "type": "bench_summary",
        "config": config,
        "routes": routes,
        "targets": verdicts,
        "notes": notes,
    }
    return json.dumps(line, sort_keys=True)

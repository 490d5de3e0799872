"""Load client: drives a proxy through loopback targets and compares it with direct.

Usage::

    python -m bench.load                      # starts `netwarden proxy` itself (+ the baseline)
    python -m bench.load --quick              # short smoke run (seconds)
    python -m bench.load --proxy http://USER:TOKEN@127.0.0.1:PORT [--proxy-pid PID]
    python -m bench.load --subject reference  # only the naive baseline proxy

What happens: ``bench.targets`` starts in a child process (echo, sink/source and
keep-alive HTTP servers on 127.0.0.1, port 0). By default the proxy under test is
``netwarden proxy`` with an allowlist naming exactly the target ports (loopback is
otherwise refused by the address guard) and an audit log in a temporary directory,
pinned with ``taskset`` to one core (the last one); this client and the targets are
left to the scheduler (``--pin-client`` keeps them off the proxy's core; on a 2-core
machine that leaves them one core, which in our runs lowered the proxied figures
far more than the direct ones). The baseline is
``bench.reference_proxy`` under the same pinning. Per route, in this order (RSS first,
on a fresh proxy):

1. RSS with N idle tunnels: VmRSS before/after opening them, per tunnel;
2. single-tunnel upload and download, 16-tunnel upload (raw sockets, best of a few);
3. new tunnels at concurrency 32 (connect, CONNECT, 200, one byte echoed, close):
   rate, setup p50/p99, and the proxy's CPU time (utime+stime) per tunnel;
4. plain-HTTP keep-alive GETs on 16 connections: rate and proxy CPU per request.

The table goes to stdout, then ONE JSON line (``"type": "bench_summary"``) last.
Exit 0 when the run completed (targets missed are reported, not failures), 2 on bad
usage or a proxy that cannot be driven.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from bench.measure import http_rate, idle_tunnels, tunnel_rate
from bench.profile import sampled
from bench.proxyproc import BenchError, Child, ProxyURL, python_argv, spawn
from bench.report import Results, render_table, summary
from bench.route import Route
from bench.throughput import best_of, stream_throughput

__all__ = ["Config", "main"]

_MIB: Final = 1 << 20


@dataclass(frozen=True)
class Config:
    stream_bytes: int
    stream_runs: int
    parallel_bytes: int
    parallel_runs: int
    streams: int
    rate_seconds: float
    concurrency: int
    http_seconds: float
    http_connections: int
    idle_tunnels: int

    @classmethod
    def full(cls) -> Config:
        return cls(256 * _MIB, 3, 256 * _MIB, 2, 16, 3.0, 32, 3.0, 16, 1000)

    @classmethod
    def quick(cls) -> Config:
        return cls(16 * _MIB, 1, 32 * _MIB, 1, 16, 0.5, 32, 0.5, 16, 200)


def _run[T](coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop  # optional speed-up
    except ImportError:
        return asyncio.run(coroutine)
    result: T = uvloop.run(coroutine)
    return result


Phase = Callable[[str], contextlib.AbstractContextManager[object]]


def _no_profile(_name: str) -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


def measure_route(
    route: Route, ports: dict[str, int], config: Config, phase: Phase = _no_profile
) -> Results:
    """Every measurement for one route; idle RSS first (needs a fresh proxy and its pid).

    Each phase runs inside ``phase(name)`` (``--profile`` samples the proxy there).
    """
    results = Results(route.name)
    errors = results.retried_setups
    if route.proxy is not None:
        if route.pid is not None:
            with phase("idle"):
                results.idle = _run(
                    idle_tunnels(route, ports["echo"], count=config.idle_tunnels, errors=errors)
                )
        else:
            results.notes.append("no --proxy-pid: CPU and RSS not measured")
    sink = ports["sink"]
    with phase("throughput"):
        results.up1 = best_of(
            config.stream_runs,
            lambda: stream_throughput(
                route, sink, mode=b"U", streams=1, total=config.stream_bytes, errors=errors
            ),
        )
        results.down1 = best_of(
            config.stream_runs,
            lambda: stream_throughput(
                route, sink, mode=b"D", streams=1, total=config.stream_bytes, errors=errors
            ),
        )
        results.up16 = best_of(
            config.parallel_runs,
            lambda: stream_throughput(
                route,
                sink,
                mode=b"U",
                streams=config.streams,
                total=config.parallel_bytes,
                errors=errors,
            ),
        )
    with phase("tunnels"):
        results.rate = _run(
            tunnel_rate(
                route, ports["echo"], concurrency=config.concurrency, seconds=config.rate_seconds
            )
        )
    if results.rate.errors:
        results.notes.append(
            f"{results.rate.errors} tunnel setups failed; first: {results.rate.first_error}"
        )
    with phase("http"):
        results.http = _run(
            http_rate(
                route,
                ports["http"],
                connections=config.http_connections,
                seconds=config.http_seconds,
            )
        )
    if errors:
        results.notes.append(
            f"{len(errors)} tunnel setups failed outside the rate phase and were retried;"
            f" first: {errors[0]}"
        )
    if results.http.reconnects:
        results.notes.append(f"keep-alive broken: {results.http.reconnects} reconnects")
    return results


def _netwarden_policy(ports: dict[str, int], connect_host: str) -> str:
    rules = []
    for port in sorted(set(ports.values())):
        rules.append(f"127.0.0.1:{port}")
        if connect_host != "127.0.0.1":
            rules.append(f"{connect_host}:{port}")
    lines = [
        "# written by bench.load: the loopback targets of this run and nothing else",
        "mode: allowlist",
        "rules:",
    ]
    lines += [f'  - "{rule}"' for rule in rules]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _netwarden(
    ports: dict[str, int], connect_host: str, cpu: int | None, workdir: Path
) -> Iterator[Child]:
    policy = workdir / "bench-policy.yaml"
    policy.write_text(_netwarden_policy(ports, connect_host))
    argv = python_argv(
        "gateway.cli",
        "proxy",
        "--policy",
        str(policy),
        "--listen",
        "127.0.0.1:0",
        "--events",
        str(workdir / "events.jsonl"),
        "--run-id",
        "bench",
    )
    with spawn("netwarden", argv, cpu=cpu) as child:
        yield child


def _pin(args: argparse.Namespace) -> tuple[int | None, str]:
    """Chooses the proxy's core; with ``--pin-client`` also pins this process (and so
    the targets, started after) to the other cores.

    Returns the proxy's core (None: not pinned) and a description for the report.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if args.no_pin:
        return None, "nothing pinned (--no-pin)"
    taskset = shutil.which("taskset")
    if len(cpus) < 2 or taskset is None:
        found = "found" if taskset else "missing"
        return None, f"nothing pinned ({len(cpus)} usable core(s), taskset {found})"
    proxy_cpu = cpus[-1] if args.proxy_cpu is None else args.proxy_cpu
    if proxy_cpu not in cpus:
        raise BenchError(f"--proxy-cpu {proxy_cpu}: not one of the usable cores {cpus}")
    if not args.pin_client:
        return proxy_cpu, f"proxy pinned to core {proxy_cpu}; client and targets free"
    client = set(cpus) - {proxy_cpu}
    os.sched_setaffinity(0, client)
    return proxy_cpu, f"proxy pinned to core {proxy_cpu}; client and targets on {sorted(client)}"


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        new_soft = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        if new_soft < needed:
            raise BenchError(
                f"open-file limit {hard} is below the {needed} this run needs;"
                " raise it (ulimit -n) or lower --idle-tunnels"
            )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load",
        description="speed and memory benchmark of a CONNECT/HTTP proxy against direct loopback",
    )
    parser.add_argument(
        "--proxy", metavar="URL", help="drive this running proxy (http://USER:TOKEN@HOST:PORT)"
    )
    parser.add_argument(
        "--proxy-pid", type=int, metavar="PID", help="its pid, for CPU time and RSS"
    )
    parser.add_argument(
        "--subject",
        choices=("netwarden", "reference"),
        default="netwarden",
        help="the proxy to start when --proxy is not given (default netwarden)",
    )
    parser.add_argument("--no-reference", action="store_true", help="skip the naive baseline proxy")
    parser.add_argument(
        "--quick", action="store_true", help="short smoke run (small streams, 0.5 s phases)"
    )
    parser.add_argument(
        "--idle-tunnels", type=int, metavar="N", help="idle tunnels for the RSS figure"
    )
    parser.add_argument(
        "--rate-seconds",
        type=float,
        metavar="S",
        help="length of the new-tunnel phase (longer runs wrap the ephemeral port range)",
    )
    parser.add_argument(
        "--connect-host",
        default="localhost",
        help="host named in CONNECT (default localhost: the proxy's resolver is measured too)",
    )
    parser.add_argument(
        "--proxy-cpu", type=int, metavar="N", help="core for the proxy (default: the last)"
    )
    parser.add_argument(
        "--pin-client",
        action="store_true",
        help="also pin the client and targets to the cores the proxy does not use",
    )
    parser.add_argument("--no-pin", action="store_true", help="pin nothing")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the proxy with py-spy per phase into DIR (see python -m bench.profile)",
    )
    parser.add_argument("--py-spy", default="py-spy", metavar="PATH", help="py-spy executable")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON summary line")
    return parser


def _measure_guarded(
    route: Route,
    ports: dict[str, int],
    config: Config,
    child: Child | None = None,
    profile: tuple[str, Path] | None = None,
) -> Results:
    """``measure_route`` with failures turned into one BenchError naming the route
    (plus the tail of the proxy's stderr when we started it). ``profile`` is
    (py-spy executable, output directory): each phase is sampled into its own file."""
    phase: Phase = _no_profile
    if profile is not None and route.pid is not None:
        py_spy, directory = profile
        pid = route.pid

        def _sampled(name: str) -> contextlib.AbstractContextManager[object]:
            return sampled(py_spy, pid, directory / f"{route.name}-{name}.txt")

        phase = _sampled

    try:
        return measure_route(route, ports, config, phase)
    except (BenchError, OSError, ExceptionGroup) as exc:
        tail = child.stderr_tail() if child else ""
        where = f"\n{route.name} stderr:\n{tail}" if tail else ""
        if isinstance(exc, ConnectionRefusedError) and route.proxy is not None:
            where += (
                f" (nothing listens at {route.proxy.host}:{route.proxy.port}: is the proxy up?)"
            )
        raise BenchError(f"{route.name}: {_describe(exc)}{where}") from exc


def _child_route(name: str, child: Child, connect_host: str) -> Route:
    url = child.ready.get("proxy_url")
    if not isinstance(url, str):
        raise BenchError(f"{name}: ready line has no proxy_url string")
    return Route(name, ProxyURL.parse(url), pid=child.pid, target_host=connect_host)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(sorted({_describe(inner) for inner in exc.exceptions}))
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, BenchError) else str(exc)


def run(args: argparse.Namespace) -> int:
    config = Config.quick() if args.quick else Config.full()
    if args.idle_tunnels is not None:
        config = Config(**{**asdict(config), "idle_tunnels": args.idle_tunnels})
    if args.rate_seconds is not None:
        config = Config(**{**asdict(config), "rate_seconds": args.rate_seconds})
    _raise_fd_limit(4 * config.idle_tunnels + 256)
    proxy_cpu, pinning = _pin(args)
    profile = None
    if args.profile is not None:
        py_spy = shutil.which(args.py_spy)
        if py_spy is None:
            raise BenchError(
                f"--profile needs py-spy: {args.py_spy!r} not found (pip install py-spy)"
            )
        args.profile.mkdir(parents=True, exist_ok=True)
        profile = (py_spy, args.profile)
    subjects: list[Results] = []
    with (
        spawn("targets", python_argv("bench.targets")) as targets,
        tempfile.TemporaryDirectory(prefix="bench-") as tmp,
    ):
        ports = {key: int(str(targets.ready[key])) for key in ("echo", "sink", "http")}
        direct = _measure_guarded(Route("direct"), ports, config)
        if args.proxy:
            route = Route(
                "proxy",
                ProxyURL.parse(args.proxy),
                pid=args.proxy_pid,
                target_host=args.connect_host,
            )
            subjects.append(_measure_guarded(route, ports, config, profile=profile))
        elif args.subject == "netwarden":
            with _netwarden(ports, args.connect_host, proxy_cpu, Path(tmp)) as child:
                route = _child_route("netwarden", child, args.connect_host)
                subjects.append(_measure_guarded(route, ports, config, child, profile))
            events = Path(tmp) / "events.jsonl"
            lines = events.read_text().count("\n") if events.exists() else 0
            subjects[-1].notes.append(f"{lines} audit lines written")
        if args.subject == "reference" or not args.no_reference:
            argv = python_argv("bench.reference_proxy", "--listen", "127.0.0.1:0")
            with spawn("reference", argv, cpu=proxy_cpu) as child:
                route = _child_route("reference", child, args.connect_host)
                subjects.append(_measure_guarded(route, ports, config, child, profile))
    config_out: dict[str, object] = {**asdict(config), "quick": args.quick, "pinning": pinning}
    config_out["connect_host"] = args.connect_host
    if not args.json_only:
        print(f"netwarden bench ({'quick' if args.quick else 'full'}; {pinning})")
        print(render_table(direct, subjects))
    print(summary(direct, subjects, config=config_out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.proxy_pid is not None and not args.proxy:
        print("bench.load: --proxy-pid needs --proxy", file=sys.stderr)
        return 2
    try:
        return run(args)
    except BenchError as exc:
        print(f"bench.load: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into `head`: not an error of the benchmark
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

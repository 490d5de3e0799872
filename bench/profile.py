"""Sampling the proxy during a benchmark phase with py-spy, and reading the samples.

``python -m bench.load --profile DIR`` attaches ``py-spy record`` (``pip install
py-spy``; not a dependency of netwarden) to the proxy process for each phase and writes
collapsed stacks to ``DIR/<route>-<phase>.txt`` (one ``frame;frame;... count`` line per
stack, the input of flamegraph tools). ``python -m bench.profile FILE...`` prints where
the samples went: the functions that were on CPU themselves (self) and the functions
whose callees were (inclusive).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

__all__ = ["sampled", "top_frames"]


@contextlib.contextmanager
def sampled(py_spy: str, pid: int, output: Path, *, rate: int = 250) -> Iterator[None]:
    """``py-spy record`` attached to ``pid`` for the duration of the block.

    ``--nonblocking`` samples without pausing the proxy, so the figures measured at the
    same time stay close to unprofiled ones. py-spy writes its file when interrupted.
    """
    command = [py_spy, "record", "--nonblocking", "-f", "raw", "-r", str(rate)]
    command += ["-p", str(pid), "-o", str(output)]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        try:
            recorder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            recorder.wait()


def _frames(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def top_frames(path: Path, limit: int = 15) -> str:
    """A short text report: total samples, then the top self and inclusive frames."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for frames, count in _frames(path):
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return f"{path.name}: no samples (py-spy could not attach, or the proxy was idle)"
    lines = [f"{path.name}: {total} samples"]
    for title, counter in (("self", own), ("inclusive", inclusive)):
        lines.append(f"  top {title}:")
        for frame, count in counter.most_common(limit):
            lines.append(f"    {100 * count / total:5.1f}%  {frame}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description="where a py-spy raw profile spent its samples"
    )
    parser.add_argument("files", nargs="+", type=Path, help="collapsed-stack files from --profile")
    parser.add_argument("--limit", type=int, default=15, help="frames per list (default 15)")
    args = parser.parse_args(argv)
    for path in args.files:
        print(top_frames(path, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())

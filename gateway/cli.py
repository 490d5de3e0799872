"""`netwarden` command line: one entry point, each command group in its own module.

Each module in ``_COMMAND_MODULES`` defines ``register(subparsers)``, which adds its
sub-commands and sets ``func`` (returning the exit code) on their parsers.
Exit codes: 0 success, 1 a check failed, 2 usage or invalid input, 3 some
destination denied (``policy check``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

_COMMAND_MODULES = (
    "gateway.cli_policy",
    "gateway.cli_proxy",
    "gateway.cli_events",
    "gateway.cli_run",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse types it NoReturn
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="netwarden", description="egress security gateway for sandboxed agents")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

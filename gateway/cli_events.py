"""Placeholder: filled in by its owner."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Adds no commands yet."""

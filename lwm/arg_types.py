"""argparse types shared by the command-line tools: a bad value is refused by argparse itself
("argument --fps: expected a positive number, got '0'"), before any work starts."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a time in seconds >= 0, got {text!r}")
    return value


def csv_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']"""
    return [t.strip() for t in text.split(",") if t.strip()]

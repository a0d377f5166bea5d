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


def device_name(text: str) -> str:
    """cpu, cuda or cuda:N, N a GPU of this machine (without one, cuda is refused)."""
    import torch  # only commands that take a device pay for it

    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    if parsed.type not in ("cpu", "cuda") or (parsed.type == "cpu" and parsed.index not in (None, 0)):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if parsed.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
            )
    return text

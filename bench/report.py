"""Shared helpers for the benchmarks: host facts and writing a section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def host_line() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, Python {platform.python_version()}"
    )


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def write_section(name: str, markdown: str, doc: Path = DOC) -> None:
    """Replace (or append) the section between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def publish(name: str, markdown: str, write: bool = True) -> None:
    """Print a benchmark's markdown and, unless told not to, put it in its section of docs/benchmarks.md."""
    print()
    print(markdown)
    if write:
        write_section(name, markdown)

"""A section of docs/benchmarks.md, and the host line each measured section starts with: the one
writer of that file (the benchmarks in bench/ and train_vqgan.py's report)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import torch

from lwm.paths import REPO

# LWM_BENCH_DOC: write the sections into another copy (scripts/gpu_check.py collects a device run's there).
DOC = Path(os.environ.get("LWM_BENCH_DOC") or REPO / "docs" / "benchmarks.md")


def host_line() -> str:
    gpu = f", GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda})" if torch.cuda.is_available() else ""
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, Python {platform.python_version()}{gpu}"
    )


def write_section(name: str, markdown: str, doc: Path = DOC) -> None:
    """Replace (or append) the section between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)

"""Shared helpers for the benchmarks: host facts and writing a section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import re
import resource
import sys
from pathlib import Path

import torch

# LWM_BENCH_DOC: write the sections into another copy (scripts/gpu_check.py collects a device run's there).
DOC = Path(os.environ.get("LWM_BENCH_DOC") or Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md")

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets, for MFU.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}


def host_line() -> str:
    gpu = f", GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda})" if torch.cuda.is_available() else ""
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, Python {platform.python_version()}{gpu}"
    )


def sync(device) -> None:
    """Wait for queued GPU work, so that a wall-clock time covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_mib(device="cpu") -> float:
    """Peak memory so far: the device's peak allocation on a GPU, the process's peak RSS on CPU."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_tflops(device) -> float | None:
    """The device's dense bf16 peak, or None when it is not a GPU in the table."""
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def command_line() -> str:
    """The command that ran this benchmark, as it was typed: python -m bench.<name> ARGS."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    prog = f"-m {spec.name}" if spec is not None else os.path.relpath(sys.argv[0])
    return "python " + " ".join([prog] + sys.argv[1:])


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

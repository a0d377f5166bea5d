"""Shared helpers for the benchmarks: peaks, timing and publishing a section of docs/benchmarks.md
(host_line and write_section live in lwm.doc_sections: train_vqgan.py writes its report with them too)."""

from __future__ import annotations

import os
import resource
import sys

import torch

from lwm.doc_sections import host_line, write_section  # noqa: F401  (the benchmarks import them from here)

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets, for MFU.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}


def sync(device) -> None:
    """Wait for queued GPU work, so that a wall-clock time covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_mib(device="cpu") -> float:
    """Peak memory so far: the device's peak allocation on a GPU, the process's peak RSS on CPU."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def status_kib(field: str) -> int:
    """A field of this process's /proc/self/status in KiB (VmRSS: resident now, VmHWM: its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> int:
    """VmHWM back to the current RSS (Linux's clear_refs 5); returns that RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")


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


def publish(name: str, markdown: str, write: bool = True) -> None:
    """Print a benchmark's markdown and, unless told not to, put it in its section of docs/benchmarks.md."""
    print()
    print(markdown)
    if write:
        write_section(name, markdown)

"""Training throughput of the tiny model on CPU: cp=1 (one process) vs cp=2 (two processes), at
the tiny schedule's longest stage (8K tokens), with peak memory per rank.

Each configuration is a real `python train.py` run of that stage (stopped after a few steps);
tokens/s and peak memory come from its metrics.csv (the Throughput and PeakMemory callbacks).

    python bench/train.py            # writes docs/benchmarks.md
    python bench/train.py --steps 4 --no-write
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import command_line, host_line, publish  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run(cp: int, steps: int, out: Path) -> dict:
    cmd = [sys.executable, "train.py", f"trainer.out_dir={out}", "stage_only=s8k", "export=false", "trainer.log_every=1",
           f"trainer.devices={cp}", f"+schedule.stages.2.cp={cp}", f"+stop_at_step={steps}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = [r for r in csv.DictReader(open(out / "s8k" / "logs" / "metrics.csv")) if r.get("perf/tokens_per_s")]
    later = rows[1:] or rows  # the first step pays for start-up
    return {
        "tokens_per_s": statistics.median(float(r["perf/tokens_per_s"]) for r in later),
        "peak_mib": max(float(r["perf/peak_mem_mib"]) for r in rows),
        "steps": len(rows),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cp in (1, 2):
            results[cp] = run(cp, args.steps, Path(tmp) / f"cp{cp}")
            r = results[cp]
            print(f"cp={cp}: {r['tokens_per_s']:.0f} tokens/s, peak {r['peak_mib']:.0f} MiB per rank", flush=True)
    base = results[1]
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        f"`tiny` model, stage s8k of the tiny schedule (8192 tokens per sequence, batch 1), fp32, {args.steps} steps, "
        "median tokens/s after the first step; peak memory = the rank's peak RSS (includes the Python process, "
        "torch and the data). cp=2 runs two processes (FSDP2 over both, ring attention, gloo) on the same 2 cores.",
        "",
        "| cp | processes | tokens/s (all ranks) | vs cp=1 | peak memory per rank (MiB) | vs cp=1 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cp, r in results.items():
        lines.append(f"| {cp} | {cp} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
                     f"{r['peak_mib']:.0f} | {r['peak_mib'] / base['peak_mib']:.2f}x |")
    lines.append("")
    lines.append("No GPU in this session: the 7B-layer-shape tokens/s and MFU at 8K and 32K (bf16, activation "
                 "checkpointing) are not measured.")
    markdown = "\n".join(lines)
    publish("train", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

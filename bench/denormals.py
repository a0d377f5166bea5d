"""Late in a run, a CPU training step with denormal floats kept against flushed (trainer.flush_denormal).

A stopped run (its stage's checkpoints/last.ckpt) is copied twice and each copy resumed for --steps steps with
train.py, one with trainer.flush_denormal=false (the baseline) and one with true, each in a process of its own
(the mode is each thread's and is set before the first parallel op). tokens/s is the median of the resumed
steps' Throughput rows in metrics.csv, the first --warmup steps left out.

    python -m bench.denormals --run runs/t2v_demo --args +experiment=t2v_demo   # a stopped demo run
"""

from __future__ import annotations

import argparse
import csv
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.report import command_line, host_line, publish
from lwm.disk.stage_folder import StageFolder

ROOT = Path(__file__).resolve().parent.parent
STOPPED = 4  # train.py's status when a stage stops at stop_at_step


def stopped_stage(run: Path) -> tuple[str, int]:
    """(the stage with a checkpoint, the last step its metrics.csv logged)."""
    for folder in sorted(p for p in run.iterdir() if p.is_dir()):
        stage = StageFolder.of(run, folder.name)
        if (stage.checkpoints / "last.ckpt").is_file():
            steps = [int(r["step"]) for r in csv.DictReader(open(stage.logs / "metrics.csv")) if r.get("step")]
            return folder.name, max(steps)
    raise SystemExit(f"--run {run}: no stage with checkpoints/last.ckpt (stop a run with stop_at_step or Ctrl-C)")


def resumed(run: Path, args: list[str], flush: bool, steps: int, warmup: int, tmp: Path) -> float:
    """tokens/s of `steps` steps resumed from a copy of `run` with denormals flushed or kept."""
    copy = tmp / ("flushed" if flush else "kept")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("hf", "needle"))
    stage, last = stopped_stage(copy)
    cmd = [sys.executable, "train.py", *args, f"trainer.out_dir={copy}", "resume=true", "export=false"]
    cmd += [f"stop_at_step={last + 1 + steps}", f"trainer.flush_denormal={str(flush).lower()}", "trainer.log_every=1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != STOPPED:
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rows = csv.DictReader(open(StageFolder.of(copy, stage).logs / "metrics.csv"))
    rates = [
        float(r["perf/tokens_per_s"]) for r in rows if r.get("perf/tokens_per_s") and int(r["step"]) > last + warmup
    ]
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a stopped run's trainer.out_dir")
    parser.add_argument("--args", default="", help="train.py's arguments of that run (its experiment, overrides)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    stage, last = stopped_stage(args.run)
    with tempfile.TemporaryDirectory() as tmp:
        kept = resumed(args.run, shlex.split(args.args), False, args.steps, args.warmup, Path(tmp))
        flushed = resumed(args.run, shlex.split(args.args), True, args.steps, args.warmup, Path(tmp))
    markdown = "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"Stage `{stage}` of `{args.run}` resumed after its step {last} for {args.steps} steps each way, in a "
            f"process of its own; median tokens/s of the steps after the first {args.warmup}.",
            "",
            "| trainer.flush_denormal | tokens/s | vs kept |",
            "| --- | ---: | ---: |",
            f"| false (denormals kept) | {kept:.0f} | 1.00x |",
            f"| true (flushed) | {flushed:.0f} | {flushed / kept:.2f}x |",
        ]
    )
    publish("denormals", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

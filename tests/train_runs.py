"""train.py run as users run it, for the tests that launch it: the debug model and schedule, the
command's output captured, its losses read back from metrics.csv."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# data.num_workers=0: a debug run's batches take microseconds, and each run's loader fork server would start in
# seconds; the tests that stop ranks (test_train_parallel's dead rank, test_slurm) ask for workers again
DEBUG = [
    "model=debug",
    "schedule=debug",
    "trainer.log_every=1",
    "export=false",
    "evaluate.lengths=null",
    "data.num_workers=0",
]


def composed(*overrides: str):
    """train.py's typed config (RunConfig), composed from conf/ with these overrides, in this process."""
    from hydra import compose, initialize_config_dir

    from lwm.train.entry import to_run_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_run_config(compose("train", overrides=list(overrides)))


STOPPED = 4  # train.py's status when a stage stops before its end (stop_at_step, a signal)


def train(
    out: Path, *overrides: str, launcher: list[str] | None = None, check: bool = True, expect: int = 0
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = (launcher or [sys.executable]) + ["train.py", f"trainer.out_dir={out}", *DEBUG, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != expect:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def losses(out: Path, stage: str = "a") -> dict[int, float]:
    rows = csv.DictReader(open(out / stage / "logs" / "metrics.csv"))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def main_in_process(monkeypatch, capsys, out: Path, *overrides: str) -> tuple[int, str, str]:
    """train.py's main in this process, as `python train.py` runs it (minus the start-up), finished or not:
    (exit status, stdout, stderr)."""
    import importlib.util

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["train.py", f"trainer.out_dir={out}", *DEBUG, *overrides])
    spec = importlib.util.spec_from_file_location("__main__", ROOT / "train.py")  # run as a script: conf/ beside it
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err

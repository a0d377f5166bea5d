"""train.py run as users run it, for the tests that launch it: the debug model and schedule, the
command's output captured, its losses read back from metrics.csv."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import time
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


def train_argv(out: Path, overrides, debug: bool = True) -> list[str]:
    """train.py's argv: the run in `out`, the debug model and schedule (DEBUG) unless `debug` is false."""
    return ["train.py", f"trainer.out_dir={out}", *(DEBUG if debug else ()), *overrides]


def run_environ() -> dict[str, str]:
    """This process's environment with one thread and no warnings, as the tests run train.py."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


STOPPED = 4  # train.py's status when a stage stops before its end (stop_at_step, a signal)


def train(
    out: Path, *overrides: str, launcher: list[str] | None = None, check: bool = True, expect: int = 0
) -> subprocess.CompletedProcess:
    env = run_environ()
    cmd = (launcher or [sys.executable]) + train_argv(out, overrides)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != expect:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


# What a run imports (torch, Lightning and its torchmetrics, Hydra, lwm: about 6 s a process on this machine):
# what train.py's command imports as it starts, and TensorBoard, which its logger imports as the stage begins
TRAIN_IMPORTS = ["lwm.train.command", "torch.utils.tensorboard"]


def fork_server_preload() -> list[str]:
    """A test process has one fork server, started by whichever of run_distributed and forked_train comes
    first: it imports what both fork (tests/conftest.py gives run_distributed this list too)."""
    from lwm.parallel.launch import FORKSERVER_PRELOAD

    return sorted({*FORKSERVER_PRELOAD, *TRAIN_IMPORTS})


def _forked_rank(rank: int, ranks: int, port: int, logs: str, argv: list[str], environ: dict) -> None:
    """One rank of forked_train, in a process forked from the fork server: train.py run as its own
    __main__, with what a launcher that starts its processes externally (torchrun, srun) gives a rank."""
    import runpy
    import warnings

    import torch

    os.environ.clear()  # the caller's environment now, not the fork server's from its start
    os.environ.update(environ)
    if ranks > 1:  # as Lightning gives the ranks it starts itself: LOCAL_RANK set means started externally
        ranks_env = {"LOCAL_RANK": rank, "NODE_RANK": 0, "WORLD_SIZE": ranks, "MASTER_PORT": port}
        os.environ.update({k: str(v) for k, v in ranks_env.items()}, MASTER_ADDR="127.0.0.1")
    warnings.simplefilter("ignore")  # PYTHONWARNINGS=ignore, read only as an interpreter starts
    torch.set_num_threads(int(environ.get("OMP_NUM_THREADS", "1")))
    for fd, name in ((1, "out"), (2, "err")):
        with open(f"{logs}/{rank}.{name}", "w") as f:
            os.dup2(f.fileno(), fd)
    os.chdir(ROOT)
    sys.argv = argv
    code = 0
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def forked_train(
    out: Path,
    *overrides: str,
    ranks: int = 1,
    check: bool = True,
    expect: int = 0,
    timeout: float = 600,
    debug: bool = True,
) -> subprocess.CompletedProcess:
    """train.py as `train` runs it, its ranks forked from a server that imported what it imports (a rank
    starts in milliseconds, not seconds): for the tests of what a run does, not of how its processes
    start (those launch train.py itself: Lightning's own launcher, torchrun, srun). ranks > 1 starts them
    as torchrun does, each told its LOCAL_RANK (trainer.devices must say as many); debug=False leaves
    the debug model and schedule (DEBUG) off the command line. The result holds rank
    0's exit status and output, and every rank's output where a rank failed."""
    import multiprocessing

    from lwm.parallel.launch import free_port

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(fork_server_preload())  # read as the server starts: the first call
    argv, env = train_argv(out, overrides, debug), run_environ()
    with tempfile.TemporaryDirectory() as logs:
        port = free_port()
        procs = [context.Process(target=_forked_rank, args=(r, ranks, port, logs, argv, env)) for r in range(ranks)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        codes = [proc.exitcode for proc in procs]
        read = [(Path(logs, f"{r}.out").read_text(), Path(logs, f"{r}.err").read_text()) for r in range(ranks)]
    result = subprocess.CompletedProcess(argv, codes[0], *read[0])
    if check and (codes[0] != expect or any(c not in (0, expect) for c in codes)):
        ranks_text = "\n".join(
            f"rank {r} ({c}):\n{o[-3000:]}\n{e[-5000:]}" for r, (c, (o, e)) in enumerate(zip(codes, read))
        )
        raise AssertionError(f"{' '.join(argv)} (forked, {ranks} ranks) exited {codes}:\n{ranks_text}")
    return result


def losses(out: Path, stage: str = "a") -> dict[int, float]:
    rows = csv.DictReader(open(out / stage / "logs" / "metrics.csv"))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def main_in_process(monkeypatch, capsys, out: Path, *overrides: str) -> tuple[int, str, str]:
    """train.py's main in this process, as `python train.py` runs it (minus the start-up), finished or not:
    (exit status, stdout, stderr)."""
    import importlib.util

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", train_argv(out, overrides))
    spec = importlib.util.spec_from_file_location("__main__", ROOT / "train.py")  # run as a script: conf/ beside it
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err

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

    from lwm.core.config import to_run_config

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


def _forked_rank(rank: int, logs: str, target: str, argv: list[str], environ: dict, contract: bool) -> None:
    """One rank of forked_ranks, in a process forked from the fork server: `target` (a script of the repository
    or a module) run as its own __main__ in `environ`, which holds what its launcher gives the rank; under the
    NCCL communication contract (tests/comm_contract.py) where `contract`."""
    import contextlib
    import runpy
    import warnings

    import comm_contract
    import torch

    os.environ.clear()  # the caller's environment now, not the fork server's from its start
    os.environ.update(environ)
    warnings.simplefilter("ignore")  # PYTHONWARNINGS=ignore, read only as an interpreter starts
    torch.set_num_threads(int(environ.get("OMP_NUM_THREADS", "1")))
    for fd, name in ((1, "out"), (2, "err")):
        with open(f"{logs}/{rank}.{name}", "w") as f:
            os.dup2(f.fileno(), fd)
    os.chdir(ROOT)
    sys.argv = argv
    code = 0
    try:
        with comm_contract.contract(torch.device("cpu")) if contract else contextlib.nullcontext():
            if target.endswith(".py"):
                runpy.run_path(str(ROOT / target), run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def forked_ranks(
    target: str, argv: list[str], rank_env, ranks: int = 1, timeout: float = 600, contract: bool = False
) -> list[tuple[int, str, str]]:
    """`target` run as `python target argv` runs it, on `ranks` processes forked from a server that imported
    what train.py imports (a rank starts in milliseconds, not seconds); rank_env(rank, port) -> what the
    launcher tells rank `rank` (nothing for one rank). -> each rank's (exit status, stdout, stderr)."""
    import multiprocessing

    from lwm.parallel.launch import free_port

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(fork_server_preload())  # read as the server starts: the first call
    with tempfile.TemporaryDirectory() as logs:
        port, env = free_port(), run_environ()
        procs = [
            context.Process(
                target=_forked_rank,
                args=(r, logs, target, [target, *argv], {**env, **(rank_env(r, port) if ranks > 1 else {})}, contract),
            )
            for r in range(ranks)
        ]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        return [
            (proc.exitcode, Path(logs, f"{r}.out").read_text(), Path(logs, f"{r}.err").read_text())
            for r, proc in enumerate(procs)
        ]


LOCALHOST = {"MASTER_ADDR": "127.0.0.1"}


def lightning_rank_env(ranks: int):
    """rank_env of forked_ranks: what Lightning gives the ranks it starts itself (LOCAL_RANK set: started
    externally)."""
    world = {"NODE_RANK": "0", "WORLD_SIZE": str(ranks)} | LOCALHOST
    return lambda rank, port: {"LOCAL_RANK": str(rank), "MASTER_PORT": str(port)} | world


def torchrun_rank_env(ranks: int):
    """rank_env of forked_ranks: what torchrun --standalone --nproc_per_node=ranks gives each rank."""
    world = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks)} | LOCALHOST
    return lambda rank, port: {"RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_PORT": str(port)} | world


def forked_command(module: str, argv: list[str], ranks: int = 1, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m module argv` (under torchrun --nproc_per_node=ranks where ranks > 1), its ranks forked
    (forked_ranks) and run under the NCCL communication contract. -> rank 0's status and output; raises, with
    every rank's output, where another rank's status differs."""
    results = forked_ranks(module, argv, torchrun_rank_env(ranks), ranks, timeout, contract=True)
    if any(code != results[0][0] for code, _, _ in results):
        raise AssertionError(f"{module} {argv} (forked, {ranks} ranks):\n" + ranks_text(results))
    return subprocess.CompletedProcess([module, *argv], *results[0])


def ranks_text(results) -> str:
    return "\n".join(f"rank {r} ({c}):\n{o[-3000:]}\n{e[-5000:]}" for r, (c, o, e) in enumerate(results))


def forked_train(
    out: Path,
    *overrides: str,
    ranks: int = 1,
    check: bool = True,
    expect: int = 0,
    timeout: float = 600,
    debug: bool = True,
) -> subprocess.CompletedProcess:
    """train.py as `train` runs it, its ranks forked (forked_ranks): for the tests of what a run does, not of
    how its processes start (those launch train.py itself: Lightning's own launcher, torchrun, srun). ranks > 1
    starts them as torchrun does, each told its LOCAL_RANK (trainer.devices must say as many), and runs them
    under the NCCL communication contract (tests/comm_contract.py); debug=False
    leaves the debug model and schedule (DEBUG) off the command line. The result holds rank 0's exit status
    and output, and every rank's output where a rank failed."""
    argv = train_argv(out, overrides, debug)
    results = forked_ranks("train.py", argv[1:], lightning_rank_env(ranks), ranks, timeout, contract=ranks > 1)
    codes = [code for code, _, _ in results]
    if check and (codes[0] != expect or any(c not in (0, expect) for c in codes)):
        raise AssertionError(f"{' '.join(argv)} (forked, {ranks} ranks) exited {codes}:\n{ranks_text(results)}")
    return subprocess.CompletedProcess(argv, *results[0])


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

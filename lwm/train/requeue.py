"""Jobs that stop on a signal and come back by themselves.

SLURM warns a job before its time limit with the signal that `--signal=USR1@<seconds>` asks for,
and stops a job that it preempts, requeues (`scontrol requeue`) or cancels with SIGTERM, then
SIGKILL KillWait seconds later. A run whose ranks receive SIGUSR1 or SIGTERM during a stage's steps
finishes the step it is in; at that step's end the ranks agree (one rank's signal is enough), the
stage stops and StageCheckpoint writes checkpoints/last.ckpt of that step (outside a stage's steps,
with nothing to save, SIGTERM ends the run at once; during the save a signal is only noted). The
step and the save have KillWait seconds (slurm.conf) after a SIGTERM. On SIGUSR1 rank 0 then
requeues the job (a preempted or requeued job SLURM requeues itself), and the job, started again
under its own id and so in its own folder, continues the run by itself: a job whose
SLURM_RESTART_COUNT is above 0 runs as with resume=true. A fresh job never resumes unless told to
(resume=true).

Ctrl-C (SIGINT, which a terminal sends to every process of the run, loader workers included) stops a
run as SIGTERM does: the stage saves at the step's end and the run exits with the stop status and
the resume hint, on every rank, whatever trainer.checkpoint_every is.

Lightning's own SLURM requeue is not used: it saves from inside the signal handler, wherever the
step is (a sharded save's collectives against the step's own), into hpc_ckpt_N.ckpt files that a
stage's resume does not read, and its SIGTERM handler stops a run without a checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import lightning as L

from lwm.ranks import is_rank0, say

SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
_received: list[int] = []  # set by the handler: a handler may only note, the step decides
_training = [False]  # a stage is between its first and last step, where a step boundary comes soon


def _note(signum, frame) -> None:
    if signum in (signal.SIGTERM, signal.SIGINT) and not _training[0]:
        raise SystemExit(128 + signum)  # nothing to save (starting, between stages, exporting): stop now
    _received.append(signum)


def install() -> None:
    """Note SIGUSR1, SIGTERM and SIGINT instead of dying of them."""
    for signum in SIGNALS:
        signal.signal(signum, _note)


@contextmanager
def stop_signals_noted() -> Iterator[None]:
    """install() for the block, taking the signals held back (blocked) before it too; the previous
    handlers after it (train.py's main also runs inside a test's process)."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    install()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def received() -> signal.Signals | None:
    """The first stopping signal this process received, if any."""
    return signal.Signals(_received[0]) if _received else None


def slurm_job() -> str | None:
    """This job's id as scontrol names it (`<array job>_<task>` for an array task), outside SLURM None."""
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


class StopOnSignal(L.Callback):
    """Stops the stage at the first step boundary after a stopping signal, on every rank at once
    (StageCheckpoint then saves checkpoints/last.ckpt of that step), and keeps the logs as far as
    each checkpoint: a job killed without warning resumes from its last checkpoint with every
    metric row up to it."""

    def __init__(self) -> None:
        self.stopping = False  # the ranks agreed to stop at this step

    def on_train_start(self, trainer, pl_module) -> None:
        install()  # over the handlers Lightning registers when fit starts
        _training[0] = True

    def on_fit_end(self, trainer, pl_module) -> None:
        _training[0] = False  # after on_train_end's save: a signal meanwhile is noted, not the end of the save

    def on_exception(self, trainer, pl_module, exception) -> None:
        _training[0] = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.strategy.reduce_boolean_decision(bool(_received), all=False):
            self.stopping = trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        if self.stopping and trainer.global_step < trainer.max_steps:
            name = received().name if received() else "a stopping signal"
            say(f"{name}: the stage stops at step {trainer.global_step}; its checkpoint is last.ckpt")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        for logger in trainer.loggers:  # Lightning writes metrics.csv only every 100 steps and at the end
            logger.save()


def after_stop(out_dir: str | Path) -> None:
    """Once a run stopped on a signal: requeue the job (SIGUSR1 under SLURM, on rank 0), or say how it goes on."""
    signum, job = received(), slurm_job()
    if signum == signal.SIGUSR1 and job is not None:
        if is_rank0():
            _requeue(job, out_dir)
    elif job is not None and signum != signal.SIGINT:  # Ctrl-C on srun: the user's own stop
        say(
            f"stopped on {signum.name}: a preempted or requeued job starts again by itself and resumes; "
            f"after scancel, `scontrol requeue {job}` resumes it"
        )
    else:
        say(f"stopped on {signum.name}: continue with trainer.out_dir={out_dir} resume=true")


def _requeue(job: str, out_dir: str | Path) -> None:
    # Said before asking: SLURM ends the job's processes as it requeues it, possibly before scontrol returns.
    print(f"stopped before the time limit: requeueing job {job}; it resumes the run in {out_dir}", flush=True)
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if proc.returncode != 0:
        print(
            f"`scontrol requeue {job}` failed ({proc.stderr.strip()}); "
            f"submit the job with --requeue, or resume with trainer.out_dir={out_dir} resume=true",
            flush=True,
        )

"""Train an LWM-style model: python train.py [group=option ...] [key=value ...]

With no arguments: the debug model learns LWM's needle on the bundled sample data through the quick
progressive schedule on CPU (128 -> 512 -> 2K tokens), then the needle grid is printed. See conf/
for the groups (model, data, parallel, schedule, trainer, optim, experiment) and the README for
multi-GPU, torchrun and SLURM launches.
"""
# ruff: noqa: E402 (the stopping signals are held back before the imports, which take seconds)

import signal

# SLURM's warning before a time limit (SIGUSR1) kills a process that has no handler for it yet: until
# lwm.train.requeue handles them, the stopping signals wait, blocked, instead of killing the run unsaved.
signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGUSR1, signal.SIGTERM))

import sys
import time
from contextlib import nullcontext
from pathlib import Path

import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lwm.checkpoint_io import CheckpointError
from lwm.data import ExampleError, SkippedTooMany
from lwm.io import NoSpaceLeft, write_atomic
from lwm.out_lock import FolderLocked, output_lock
from lwm.train import requeue
from lwm.train.config import check_files, validate
from lwm.train.console import is_rank0, quiet_lightning, say
from lwm.train.entry import ensure_sample_data, to_run_config
from lwm.train.plan.preflight import WillNotFit
from lwm.train.run import run_schedule
from lwm.train.skipped import summary as skipped_summary
from lwm.weights import WeightsError

EXIT_NO_SPACE = 3  # as lwm-tokenize: 2 is bad input, 3 a full disk


def end_process_groups() -> None:
    """Every rank waits for the others, then ends the process groups the run started: a gloo rank
    whose groups are still alive as the interpreter exits can abort ("terminate called without an
    active exception"), and under srun --kill-on-bad-exit that fails the whole job."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        run = to_run_config(cfg)
        run.resume = requeue.resumes(run.resume, run.trainer.out_dir)  # a requeued SLURM job goes on by itself
        validate(run)
        if run.data.sample and is_rank0():
            ensure_sample_data(run.data)
            check_files(run)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    quiet_lightning()
    out = Path(run.trainer.out_dir)
    start = time.perf_counter()
    try:  # rank 0 holds the folder for the run: a second run on it is refused
        with output_lock(out, "train") if is_rank0() else nullcontext():
            if is_rank0():
                write_atomic(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
                say(
                    f"run {out}: model {HydraConfig.get().runtime.choices.get('model')}, schedule "
                    f"{run.schedule.name} ({len(run.schedule.stages)} stages), {run.trainer.world_size} process(es)"
                )
            where = run_schedule(run)
    except (FolderLocked, CheckpointError, WeightsError, WillNotFit) as e:  # a stage's start weights too
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (ExampleError, SkippedTooMany) as e:  # the training data: a bad example under data.strict, mostly bad data
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except NoSpaceLeft as e:
        print(f"error: {e}; free space and rerun with resume=true (finished stages are kept)", file=sys.stderr)
        sys.exit(EXIT_NO_SPACE)
    end_process_groups()
    if "stopped" in where and requeue.received():
        requeue.after_stop(out)
    say(f"\nfinished in {time.perf_counter() - start:.0f}s")
    for what, path in where.items():
        say(f"  {what:13s} {path}")
    say(f"  {'logs':13s} {out}/<stage>/logs/metrics.csv, TensorBoard: tensorboard --logdir {out}")
    for line in skipped_summary(out, [stage.name for stage in run.schedule.stages]):
        say(line)


if __name__ == "__main__":
    with requeue.stop_signals_noted():  # those held back meanwhile included
        main()

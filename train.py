"""Train an LWM-style model: python train.py [group=option ...] [key=value ...]

With no arguments: the tiny model on the bundled sample data through the tiny progressive schedule
on CPU. See conf/ for the groups (model, data, parallel, schedule, trainer, optim, experiment) and
the README for multi-GPU, torchrun and SLURM launches.
"""

import os
import sys
import time

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from lwm.train.entry import ensure_sample_data, to_run_config
    from lwm.train.run import run_schedule, validate

    try:
        run = to_run_config(cfg)
        validate(run)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    is_rank0 = os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"
    if run.data.sample and is_rank0:
        ensure_sample_data(run.data)
    start = time.perf_counter()
    where = run_schedule(run)
    if is_rank0:
        print(f"\nfinished in {time.perf_counter() - start:.0f}s")
        for what, path in where.items():
            print(f"  {what:13s} {path}")
        out = run.trainer.out_dir
        print(f"  {'logs':13s} {out}/<stage>/logs/metrics.csv, TensorBoard: tensorboard --logdir {out}")
        print(f"  {'checkpoints':13s} {out}/<stage>/checkpoints/")


if __name__ == "__main__":
    main()

"""The Lightning Trainer of one stage: its strategy (one CPU process plainly, else FSDP2 x context
parallelism through our ModelParallelStrategy), checkpoint IO, loggers and callbacks; and Lightning's
start-up chatter (accelerator lines, tips, deprecation notes from its internals) turned down to warnings."""

from __future__ import annotations

import logging
import warnings
from datetime import timedelta

import lightning as L
import torch

from lwm.core.config import RunConfig, StageSetup, TrainerConfig
from lwm.disk.stage_folder import LOGS, TB, StageFolder
from lwm.parallel.dims import ParallelDims
from lwm.parallel.mesh import lightning_sizes
from lwm.train.callbacks import MetricHistory, MetricsCSV, MetricsTensorBoard, PeakMemory, StageProgress, Throughput
from lwm.train.checkpointing import AtomicCheckpointIO, AtomicModelParallelStrategy, StageCheckpoint
from lwm.train.module import LWMModule
from lwm.train.probe import AnswerProbe
from lwm.train.requeue import StopOnSignal
from lwm.train.skipped import SkippedExamples


def strategy(dims: ParallelDims, trainer_cfg: TrainerConfig, param_offload: bool = False):
    # On GPUs FSDP2 runs even on one device: it is what computes in bf16 on fp32 master weights
    # (lwm.parallel.parallelize); one CPU process trains the plain model.
    gpu = trainer_cfg.accelerator in ("gpu", "cuda") or (
        trainer_cfg.accelerator == "auto" and torch.cuda.is_available()
    )
    if trainer_cfg.world_size == 1 and not gpu:
        return "auto"
    return AtomicModelParallelStrategy(
        **lightning_sizes(dims), timeout=timedelta(seconds=trainer_cfg.timeout_s), params_on_host=param_offload
    )


def build_trainer(
    cfg: RunConfig, setup: StageSetup, folder: StageFolder, module: LWMModule, history: MetricHistory
) -> L.Trainer:
    """The Trainer of a stage as run_stage resolved it (lwm.core.config.resolve_stage), writing into its stage
    folder."""
    stage, dims = setup.stage, setup.dims
    chosen = strategy(dims, cfg.trainer, cfg.parallel.param_offload)
    return L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=chosen,
        plugins=[AtomicCheckpointIO()] if chosen == "auto" else None,  # the strategy writes sharded ones
        precision=cfg.trainer.precision,
        max_steps=min(stage.steps, cfg.stop_at_step or stage.steps),  # validate: >= 1 or None
        log_every_n_steps=cfg.trainer.log_every,
        logger=[
            MetricsCSV(folder.path.parent, name=folder.path.name, version=LOGS),
            MetricsTensorBoard(folder.path.parent, name=folder.path.name, version=TB),
        ],
        callbacks=[
            StageCheckpoint(
                folder.checkpoints, cfg.trainer.checkpoint_every, stage.steps, cfg.trainer.keep_checkpoints
            ),
            StageProgress(stage.name, stage.steps),
            history,
            Throughput(setup.model, stage.seq_len, setup.global_batch, cfg.trainer.peak_tflops),
            PeakMemory(),
            StopOnSignal(),
            SkippedExamples(folder.path, dims.tp),
        ]
        + ([AnswerProbe(cfg.probe, folder.path, stage.name, stage.steps)] if cfg.probe.path else []),
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_model_summary=False,
        default_root_dir=folder.path,
        # val/loss on data.holdout every trainer.val_every steps (0: at the stage's last step)
        limit_val_batches=1.0 if cfg.data.holdout else 0,
        check_val_every_n_epoch=None,
        val_check_interval=cfg.trainer.val_every or stage.steps,
    )


def quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    # on a machine with SLURM installed, every run not started by srun (torchrun, a local run) is told to use it
    warnings.filterwarnings("ignore", message=r".*The `srun` command is available on your system but is not used.*")
    # the step is one function under manual optimization (lwm.core.step): a checkpoint at a step's end holds
    # the state after that step's optimizer step, as resuming wants
    warnings.filterwarnings("ignore", message=r".*ModelCheckpoint with manual optimization and every_n_train_steps.*")
    # a resumed stage writes into its own folders on purpose
    warnings.filterwarnings("ignore", message=r".*(Checkpoint|Experiment logs) directory .* exists and is not empty.*")

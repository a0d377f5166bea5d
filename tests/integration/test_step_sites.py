"""LWMModule.training_step and lwm-plan's tracked step run one function (lwm.core.step.train_step): a step
through Lightning (its loader's workers started) and the planner's give the same objective."""

from __future__ import annotations

import sys

import lightning as L
import torch

from lwm.core import step as step_file
from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.data.batches import Sharding, shard_batch
from lwm.model import ModelConfig
from lwm.parallel import compute_settings
from lwm.plan.memory import Mesh, plan_step
from lwm.train.module import LWMModule

DEBUG = ModelConfig.from_preset("debug")
SEQ = 64


def _loader(steps: int):
    torch.manual_seed(0)
    tokens = torch.randint(0, DEBUG.vocab_size, (1, SEQ + 1))
    full = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_weight": torch.ones(1, SEQ),
        "vision_mask": torch.zeros(1, SEQ, dtype=torch.bool),
        "segment_ids": torch.zeros(1, SEQ, dtype=torch.long),
    }
    batches = [shard_batch(full, Sharding(), "sequence")] * steps  # one process: the whole sequence
    return torch.utils.data.DataLoader(batches, batch_size=None)


def test_lightning_and_the_planner_run_one_step_function(monkeypatch):
    """The objective is computed inside lwm.core.step.train_step, called from both: a step
    re-assembled anywhere else (a copy in module.py, in the planner) calls it from another function
    and fails here. Lightning drives it by manual optimization: it counts the optimizer's steps and
    the step function steps the schedule."""
    objective, callers = step_file.training_objective, []

    def recording(*args, **kwargs):
        callers.append(sys._getframe(1).f_code)  # the function that computed the objective
        return objective(*args, **kwargs)

    monkeypatch.setattr(step_file, "training_objective", recording)
    stage = StageConfig("a", seq_len=SEQ, rope_theta=1e4, steps=4, lr=1e-3, warmup_steps=2)
    parallel = ParallelConfig(document_mask=False)
    module = LWMModule(DEBUG, stage, OptimConfig(), parallel)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        log_every_n_steps=1,  # the metrics beside the loss are logged at the steps Lightning writes rows
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, _loader(2))
    lightning, callers[:] = list(callers), []
    assert trainer.global_step == 2 and module.lr_schedulers().last_epoch == 2
    assert set(trainer.callback_metrics) >= {"train/loss", "train/grad_norm", "train/lr"}

    settings = compute_settings(torch.device("cpu"), DEBUG.head_dim)
    plan_step(DEBUG, stage, Mesh(SEQ, 1, 1), parallel, OptimConfig(), settings)
    planned = list(callers)
    assert lightning == [step_file.train_step.__code__] * 2, lightning
    assert planned == [step_file.train_step.__code__], planned

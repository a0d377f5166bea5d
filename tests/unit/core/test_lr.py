"""The learning-rate factor (lwm/core/lr.py): its values in closed form, and both runs' schedules
(the LM's lr_lambda, the VQGAN's _lr_factor) giving, step for step, what they gave before they
shared it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from lwm.core.config import StageConfig
from lwm.core.lr import lr_factor
from lwm.core.step import lr_lambda
from lwm.vision import VQGANConfig
from lwm.vqgan_training.config import VQGANTrainConfig
from lwm.vqgan_training.lit_vqgan import LitVQGAN

RATIOS = (0.0, 0.1, 0.2, 1 / 3, 0.5, 0.7, 1.0)


@pytest.mark.parametrize(
    ("step", "warmup", "expected"),
    [(0, 0, 1.0), (7, 0, 1.0), (0, 4, 0.25), (2, 4, 0.75), (3, 4, 1.0), (9, 4, 1.0)],
)
def test_constant_is_the_warm_up_ramp(step, warmup, expected):
    for progress in (0.0, 0.5, 1.0):  # ignored by 'constant'
        got = lr_factor(step, warmup_steps=warmup, schedule="constant", min_lr_ratio=0.1, progress=progress)
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25])
def test_cosine_at_known_angles(ratio):
    # cos(pi p) is 1, 1/2, 0, -1/2, -1 at p = 0, 1/3, 1/2, 2/3, 1
    known = {0.0: 1.0, 1 / 3: ratio + 0.75 * (1 - ratio), 0.5: (1 + ratio) / 2, 2 / 3: ratio + 0.25 * (1 - ratio)}
    known[1.0] = ratio
    for progress, expected in known.items():
        got = lr_factor(9, warmup_steps=0, schedule="cosine", min_lr_ratio=ratio, progress=progress)
        assert got == pytest.approx(expected)
        # during warm-up the cosine is scaled by the ramp: step 1 of 4 is half the LR
        got = lr_factor(1, warmup_steps=4, schedule="cosine", min_lr_ratio=ratio, progress=progress)
        assert got == pytest.approx(expected / 2)


def old_lm_factor(stage: StageConfig, step: int) -> float:
    if step < stage.warmup_steps:
        return (step + 1) / stage.warmup_steps
    if stage.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - stage.warmup_steps) / max(1, stage.steps - stage.warmup_steps))
    return stage.min_lr_ratio + (1 - stage.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
@pytest.mark.parametrize(("steps", "warmup"), [(1, 0), (1, 1), (10, 0), (10, 3), (10, 10), (37, 5)])
def test_lm_schedule_is_unchanged(schedule, steps, warmup):
    for ratio in RATIOS:
        kw = dict(warmup_steps=warmup, schedule=schedule, min_lr_ratio=ratio)
        stage = StageConfig("a", seq_len=8, rope_theta=1e4, steps=steps, lr=1e-3, **kw)
        factor = lr_lambda(stage)
        for step in range(steps + 3):  # a few past the end too
            assert factor(step) == old_lm_factor(stage, step), (ratio, step)


def old_vqgan_factor(cfg: VQGANTrainConfig, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    if cfg.lr_schedule == "constant":
        return warm
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return warm * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 4])
def test_vqgan_schedule_is_unchanged(schedule, warmup):
    max_steps = 12
    for ratio in RATIOS:
        cfg = VQGANTrainConfig(batch_size=2, lr_schedule=schedule, warmup_steps=warmup, min_lr_ratio=ratio)
        lit = LitVQGAN(VQGANConfig.from_preset("tiny"), cfg)
        lit._trainer = SimpleNamespace(max_steps=max_steps, global_step=0, callbacks=[])  # budget: steps only
        factor = lit._lr_factor()
        for step in range(max_steps + 1):
            lit._trainer.global_step = step  # the progress LambdaLR sees after `step` optimizer steps
            assert factor(step) == old_vqgan_factor(cfg, step, step / max_steps), (ratio, step)

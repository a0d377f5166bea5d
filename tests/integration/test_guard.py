"""The guard on every training step (lwm.train.module.LWMModule._guard, lwm.core.step.train_step):
a loss or gradient norm that is not finite stops the run with exit 5 naming the stage, the step and
the values, before the step's update; the last good checkpoint is kept and non-finite weights are
never written (a checkpoint, final.safetensors). optim.max_nonfinite_steps skips that many such
steps (no update) before stopping.

A learning rate of 1e30 is finite (the config accepts it) and sends the weights to 1e30 at step 0:
step 1's loss is nan."""

from __future__ import annotations

import torch
from train_runs import main_in_process

from lwm.core.config import OptimConfig, StageConfig
from lwm.core.step import build_optimizer, train_step
from lwm.disk.checkpoints import load_verified
from lwm.model import ModelConfig, Transformer
from lwm.train.module import LWMModule

EXIT_NONFINITE = 5


def run(tmp_path, monkeypatch, capsys, *overrides):
    return main_in_process(monkeypatch, capsys, tmp_path, "stage_only=a", "schedule.stages.0.steps=4", *overrides)


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    code, _, err = run(
        tmp_path,
        monkeypatch,
        capsys,
        "schedule.stages.0.lr=1e30",
        "schedule.stages.0.steps=2",
        "trainer.checkpoint_every=1",
    )
    assert code == EXIT_NONFINITE, err[-3000:]
    assert "stage 'a' step 1: loss nan, gradient norm nan: not finite" in err, err[-3000:]
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert f"its last checkpoint {last} is kept" in err and "Traceback" not in err
    saved = load_verified(last)
    assert saved["global_step"] == 1  # step 0's, not the failing step's
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())
    assert not (tmp_path / "a" / "final.safetensors").exists()


def test_max_nonfinite_steps_skips_that_many_then_stops(tmp_path, monkeypatch, capsys):
    code, out, err = run(tmp_path, monkeypatch, capsys, "schedule.stages.0.lr=1e30", "optim.max_nonfinite_steps=2")
    assert code == EXIT_NONFINITE, err[-3000:]
    for step, n in ((1, 1), (2, 2)):
        assert f"step {step}: loss nan, gradient norm nan: not finite, its update skipped ({n} of" in out, out[-3000:]
    assert "stage 'a' step 3: loss nan" in err and "(3 such step(s), optim.max_nonfinite_steps=2" in err, err[-3000:]
    assert "it has no checkpoint yet" in err and not (tmp_path / "a" / "final.safetensors").exists()


def poison_after_step(monkeypatch, step: int) -> None:
    """An update that overflowed while its loss and gradient norm were finite: one weight is inf after `step`."""
    original = LWMModule.training_step

    def training_step(self, batch, batch_idx):
        loss = original(self, batch, batch_idx)
        if self.trainer.global_step == step + 1:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("inf")
        return loss

    monkeypatch.setattr(LWMModule, "training_step", training_step)


def test_weights_that_are_not_finite_are_never_checkpointed(tmp_path, monkeypatch, capsys):
    poison_after_step(monkeypatch, 1)
    code, _, err = run(tmp_path, monkeypatch, capsys, "schedule.stages.0.steps=3", "trainer.checkpoint_every=1")
    assert code == EXIT_NONFINITE, err[-3000:]
    assert "stage 'a' step 2: the weights hold values that are not finite; the checkpoint is not written" in err
    assert load_verified(tmp_path / "a" / "checkpoints" / "last.ckpt")["global_step"] == 1  # step 0's is kept


def test_weights_that_are_not_finite_are_never_written_as_final(tmp_path, monkeypatch, capsys):
    poison_after_step(monkeypatch, 0)
    code, _, err = run(tmp_path, monkeypatch, capsys, "schedule.stages.0.steps=1")
    assert code == EXIT_NONFINITE, err[-3000:]
    assert "stage 'a' step 1: the weights hold values that are not finite; final.safetensors is not written" in err
    assert not (tmp_path / "a" / "final.safetensors").exists()


def test_a_skipped_step_changes_no_weight_and_no_optimizer_state():
    """train_step's guard answering False: the update is dropped (AdamW's state untouched), the
    schedule still steps; answering True, the same step updates."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug"))
    stage = StageConfig("a", seq_len=16, rope_theta=1e4, steps=4, lr=1e-2, warmup_steps=2)
    optimizer, scheduler = build_optimizer(model, stage, OptimConfig())
    tokens = torch.randint(0, 256, (1, 17))
    batch = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "positions": torch.arange(16),
        "loss_weight": torch.ones(1, 16),
        "vision_mask": torch.zeros(1, 16, dtype=torch.bool),
        "segment_ids": torch.zeros(1, 16, dtype=torch.long),
    }
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []
    metrics = train_step(
        model, batch, optimizer, OptimConfig(), None, False, scheduler, guard=lambda *a: seen.append(a) or False
    )
    loss, norm, kinds = seen[0]
    assert torch.equal(loss, metrics.loss) and torch.equal(norm, metrics.grad_norm)
    assert (
        kinds[1] == 16 and kinds[3] == 0 and kinds[0] / kinds[1] == metrics.loss
    )  # all text: the text mean is the loss
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not optimizer.state and scheduler.last_epoch == 1
    train_step(model, batch, optimizer, OptimConfig(), None, False, scheduler, guard=lambda *a: True)
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and optimizer.state

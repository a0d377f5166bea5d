"""The training metrics: the text and the vision loss logged apart (train/text_loss,
train/vision_loss beside train/loss), a metrics row at a stage's last step whatever
trainer.log_every is, and each stage's last losses in the summary the run prints at its end."""

from __future__ import annotations

import csv

import pytest
import torch
from train_runs import main_in_process

from lwm.core.config import OptimConfig, StageConfig
from lwm.core.step import build_optimizer, kind_losses, train_step
from lwm.model import ModelConfig, Transformer


def test_a_short_stage_logs_its_last_step_and_the_summary_its_losses(tmp_path, monkeypatch, capsys):
    """4 steps at log_every 5 wrote no row at all."""
    code, out, err = main_in_process(
        monkeypatch, capsys, tmp_path, "stage_only=a", "schedule.stages.0.steps=4", "trainer.log_every=5"
    )
    assert code == 0, err[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "a" / "logs" / "metrics.csv")))
    assert [r["step"] for r in rows if r.get("train/loss")] == ["3"]
    row = next(r for r in rows if r.get("train/loss"))
    assert float(row["train/text_loss"]) == pytest.approx(float(row["train/loss"]), rel=1e-5)  # text only
    assert not row.get("train/vision_loss")  # no vision target in the step: no value rather than a made-up one
    assert f"  loss a        step 3: {float(row['train/loss']):.4f} (text {float(row['train/text_loss']):.4f})" in out


def test_each_row_has_its_own_steps_kind_losses(tmp_path, monkeypatch, capsys):
    """The sample's captions in both directions: a step whose examples give video targets has a vision
    loss, one whose examples do not has none. Lightning keeps a key's last value for a step that does
    not log it, so a step without video targets showed the previous step's vision loss (the row's loss
    equal to its text loss beside it). With LWM's weights 0.5 / 0.5 the row's loss is the mean of its
    kinds' losses, or the one kind's it had (1e-4)."""
    code, out, err = main_in_process(
        monkeypatch, capsys, tmp_path, "stage_only=a", "schedule.stages.0.sources=[captions,text]",
        "schedule.stages.0.seq_len=2048", "schedule.stages.0.batch_size=1", "schedule.stages.0.steps=8",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    rows = [r for r in csv.DictReader(open(tmp_path / "a" / "logs" / "metrics.csv")) if r.get("train/loss")]
    assert len(rows) == 8
    kinds = {"text": 0, "vision": 0, "both": 0}
    for r in rows:
        loss, text, vision = (
            float(r[k]) if r.get(k) else None for k in ("train/loss", "train/text_loss", "train/vision_loss")
        )
        if text is not None and vision is not None:
            kinds["both"] += 1
            assert loss == pytest.approx((text + vision) / 2, rel=1e-4), r
        else:
            kinds["text" if vision is None else "vision"] += 1
            assert loss == pytest.approx(text if vision is None else vision, rel=1e-4), r
    assert kinds["both"] and kinds["text"], kinds  # seed 0: 6 steps with video targets, 2 without


def test_text_and_vision_losses_are_each_kinds_mean():
    """Losses.kinds, summed over ranks, give each kind's mean cross entropy; with LWM's 0.5 / 0.5
    the step's loss is their mean."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug"))
    optimizer, _ = build_optimizer(model, StageConfig("a", seq_len=32, rope_theta=1e4, steps=1, lr=1e-3), OptimConfig())
    tokens = torch.randint(0, 256, (1, 33))
    vision = torch.zeros(1, 32, dtype=torch.bool)
    vision[:, 10:26] = True
    weight = torch.ones(1, 32)
    weight[:, :4] = 0  # a prompt without loss
    batch = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "positions": torch.arange(32),
        "loss_weight": weight,
        "vision_mask": vision,
        "segment_ids": torch.zeros(1, 32, dtype=torch.long),
    }
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model(batch["tokens"])[0], batch["targets"][0], reduction="none")
    want_text, want_vision = ce[4:10].tolist() + ce[26:].tolist(), ce[10:26].tolist()
    got = []
    metrics = train_step(model, batch, optimizer, OptimConfig(), None, False, guard=lambda *a: got.append(a) or True)
    text, vision_loss = kind_losses(got[0][2])
    assert text == pytest.approx(sum(want_text) / len(want_text), rel=1e-5)
    assert vision_loss == pytest.approx(sum(want_vision) / len(want_vision), rel=1e-5)
    assert metrics.loss.item() == pytest.approx(0.5 * text + 0.5 * vision_loss, rel=1e-5)
    assert kind_losses(torch.tensor([2.0, 4.0, 0.0, 0.0])) == (0.5, None)  # a kind without targets has no loss


def test_a_sparse_row_holds_its_own_steps_values(tmp_path, monkeypatch, capsys):
    """The step's metrics other than the loss are logged only where Lightning writes a row (LWMModule.
    on_train_batch_end): at log_every 3 the rows (steps 2, 5, 8 and the last, 9, where a callback stops the
    stage) hold what the same run logs at those steps at log_every 1, every column but the measured ones."""
    every = {"train/lr", "train/grad_norm", "train/text_loss", "train/loss"}
    rows = {}
    for log_every in (1, 3):
        out = tmp_path / str(log_every)
        common = ["stage_only=a", "schedule.stages.0.steps=10", "+schedule.stages.0.warmup_steps=10"]
        code, _, err = main_in_process(monkeypatch, capsys, out, *common, f"trainer.log_every={log_every}")
        assert code == 0, err[-3000:]
        table = [r for r in csv.DictReader(open(out / "a" / "logs" / "metrics.csv")) if r.get("train/loss")]
        rows[log_every] = {r["step"]: {k: v for k, v in r.items() if not k.startswith("perf/")} for r in table}
    assert sorted(rows[3], key=int) == ["2", "5", "8", "9"] and len(rows[1]) == 10
    for step, row in rows[3].items():
        assert every <= {k for k, v in row.items() if v}, row
        assert row == rows[1][step], step
    lrs = [float(rows[1][str(s)]["train/lr"]) for s in range(10)]
    assert len(set(lrs)) == 10  # warm-up: each step its own lr, so a row holding another step's shows

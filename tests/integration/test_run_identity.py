"""A run's identity is what changes its weights: a stopped run's rerun may change how it reads its data and
how it tiles the model's work (the memory features the preflight suggests), and a folder whose run never
finished a step holds no run yet. train.py's main runs in this process."""

from __future__ import annotations

import json

from omegaconf import OmegaConf
from train_runs import ROOT, main_in_process

from lwm.disk.run_folder import differences

SHORT = ["stage_only=a", "schedule.stages.0.steps=2"]
# what the preflight suggests when a stage does not fit, and how the data is read: none changes the weights
MEMORY = [
    "model.mlp_chunk_size=16",
    "model.norm_chunk_size=16",
    "model.attn_head_groups=2",
    "model.loss_chunk_size=64",
]


def main(monkeypatch, capsys, out, *overrides) -> tuple[int, str]:
    code, stdout, stderr = main_in_process(monkeypatch, capsys, out, *overrides)
    return code, stdout + stderr


def test_only_what_changes_the_weights_differs():
    old = {
        "model": {"dim": 64, "mlp_chunk_size": 0, "norm_chunk_size": 0, "attn_head_groups": 1, "loss_chunk_size": 256},
        "data": {"num_workers": 2, "index_workers": 8, "index_dir": None, "seed": 0},
    }
    new = {
        "model": {"dim": 64, "mlp_chunk_size": 32, "norm_chunk_size": 64, "attn_head_groups": 2, "loss_chunk_size": 16},
        "data": {"num_workers": 0, "index_workers": 1, "index_dir": "/tmp/idx", "seed": 0},
    }
    assert differences(old, new) == []
    # what a rerun does about a changed source or a non-finite step: policies its refusals name
    policies = {"data": {**old["data"], "on_changed_source": "restart_epoch"}, "optim": {"max_nonfinite_steps": 3}}
    assert differences({**old, "optim": {"max_nonfinite_steps": 0}}, {**old, **policies}) == []
    # how the CPU computes below fp32's normal range: a run recorded before the field existed resumes with it on
    assert differences({**old, "trainer": {"seed": 0}}, {**old, "trainer": {"seed": 0, "flush_denormal": True}}) == []
    # kept attention trains bitwise as recompute does: a run recorded before keep_attention_blocks resumes with it
    kept = {"keep_attention": True, "keep_attention_blocks": 24}
    assert differences({**old, "parallel": {"tp": 1}}, {**old, "parallel": {"tp": 1, **kept}}) == []
    assert differences(old, {**new, "model": {**new["model"], "dim": 128}}) == ["model.dim: 64 -> 128"]
    assert differences(old, {**new, "data": {**new["data"], "seed": 1}}) == ["data.seed: 0 -> 1"]


def test_a_stopped_run_resumes_with_the_memory_features_the_preflight_suggests(tmp_path, monkeypatch, capsys):
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, "stop_at_step=1")
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert code == 4 and last.is_file(), text[-3000:]
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, *MEMORY)
    assert code == 0 and "holds another run" not in text and f"(resuming from {last})" in text, text[-3000:]
    assert (tmp_path / "a" / "final.safetensors").is_file()
    assert OmegaConf.load(tmp_path / "config.yaml").model.mlp_chunk_size == 16  # the command's, recorded


def test_a_command_refused_before_its_first_step_holds_no_run(tmp_path, monkeypatch, capsys):
    """One short example cannot fill stage a's batch of 2 sequences: refused (exit 2) as the stage starts,
    after config.yaml is written. The command run again with the batch the message suggests lowering
    trains there, instead of being refused as another run; once it has, another batch is refused."""
    source = tmp_path / "one.jsonl"
    source.write_text(json.dumps({"text": "the red circle moves left"}) + "\n")
    data = ["data=custom", "data.tokenizer=data/sample/tokenizer.model"]
    data += [f"data.sources={{text: {{path: {source}, fields: text}}}}", *SHORT]
    out = tmp_path / "run"
    code, text = main(monkeypatch, capsys, out, *data)
    assert code == 2 and "yield fewer than one global batch" in text, text[-3000:]
    assert (out / "config.yaml").is_file() and not (out / "a" / "final.safetensors").exists()
    code, text = main(monkeypatch, capsys, out, *data, "schedule.stages.0.batch_size=1")
    assert code == 0 and "holds another run" not in text, text[-3000:]
    assert (out / "a" / "final.safetensors").is_file()
    code, text = main(monkeypatch, capsys, out, *data)
    assert code == 2 and "holds another run" in text and "schedule.stages.0.global_batch: 1 -> 2" in text, text


def test_a_finished_step_is_final_weights_a_checkpoint_or_a_metrics_row(tmp_path):
    from lwm.disk.run_folder import stepped

    config = {"schedule": {"stages": [{"name": "a"}, {"name": "b"}]}}
    (tmp_path / "b" / "logs").mkdir(parents=True)
    (tmp_path / "b" / "checkpoints").mkdir()
    (tmp_path / "b" / "model_config.json").write_text("{}")
    (tmp_path / "b" / "logs" / "metrics.csv").write_text("step,train/loss\n")  # a header only
    assert not stepped(tmp_path, config)
    (tmp_path / "b" / "logs" / "metrics.csv").write_text("step,train/loss\n0,9.1\n")
    assert stepped(tmp_path, config)
    (tmp_path / "b" / "logs" / "metrics.csv").unlink()
    (tmp_path / "b" / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert stepped(tmp_path, config)
    (tmp_path / "b" / "checkpoints" / "last.ckpt").unlink()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "final.safetensors").write_bytes(b"x")
    assert stepped(tmp_path, config)


def test_loader_workers_and_the_index_folder_give_the_same_batches(tmp_path):
    """data.num_workers 0 and 2, the index beside the source or in data.index_dir: the same batches, so
    neither is part of what a run trains (index workers: tests/integration/test_data_index.py, the same index)."""
    import torch

    from lwm.data import DataConfig, Sharding, Source
    from lwm.train.datamodule import LWMDataModule

    source = tmp_path / "docs.jsonl"
    source.write_text(
        "".join(json.dumps({"text": f"the red circle moves left {i} " * (i % 5 + 1)}) + "\n" for i in range(60))
    )

    def batches(workers: int, index_dir=None) -> list[dict]:
        config = DataConfig(
            sources=[Source(str(source), fields="text")],
            tokenizer=str(ROOT / "data" / "sample" / "tokenizer.model"),
            batch_size=2,
            num_workers=workers,
            index_dir=index_dir,
        )
        dm = LWMDataModule(config, seq_len=64, sharding=Sharding())
        dm.setup()
        it = iter(dm.train_dataloader())
        return [dm.on_before_batch_transfer(next(it)) for _ in range(6)]

    plain = batches(0)
    for other in (batches(2), batches(0, tmp_path / "idx")):
        assert all(torch.equal(a[k], b[k]) for a, b in zip(plain, other) for k in a)


def test_a_stopped_run_resumes_with_on_changed_source_after_its_source_changed(tmp_path, monkeypatch, capsys):
    """The refusal of a changed source says to rerun with data.on_changed_source=restart_epoch: that rerun is
    the same run, not another."""
    source = tmp_path / "docs.jsonl"
    line = json.dumps({"text": "the red circle moves left and the blue square moves right"}) + "\n"
    source.write_text(line * 12)
    data = ["data=custom", "data.tokenizer=data/sample/tokenizer.model"]
    data += [f"data.sources={{text: {{path: {source}, fields: text}}}}", *SHORT]
    out = tmp_path / "run"
    code, text = main(monkeypatch, capsys, out, *data, "stop_at_step=1")
    assert code == 4, text[-3000:]
    source.write_text(line * 16)
    code, text = main(monkeypatch, capsys, out, *data, "data.on_changed_source=restart_epoch")
    assert code == 0 and "holds another run" not in text and "planned again" in text, text[-3000:]

"""A run folder is its run's: another config is refused there, the same command goes on where the run
is (never starting over), a finished run says so, and trainer.overwrite=true starts over. Also the
exit statuses a script reads: 0 finished, 2 refused (Hydra's own refusals included), 4 stopped.
train.py's main runs in this process."""

from __future__ import annotations

from omegaconf import OmegaConf
from train_runs import main_in_process

from lwm.disk.run_folder import clear, differences

SHORT = ["stage_only=a", "schedule.stages.0.steps=4"]


def main(monkeypatch, capsys, out, *overrides) -> tuple[int, str]:
    code, stdout, stderr = main_in_process(monkeypatch, capsys, out, *overrides)
    return code, stdout + stderr


def test_another_run_is_refused_and_a_finished_one_kept(tmp_path, monkeypatch, capsys):
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT)
    assert code == 0, text[-3000:]
    final = tmp_path / "a" / "final.safetensors"
    weights = final.read_bytes()

    # another seed into the finished run's folder: refused before anything is written, naming the key
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, "trainer.seed=1")
    assert code == 2 and "holds another run" in text and "trainer.seed: 0 -> 1" in text, text[-3000:]
    assert "Traceback" not in text and final.read_bytes() == weights
    assert OmegaConf.load(tmp_path / "config.yaml").trainer.seed == 0

    # the same command again: the run is finished, and says so; nothing is retrained
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, "trainer.log_every=2")  # a run-only key may differ
    assert code == 0 and f"run {tmp_path} is finished" in text and "stage a:" not in text, text[-3000:]
    assert final.read_bytes() == weights

    # trainer.overwrite=true starts over with the new config; a file of the user's in the folder stays
    (tmp_path / "notes.txt").write_text("mine")
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, "trainer.seed=1", "trainer.overwrite=true")
    assert code == 0 and f"removed {tmp_path / 'a'}" in text, text[-3000:]
    assert final.read_bytes() != weights and (tmp_path / "notes.txt").read_text() == "mine"
    assert OmegaConf.load(tmp_path / "config.yaml").trainer.seed == 1


def test_the_same_command_resumes_a_stopped_run(tmp_path, monkeypatch, capsys):
    """A stopped stage exits 4; the same command (no resume=true) continues from its checkpoint instead of
    starting over and deleting it; its metric rows are each there once."""
    import csv
    import json

    probe = ["probe.path=data/sample/needles/128/heldout.jsonl", "probe.examples=2", "trainer.log_every=1"]
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, *probe, "stop_at_step=2")
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert code == 4 and last.is_file() and "stopped in" in text, text[-3000:]
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, *probe)
    assert code == 0 and f"(resuming from {last})" in text, text[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "a" / "logs" / "metrics.csv")))
    assert sorted(int(r["step"]) for r in rows if r.get("train/loss")) == [0, 1, 2, 3]
    # the probe scores the stage's start once (step 0) and its end once (step 4), not the stop and the resume
    assert [int(r["step"]) for r in rows if r.get("probe/accuracy_start")] == [0]
    assert [int(r["step"]) for r in rows if r.get("probe/accuracy_end")] == [4]
    scored = json.loads((tmp_path / "a" / "probe.json").read_text())
    assert (scored["start"]["step"], scored["end"]["step"]) == (0, 4)


def test_a_malformed_override_exits_2(tmp_path, monkeypatch, capsys):
    """Hydra's own refusals (also an unknown config name: tests/integration/test_train.py) exit 2 like the project's."""
    code, text = main(monkeypatch, capsys, tmp_path / "run", "trainer.devices=[")
    assert code == 2 and "no viable alternative" in text, text[-2000:]
    assert not (tmp_path / "run").exists()


def test_differences_name_what_is_trained_only():
    old = {"model": {"dim": 64}, "trainer": {"seed": 0, "devices": 1}, "schedule": {"stages": [{"steps": 10}]}}
    new = {"model": {"dim": 64}, "trainer": {"seed": 0, "devices": 1}, "schedule": {"stages": [{"steps": 20}]}}
    assert (
        differences(old, old) == []
        and differences(old, {**old, "trainer": {"seed": 0, "devices": 1, "log_every": 3}}) == []
    )
    assert differences(old, new) == ["schedule.stages.0.steps: 10 -> 20"]
    # a stage by its global batch, not by how the ranks split it: 2 per rank x dp 2 == global_batch 4 on cp 2 x dp 2
    split = {"trainer": {"devices": 2}, "schedule": {"stages": [{"batch_size": 2}]}}
    other = {"trainer": {"devices": 4}, "schedule": {"stages": [{"cp": 2, "global_batch": 4}]}}
    assert differences(split, other) == []
    assert differences(split, {**split, "trainer": {"devices": 4}}) == ["schedule.stages.0.global_batch: 4 -> 8"]
    assert differences(old, {**old, "optim": {"lr": 1.0}}) == ["optim.lr: '<none>' -> 1.0"]


def test_clear_removes_only_the_run_files(tmp_path):
    for name in ("a", "b", "hf", "needle", "mine"):
        (tmp_path / name).mkdir()
    (tmp_path / "config.yaml").write_text("schedule: {stages: [{name: b}, {name: ../x}]}\n")
    removed = clear(tmp_path, ["a"])
    assert sorted(p.name for p in removed) == ["a", "b", "config.yaml", "hf", "needle"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_kill_right_after_a_checkpoint_keeps_that_steps_metrics_row(tmp_path, monkeypatch, capsys):
    """Lightning writes a step's metrics row after the step's checkpoint: a run that dies between the two
    (here: right after the periodic checkpoint of step 4, before row 3 is written) resumes with every row."""
    import csv

    import lightning.pytorch as pl

    class Killed(Exception):
        pass

    save = pl.Trainer.save_checkpoint

    def save_then_die(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if self.global_step == 4:
            raise Killed

    def rows() -> list[int]:
        return [
            int(r["step"]) for r in csv.DictReader(open(tmp_path / "a" / "logs" / "metrics.csv")) if r.get("train/loss")
        ]

    run = ["stage_only=a", "schedule.stages.0.steps=6", "trainer.log_every=1", "trainer.checkpoint_every=4"]
    with monkeypatch.context() as patch:
        patch.setattr(pl.Trainer, "save_checkpoint", save_then_die)
        code, text = main(patch, capsys, tmp_path, *run)  # Hydra reports the exception, status 1
    assert code == 1 and "Killed" in text, text[-3000:]
    assert rows() == [0, 1, 2]  # the checkpoint of step 4 is whole, the row of its last batch not written
    code, text = main(monkeypatch, capsys, tmp_path, *run)
    assert code == 0 and "(resuming from" in text, text[-3000:]
    assert rows() == [0, 1, 2, 3, 4, 5]

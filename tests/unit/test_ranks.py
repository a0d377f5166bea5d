"""lwm.ranks.is_rank0 is the one answer to "am I the rank that writes and prints": read from the
launchers' variables before a process group exists, and asked by what writes (the probe's file, the
restored metrics rows, video QA's records and bar) rather than each asking a rank of its own."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from char_tokenizer import Tok
from lightning.pytorch.loggers import CSVLogger
from video_qa_stubs import Oracle, StubSource, mc_items

from lwm.data.vocab import Vocab
from lwm.eval import video_qa as vqa
from lwm.ranks import RANK_VARIABLES, is_rank0
from lwm.train import probe
from lwm.train.callbacks import MetricHistory


@pytest.fixture
def plain(monkeypatch):
    """A process no launcher started."""
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def second(plain, monkeypatch):
    """The second worker of a launch, before any process group: its trainer or group may still say 0."""
    monkeypatch.setenv("RANK", "1")


def test_a_plain_process_is_rank0(plain):
    assert is_rank0()


@pytest.mark.parametrize("name", RANK_VARIABLES)
def test_another_rank_of_any_launcher_is_not(plain, monkeypatch, name):
    monkeypatch.setenv(name, "1")
    assert not is_rank0()


def run_probe(tmp_path, monkeypatch) -> bool:
    """Whether the probe wrote probe.json, under a trainer whose own global_rank is 0."""
    monkeypatch.setattr(probe.AnswerProbe, "accuracy", lambda self, module, sharding, positions: (0.5, 2))
    data = SimpleNamespace(sharding=None, config=SimpleNamespace(positions=None))
    trainer = SimpleNamespace(datamodule=data, loggers=[], global_step=3, global_rank=0)
    probe.AnswerProbe(None, tmp_path, "a", 10)._run(trainer, None, "start")
    if not (tmp_path / "probe.json").exists():
        return False
    assert json.loads((tmp_path / "probe.json").read_text())["start"]["accuracy"] == 0.5
    return True


def test_the_probe_is_written_by_rank0(plain, tmp_path, monkeypatch):
    assert run_probe(tmp_path, monkeypatch)


def test_the_probe_is_not_written_by_another_rank(second, tmp_path, monkeypatch):
    assert not run_probe(tmp_path, monkeypatch)


def restore_metrics(tmp_path) -> bool:
    """Whether the kept metrics rows were logged again, under a trainer whose own global_rank is 0."""
    logger = CSVLogger(tmp_path, name="", version="")
    trainer = SimpleNamespace(loggers=[logger], global_step=5, global_rank=0)
    MetricHistory([{"step": "1", "loss": "2.5"}]).on_train_start(trainer, None)
    return (tmp_path / "metrics.csv").exists()


def test_metrics_are_restored_by_rank0(plain, tmp_path):
    assert restore_metrics(tmp_path)


def test_metrics_are_not_restored_by_another_rank(second, tmp_path):
    assert not restore_metrics(tmp_path)


def video_qa_records(tmp_path) -> list[dict]:
    """The records video QA hands to on_record (the command's writer), with a single-process generator."""
    tok, items, seen = Tok(), mc_items(tmp_path), []
    result = vqa.run_video_qa(
        Oracle(tok, items), tok, Vocab(Tok.vocab_size), items, StubSource(), on_record=seen.append
    )
    assert len(result["records"]) == len(items)  # every rank scores every item
    return seen


def test_video_qa_records_are_written_by_rank0(plain, tmp_path):
    assert len(video_qa_records(tmp_path)) == 4


def test_video_qa_records_are_not_written_by_another_rank(second, tmp_path):
    assert video_qa_records(tmp_path) == []

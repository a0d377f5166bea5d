"""A checkpoint's data position records what it means (each source's size, modification time and a hash of
its index's token counts): a source appended to, replaced or truncated before the resume is refused naming
it, or with data.on_changed_source=restart_epoch the epoch's plan starts again from the source as it is."""

from __future__ import annotations

import json
import os

import pytest
import torch

from lwm.data import DataConfig, Sharding, Source, StaleIndex
from lwm.data.stream import SourceChanged
from lwm.train.datamodule import LWMDataModule


def write(path, n: int, tag: str = "") -> None:
    path.write_text("".join(json.dumps({"text": f"the red circle moves {tag}{i}"}) + "\n" for i in range(n)))


def datamodule(spm_model, path, **options) -> LWMDataModule:
    config = DataConfig(sources=[Source(str(path), fields="text")], tokenizer=str(spm_model), num_workers=0, **options)
    dm = LWMDataModule(config, seq_len=32, sharding=Sharding())
    dm.setup()
    return dm


def take(dm, n: int) -> list[dict]:
    it = iter(dm.train_dataloader())
    return [dm.on_before_batch_transfer(next(it)) for _ in range(n)]


def stopped(spm_model, path, batches: int = 3) -> dict:
    dm = datamodule(spm_model, path)
    take(dm, batches)
    return dm.state_dict()


CHANGES = {
    "appended": lambda p: write(p, 30),
    "truncated": lambda p: write(p, 8),
    "replaced": lambda p: write(p, 20, tag="blue square "),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_source_is_refused_on_resume_naming_it(spm_model, tmp_path, change):
    path = tmp_path / "docs.jsonl"
    write(path, 20)
    state = stopped(spm_model, path)
    assert state["sources"][0]["path"] == str(path) and state["sources"][0]["examples"] == 20
    CHANGES[change](path)
    resumed = datamodule(spm_model, path)
    with pytest.raises(SourceChanged, match=rf"{path} \(.*\).*data\.on_changed_source=restart_epoch") as info:
        resumed.load_state_dict(state)
    assert isinstance(info.value, StaleIndex)  # train.py's exit 2 for data changed under a run


def test_restart_epoch_plans_the_epoch_again_from_its_first_batch(spm_model, tmp_path):
    path = tmp_path / "docs.jsonl"
    write(path, 20)
    state = stopped(spm_model, path)
    write(path, 30)
    fresh = take(datamodule(spm_model, path), 2)  # the new source's epoch 0 from its start
    resumed = datamodule(spm_model, path, on_changed_source="restart_epoch")
    resumed.load_state_dict(state)
    assert (resumed.state.epoch, resumed.state.batches) == (0, 0)
    for a, b in zip(fresh, take(resumed, 2)):
        assert torch.equal(a["tokens"], b["tokens"])


def test_an_unchanged_or_only_touched_source_resumes_where_it_was(spm_model, tmp_path):
    path = tmp_path / "docs.jsonl"
    write(path, 20)
    straight = take(datamodule(spm_model, path), 5)
    state = stopped(spm_model, path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a copy or a touch: same bytes
    resumed = datamodule(spm_model, path)
    resumed.load_state_dict(state)
    assert (resumed.state.epoch, resumed.state.batches) == (0, 3)
    for a, b in zip(straight[3:], take(resumed, 2)):
        assert torch.equal(a["tokens"], b["tokens"])


def test_the_option_is_range_checked():
    with pytest.raises(ValueError, match=r"data\.on_changed_source must be one of \('refuse', 'restart_epoch'\)"):
        DataConfig(on_changed_source="ignore")

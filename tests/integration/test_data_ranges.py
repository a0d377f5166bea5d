"""The data options are range-checked when the config is built: train.py exits 2 naming the source and
the field, before config.yaml or any stage folder is written."""

from __future__ import annotations

import re

import pytest
from train_runs import composed, main_in_process

from lwm.data import DataConfig, Source
from lwm.data.stream import PLAN_BYTES
from lwm.disk.weights import host_memory

REFUSED = [
    (["+data.sources.qa.repeat=-2"], r"data\.sources\.qa: repeat .* must be >= 1, got -2"),
    (["+data.sources.qa.repeat=0"], r"data\.sources\.qa: repeat .* must be >= 1, got 0"),
    # an epoch holds each example `repeat` times: past what the host's memory can plan
    (["+data.sources.text.repeat=1000000000000"], r"data\.sources\.text: repeat 1000000000000 .* GiB of memory"),
    (["data.sources.qa.overflow=squeeze"], r"data\.sources\.qa: overflow must be one of .*'window'.*got 'squeeze'"),
    (["data.holdout=-3"], r"data\.holdout .* must be >= 0, got -3"),
    (["data.weighting=sample"], r"data\.weighting must be one of \('example', 'token'\), got 'sample'"),
    (["data.seed=-1"], r"data\.seed must lie in \[0, 2\*\*32\), got -1"),
    (["data.max_frames=0"], r"data\.max_frames must be >= 1"),
    (["data.fps=-1"], r"data\.fps must be a finite number > 0"),
]


@pytest.mark.parametrize("overrides, message", REFUSED, ids=[o[0][0] for o in REFUSED])
def test_a_data_option_out_of_range_is_refused_when_the_config_is_built(overrides, message):
    with pytest.raises(ValueError, match=message):
        composed("model=debug", "schedule=debug", *overrides)


def test_train_exits_2_before_writing_anything(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, _, err = main_in_process(monkeypatch, capsys, out, "+data.sources.qa.repeat=-2")
    assert code == 2 and re.search(r"data\.sources\.qa: repeat .* got -2", err), err[-2000:]
    assert "Traceback" not in err and not out.exists()


def test_the_bounds_let_ordinary_values_through():
    run = composed("model=debug", "schedule=debug", "+data.sources.qa.repeat=3", "data.holdout=2")
    assert run.data.sources["qa"].repeat == 3 and run.data.holdout == 2
    most = host_memory() // PLAN_BYTES  # the largest repeat a one-example source may have
    Source("x.jsonl", repeat=most).check("x")
    with pytest.raises(ValueError, match=f"repeat at most {most}"):
        Source("x.jsonl", repeat=most + 1).check("x")


def test_a_stage_list_names_its_source_by_path():
    with pytest.raises(ValueError, match=r"data source a\.jsonl: overflow must be one of"):
        DataConfig(sources=[Source("a.jsonl", overflow="nope")])


def test_an_epoch_past_the_host_memory_is_refused_before_planning(tmp_path, tok, vocab, monkeypatch):
    """Each repeat fits, the whole epoch (examples x repeat) does not: EpochTooLarge (a TooLittleData, which
    train.py turns into exit 2) names the source, before any plan is made."""
    import json

    from lwm.data import PackedStream, TooLittleData
    from lwm.data import stream as dataset_module

    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"the red circle {i}"}) + "\n" for i in range(100)))
    monkeypatch.setattr(dataset_module, "host_memory", lambda: 100 * 50 * PLAN_BYTES)
    stream = PackedStream([Source(str(path), fields="text", repeat=50)], vocab, tok, 64, 1)
    assert len(stream.plan(0).src) == 100 * 50
    with pytest.raises(TooLittleData, match=rf"an epoch of 5100 examples \({path}: 100 examples x repeat 51\)"):
        PackedStream([Source(str(path), fields="text", repeat=51)], vocab, tok, 64, 1)
    assert len(list(tmp_path.glob("*.lwm-plan.npy"))) == 1  # the refused stream planned nothing

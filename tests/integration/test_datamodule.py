"""The datamodule (lwm/train/datamodule.py) over the sample's kinds of sources: skipped examples counted
with file and line, targets made before a context-parallel rank's slice is cut, what ranks share, exact
resume of the data order and of the skipped counts; its loaders start worker processes."""

import json

import numpy as np
import pytest
import torch
from code_samples import T_FRAMES

from lwm.data import DataConfig, Sharding, Source, Vocab, parse_fields
from lwm.data.batches import LOSS_ROWS
from lwm.parallel import unshard
from lwm.train.datamodule import LWMDataModule


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(1)
    words = "the red green blue circle square moves left right frame".split()
    qa = root / "qa.jsonl"
    lines = []
    for i in range(40):
        vid = list(T_FRAMES)[i % 3]
        lines.append(
            json.dumps(
                {
                    "vision": vid,
                    "question": " ".join(rng.choice(words, 4)),
                    "answer": " ".join(rng.choice(words, 3)),
                    "fields": "[vision+question],answer",
                }
            )
        )
    lines.insert(5, '{"vision": "missing_clip", "question": "q", "answer": "a", "fields": "[vision+question],answer"}')
    qa.write_text("\n".join(lines) + "\n")
    docs = root / "text.jsonl"
    docs.write_text("\n".join(json.dumps({"text": " ".join(rng.choice(words, 3000))}) for _ in range(3)) + "\n")
    return [Source(str(qa)), Source(str(docs), fields="text", overflow="window")]


def make_dm(spm_model, codes_dir, sources, seq_len=2048, **sharding):
    cfg = DataConfig(sources=sources, tokenizer=str(spm_model), codes=str(codes_dir), batch_size=2, seed=3)
    dm = LWMDataModule(cfg, seq_len=seq_len, sharding=Sharding(**sharding))
    dm.setup()
    return dm


def take(dm, n):
    it = iter(dm.train_dataloader())
    out = []
    for _ in range(n):
        out.append(dm.on_before_batch_transfer(next(it)))
    return out


def test_bad_example_is_skipped_and_counted_with_file_and_line(spm_model, codes_dir, sources, caplog):
    dm = make_dm(spm_model, codes_dir, sources)
    assert dm.stream.skipped == 1
    assert dm.stream.errors[0].startswith(f"{sources[0].path}:6: no cached codes for video 'missing_clip'")
    assert "missing_clip" in caplog.text


def test_targets_are_made_before_sharding(spm_model, codes_dir, sources):
    full = take(make_dm(spm_model, codes_dir, sources), 1)[0]
    assert torch.equal(full["targets"][:, :-1], full["tokens"][:, 1:])
    for layout in ("striped", "zigzag", "contiguous"):
        parts = [
            take(make_dm(spm_model, codes_dir, sources, cp_rank=r, cp_size=4, layout=layout), 1)[0] for r in range(4)
        ]
        for key in ("tokens", "targets", "loss_weight", "vision_mask", "segment_ids"):
            assert torch.equal(unshard([p[key] for p in parts], 1, layout), full[key]), (layout, key)
        assert torch.equal(unshard([p["positions"] for p in parts], 0, layout), torch.arange(2048))
        # the positions of each rank's slice that carry loss weight, read on the host for the loss's head
        for p in [full, *parts]:
            weighted = p["loss_weight"].reshape(-1).nonzero().squeeze(1)
            if weighted.numel() < p["loss_weight"].numel():
                assert torch.equal(p[LOSS_ROWS], weighted), layout
            else:
                assert LOSS_ROWS not in p  # every position: no index to take


def test_cp_ranks_share_a_sample_and_dp_ranks_do_not(spm_model, codes_dir, sources):
    def first_tokens(dp_rank, cp_rank):
        dm = make_dm(spm_model, codes_dir, sources, dp_rank=dp_rank, dp_size=2, cp_rank=cp_rank, cp_size=2)
        return [b["tokens"] for b in take(dm, 3)]

    a0, a1, b0 = first_tokens(0, 0), first_tokens(0, 1), first_tokens(1, 0)
    full = [b["tokens"] for b in take(make_dm(spm_model, codes_dir, sources, dp_rank=0, dp_size=2), 3)]
    for x, y, f in zip(a0, a1, full):
        assert torch.equal(unshard([x, y], 1, "striped"), f)  # one sample, split over the cp group
    assert all(not torch.equal(x, y) for x, y in zip(a0, b0))  # dp ranks read different samples


def test_loss_weights_and_vision_mask_are_the_targets(spm_model, codes_dir, sources, vocab):
    batch = take(make_dm(spm_model, codes_dir, sources), 1)[0]
    assert torch.equal(batch["vision_mask"], torch.from_numpy(vocab.is_vision(batch["targets"].numpy())))
    assert (batch["loss_weight"][batch["targets"] == vocab.pad_id] == 0).all()


def test_exact_resume_of_the_data_order(spm_model, codes_dir, sources):
    dm = make_dm(spm_model, codes_dir, sources)
    per_epoch = sum(1 for _ in dm.stream.sequences(0)) // 2
    assert 20 < per_epoch < 28  # the 28 batches below cross an epoch boundary
    straight = take(make_dm(spm_model, codes_dir, sources), 28)
    dm = make_dm(spm_model, codes_dir, sources)
    take(dm, 20)
    state = dm.state_dict()
    resumed = make_dm(spm_model, codes_dir, sources)
    resumed.load_state_dict(state)
    for a, b in zip(straight[20:], take(resumed, 8)):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert (state["epoch"], state["batches"]) == (0, 20)
    assert [b["tokens"].shape for b in straight] == [(2, 2048)] * 28


def states(dm, n):
    """The data state after each of the next n batches the loop takes."""
    it = iter(dm.train_dataloader())
    return [(dm.on_before_batch_transfer(next(it)), dm.state)[1] for _ in range(n)]


def test_skipped_count_goes_on_across_epochs_resume_and_ranks(spm_model, codes_dir, sources):
    """The state's skipped and read (data/skipped) are the whole stream's counts through each batch:
    the bad line is skipped once an epoch, a resume in either epoch goes on with the same counts,
    and both data-parallel ranks have them."""
    straight = states(make_dm(spm_model, codes_dir, sources), 28)  # 1 bad example in 44, 20-28 batches an epoch
    assert [s.skipped for s in straight] == sorted(s.skipped for s in straight)
    epoch1 = [s for s in straight if s.epoch == 1]
    assert epoch1 and all(s.read > 44 and s.skipped >= 1 for s in epoch1) and straight[0].read < 44
    for stop in (20, straight.index(epoch1[0]) + 1):  # mid-epoch 0, and in epoch 1 (epochs before counted)
        resumed = make_dm(spm_model, codes_dir, sources)
        resumed.load_state_dict(straight[stop - 1].as_dict())
        assert states(resumed, 28 - stop) == straight[stop:], stop
    rank0, rank1 = (states(make_dm(spm_model, codes_dir, sources, dp_rank=r, dp_size=2), 14) for r in (0, 1))
    assert rank0 == rank1 and rank0[-1].epoch == 1 and rank0[-1].skipped >= 1


def test_config_errors(spm_model, codes_dir, sources):
    with pytest.raises(ValueError, match=r"seq_len 2047 is not divisible by 2 \* ring size = 8 \(zigzag\)"):
        make_dm(spm_model, codes_dir, sources, seq_len=2047, cp_size=4, layout="zigzag")
    with pytest.raises(FileNotFoundError, match="data source /nope.jsonl does not exist"):
        make_dm(spm_model, codes_dir, [Source("/nope.jsonl")])
    with pytest.raises(ValueError, match="text tokenizer has 256 ids but the vocabulary expects 32000"):
        LWMDataModule(DataConfig(sources=sources, tokenizer=str(spm_model)), 64, vocab=Vocab(32000)).setup()
    assert parse_fields("[a+b],c")[0].loss is False

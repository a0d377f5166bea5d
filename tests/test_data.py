import json
import tracemalloc

import numpy as np
import pytest
import torch
from code_samples import T_FRAMES

from lwm.data import (
    CodeStore,
    DataConfig,
    Encoded,
    ExampleError,
    Packer,
    Sharding,
    Source,
    Vocab,
    encode_example,
    parse_fields,
    shard_batch,
)
from lwm.data.batches import LOSS_ROWS
from lwm.data.sampling import uniform_indices
from lwm.parallel import unshard
from lwm.train.datamodule import LWMDataModule


def test_video_field_layout(tok, vocab, codes_dir):
    store = CodeStore(codes_dir)
    enc = encode_example({"vision": "clip_a", "caption": "a red circle"}, vocab, tok, store, "[vision],caption")
    codes = np.load(codes_dir / "tokens" / "clip_a.npy").astype(np.int64)
    text = tok.encode("a red circle")
    video = enc.tokens[1 : 1 + 2 + 4 * 257]
    assert enc.tokens[0] == tok.bos_id and enc.tokens[-1] == tok.eos_id
    assert video[0] == vocab.vision_start and video[-1] == vocab.vision_end
    frames = video[1:-1].reshape(4, 257)  # 256 codes + <eof>/<eov> per frame
    assert (frames[:, :256] == codes + vocab.vision_offset).all()
    assert frames[:-1, 256].tolist() == [vocab.eof] * 3 and frames[-1, 256] == vocab.eov
    assert enc.tokens[1 + 2 + 4 * 257 : -1].tolist() == text
    assert enc.tokens.max() < vocab.size and enc.tokens.min() >= 0
    # vision mask: the codes and <eof>/<eov>, not the <vision> markers
    assert enc.vision_mask[2 : 2 + 4 * 257].all() and not enc.vision_mask[1] and not enc.vision_mask[2 + 4 * 257]
    assert enc.vision_mask.sum() == 4 * 257 == vocab.is_vision(enc.tokens).sum()


def test_loss_masks_follow_brackets(tok, vocab, codes_dir):
    ex = {"vision": "clip_c", "question": "what color", "answer": "red"}
    enc = encode_example(ex, vocab, tok, CodeStore(codes_dir), "[vision+question],answer")
    n_q, n_a = len(tok.encode("what color")), len(tok.encode("red"))
    n_prompt = 1 + 2 + 3 * 257 + n_q  # BOS, video, question: no loss
    assert not enc.loss_mask[:n_prompt].any()
    assert enc.loss_mask[n_prompt:].all() and len(enc) == n_prompt + n_a + 1  # answer and EOS carry loss
    t2v = encode_example({"vision": "clip_c", "caption": "red"}, vocab, tok, CodeStore(codes_dir), "[caption],vision")
    assert t2v.loss_mask[t2v.vision_mask].all()  # text-to-video: the codes are trained


def test_list_spec_is_a_seeded_choice_per_example(tok, vocab, codes_dir):
    ex = {"vision": "clip_c", "caption": "red", "fields": ["[vision],caption", "[caption],vision"]}
    store = CodeStore(codes_dir)
    firsts = {encode_example(ex, vocab, tok, store, key=f"f:{i}").tokens[1] for i in range(20)}
    assert firsts == {vocab.vision_start, tok.encode("red")[0]}  # both directions occur
    again = [encode_example(ex, vocab, tok, store, key=f"f:{i}").tokens[1] for i in range(20)]
    assert again == [encode_example(ex, vocab, tok, store, key=f"f:{i}").tokens[1] for i in range(20)]


def test_frame_subsampling(codes_dir):
    store = CodeStore(codes_dir)
    assert uniform_indices(10, 4).tolist() == [0, 3, 6, 9]
    assert store.load("clip_b", max_frames=3).shape == (3, 256)
    full = store.load("clip_b")
    assert (store.load("clip_b", fps=1.0) == full[[0, 2, 4]]).all()


def test_codes_of_a_killed_tokenize_run(codes_dir, tmp_path):
    """A manifest a killed lwm-tokenize left ending in half a line loads its whole entries, before and
    after a resumed run appends past it; a bad line that no kill leaves names its file and line."""
    import shutil

    from lwm.io import append_jsonl

    root = tmp_path / "codes"
    shutil.copytree(codes_dir, root)
    manifest = root / "manifest.jsonl"
    manifest.write_text(manifest.read_text() + '{"id": "clip_d", "timestamps": [0.0, 0.')
    store = CodeStore(root)
    assert sorted(store.meta) == sorted(T_FRAMES)
    assert (store.load("clip_b", fps=1.0) == CodeStore(codes_dir).load("clip_b", fps=1.0)).all()
    append_jsonl(manifest, {"id": "clip_d", "timestamps": [0.0]})
    assert sorted(CodeStore(root).meta) == sorted([*T_FRAMES, "clip_d"])
    manifest.write_text(manifest.read_text() + "garbage\n")
    with pytest.raises(ValueError, match=r"manifest\.jsonl:6: not JSON"):
        CodeStore(root)


def test_stream_drops_a_partial_last_line(tok, vocab, tmp_path):
    from lwm.data import PackedStream

    src = tmp_path / "docs.jsonl"
    src.write_text(
        json.dumps({"text": "red circle"}) + "\n{oops\n" + json.dumps({"text": "blue square"}) + '\n{"text": "gre'
    )
    stream = PackedStream([Source(str(src), fields="text")], vocab, tok, seq_len=64, batch_size=1)
    assert len(list(stream.sequences(0))) == 1 and len(stream.indexes[0]) == 3
    assert stream.skipped == 1 and stream.errors[0].startswith(f"{src}:2: not JSON")  # not the last line
    with pytest.raises(ExampleError, match=r"docs\.jsonl:2: not JSON"):  # before the first sequence
        PackedStream([Source(str(src), fields="text")], vocab, tok, seq_len=64, batch_size=1, strict=True)


def test_a_line_over_max_line_bytes_is_skipped_unread(tok, vocab, tmp_path, monkeypatch):
    """max_line_bytes: a longer line is skipped and counted, named with its file, line and size, without
    being read whole (lwm.io reads it in pieces: here a 2 MiB line under a 1 KiB limit); strict stops."""
    import lwm.io
    from lwm.data import PackedStream

    monkeypatch.setattr(lwm.io, "READ_CHUNK", 4096)
    src = tmp_path / "docs.jsonl"
    long = json.dumps({"text": "red " * 2**19})
    src.write_text("\n".join([json.dumps({"text": "red circle"}), long, json.dumps({"text": "blue square"})]) + "\n")
    tracemalloc.start()
    try:  # indexing reads every line; packing reads those of the sequences
        stream = PackedStream([Source(str(src), fields="text")], vocab, tok, 16, 1, max_line_bytes=1024)
        seqs = list(stream.sequences(0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seqs and peak < 2**20, peak  # the line is 2 MiB
    assert stream.skipped == 1 and stream.plan(0).total_skipped == 1 and len(stream.plan(0).src) == 3
    assert stream.errors == [f"{src}:2: a line of {len(long)} bytes, longer than max_line_bytes 1024: not read"]
    with pytest.raises(ExampleError, match=rf"docs\.jsonl:2: a line of {len(long)} bytes, .*data\.strict=true"):
        PackedStream([Source(str(src), fields="text")], vocab, tok, 16, 1, max_line_bytes=1024, strict=True)


def test_mostly_bad_data_stops_the_stream(tok, vocab, tmp_path):
    """max_skipped_fraction: judged on the whole epoch from the index, before the first batch (4 of 6
    bad: stops at 0.5, not at 0.7 or 1, repeats counted); the message has the fraction, the counts and
    the first reasons."""
    from itertools import islice

    from lwm.data import PackedStream, SkippedTooMany, StreamState

    src = tmp_path / "docs.jsonl"
    src.write_text(
        "".join(json.dumps({"text": f"red circle {i}"} if i in (1, 4) else {"txt": i}) + "\n" for i in range(6))
    )

    def stream(fraction, repeat=1):
        source = Source(str(src), fields="text", repeat=repeat)
        return PackedStream([source], vocab, tok, 4, 1, max_skipped_fraction=fraction)

    message = (
        r"4 of the 6 examples of an epoch are skipped \(67%\), more than data.max_skipped_fraction 0.5; "
        rf"first reasons: {src}:1: unknown field 'text'.*; {src}:3: .* \(and 1 more\)"
    )
    with pytest.raises(SkippedTooMany, match=message):
        stream(0.5)
    with pytest.raises(SkippedTooMany, match=r"8 of the 12 examples"):
        stream(0.5, repeat=2)
    for fraction in (0.7, 1.0):
        ok = stream(fraction)
        states = [state for _, state in islice(ok.batches(StreamState()), 12)]
        assert states[-1].epoch >= 1 and states[-1].skipped >= 4 and ok.skipped == 4


def test_a_source_costs_bytes_a_line_not_objects(tok, vocab, tmp_path):
    """A data source of n lines is its index (byte offsets, line numbers, token counts) and an epoch's
    order and plan, arrays all: no Python object per line (a Line each and a list of tuples took about
    270 bytes a line for these 30-byte lines). Measured per line between 1,000 and 12,000 lines, so what a
    source costs whatever its size (the tokenizer's and the stream's own) is not counted."""
    from lwm.data import PackedStream

    def memory(n: int) -> tuple[int, int]:
        src = tmp_path / f"docs{n}.jsonl"
        src.write_text("".join(json.dumps({"text": f"a red circle {i}"}) + "\n" for i in range(n)))
        tracemalloc.start()
        try:
            stream = PackedStream([Source(str(src), fields="text")], vocab, tok, seq_len=64, batch_size=1)
            order = stream._order(0)
            retained, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        s, i = order[0][0], order[1][0]
        assert stream.indexes[s].reader.example(i) == {"text": f"a red circle {i}"}
        return retained, peak

    small, large = memory(1_000), memory(12_000)
    retained, peak = ((b - a) / 11_000 for a, b in zip(small, large))
    # held: the index (offsets, line numbers, token counts: 20 bytes), epoch 0's plan (its order 8, pieces 16,
    # sequences about 5) and the order made here (8)
    assert retained < 80 and peak < 128, f"{retained:.0f} bytes a line retained, {peak:.0f} at peak"


@pytest.mark.parametrize(
    "example,spec,message",
    [
        ({"caption": "x"}, "[vision],caption", "unknown field 'vision'"),
        ({"caption": "  "}, "caption", "field 'caption' is empty"),
        ({"vision": "nope", "caption": "x"}, "[vision],caption", "no cached codes for video 'nope'"),
        ({"caption": "x"}, "[caption", "malformed fields spec"),
        ({"caption": "x"}, None, "no 'fields' spec"),
    ],
)
def test_bad_examples_say_what_is_wrong(tok, vocab, codes_dir, example, spec, message):
    with pytest.raises(ExampleError, match=message):
        encode_example(example, vocab, tok, CodeStore(codes_dir), spec)


def enc_of(n, loss=True, vision=False):
    return Encoded(np.arange(n, dtype=np.int64) + 10, np.full(n, loss), np.full(n, vision))


def test_packing_segments_weights_and_overflow():
    packer = Packer(seq_len=9, overflow="truncate")  # 10 tokens per packed sequence
    a, b, c = enc_of(4), enc_of(3, vision=True), enc_of(5)
    seqs = list(packer.pack([a, b, c]))
    assert len(seqs) == 2
    assert seqs[0].segment_ids.tolist() == [1] * 4 + [2] * 3 + [0] * 3  # c does not fit: padding
    assert seqs[1].segment_ids.tolist() == [1] * 5 + [0] * 5
    # each example's loss tokens of a kind sum to 1: packing weighs examples, not lengths; an
    # example's first token is never a target (the token before it belongs to another example)
    assert seqs[0].loss_weight[0] == 0 and np.allclose(seqs[0].loss_weight[1:4], 1 / 3)
    assert seqs[0].loss_weight[4] == 0 and np.allclose(seqs[0].loss_weight[5:7], 1 / 2)
    assert seqs[0].loss_weight[7:].sum() == 0 and seqs[0].vision_mask[4:7].all()
    long = enc_of(25)
    assert len(list(Packer(9, "drop").pack([long]))) == 0
    t = Packer(9, "truncate")
    assert [s.tokens.tolist() for s in t.pack([long])] == [list(range(10, 20))] and t.stats["truncated"] == 1
    w = Packer(9, "window")
    windows = list(w.pack([long]))
    assert len(windows) == 3 and np.concatenate([s.tokens[s.segment_ids > 0] for s in windows]).tolist() == list(
        range(10, 35)
    )
    assert w.stats["windowed"] == 1
    tokenwise = next(Packer(9, weighting="token").pack([a]))
    assert tokenwise.loss_weight[:4].tolist() == [0.0] + [1.0] * 3


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


@pytest.mark.integration  # starts loader workers or a process group
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


@pytest.mark.parametrize("layout", ["striped", "zigzag"])
def test_each_rank_is_given_the_positions_of_its_slice_that_carry_loss(layout):
    """A batch weighting only answers: each cp rank's LOSS_ROWS are the flat positions of its own
    (B, S / cp) slice whose loss weight is not zero (answers, half-weighted too), read on the host."""
    B, S = 2, 16
    weight = torch.zeros(B, S)
    weight[0, 5:8], weight[1, 12:15] = 1.0, 0.5
    batch = {"tokens": torch.arange(B * S).view(B, S), "loss_weight": weight, "segment_ids": torch.ones(B, S)}
    parts = [shard_batch(batch, Sharding(cp_rank=r, cp_size=2, layout=layout)) for r in range(2)]
    for p in parts:
        local = p["loss_weight"].reshape(-1)
        assert torch.equal(p[LOSS_ROWS], torch.tensor([i for i in range(local.numel()) if local[i] != 0]))
    assert sum(p[LOSS_ROWS].numel() for p in parts) == 6


@pytest.mark.integration  # starts loader workers or a process group
def test_cp_ranks_share_a_sample_and_dp_ranks_do_not(spm_model, codes_dir, sources):
    def first_tokens(dp_rank, cp_rank):
        dm = make_dm(spm_model, codes_dir, sources, dp_rank=dp_rank, dp_size=2, cp_rank=cp_rank, cp_size=2)
        return [b["tokens"] for b in take(dm, 3)]

    a0, a1, b0 = first_tokens(0, 0), first_tokens(0, 1), first_tokens(1, 0)
    full = [b["tokens"] for b in take(make_dm(spm_model, codes_dir, sources, dp_rank=0, dp_size=2), 3)]
    for x, y, f in zip(a0, a1, full):
        assert torch.equal(unshard([x, y], 1, "striped"), f)  # one sample, split over the cp group
    assert all(not torch.equal(x, y) for x, y in zip(a0, b0))  # dp ranks read different samples


@pytest.mark.integration  # starts loader workers or a process group
def test_loss_weights_and_vision_mask_are_the_targets(spm_model, codes_dir, sources, vocab):
    batch = take(make_dm(spm_model, codes_dir, sources), 1)[0]
    assert torch.equal(batch["vision_mask"], torch.from_numpy(vocab.is_vision(batch["targets"].numpy())))
    assert (batch["loss_weight"][batch["targets"] == vocab.pad_id] == 0).all()


@pytest.mark.integration  # starts loader workers or a process group
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


@pytest.mark.integration  # starts loader workers or a process group
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


def test_holdout_examples_are_never_trained_on(tmp_path, tok, vocab):
    """data.holdout H: the last H examples of every source are packed only for validation, each
    once, in file order, as whole global batches shared out over data-parallel ranks."""
    from itertools import combinations

    from lwm.data import PackedStream

    words = "red green blue circle square moves left right".split()
    texts = [" ".join(c) for c in list(combinations(words, 3))[:20]]  # 20 distinct examples
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    def seen(seqs):
        decoded = [tok.decode([int(t) for t in s.tokens if t < tok.vocab_size]) for s in seqs]
        return {t for t in texts if any(t in d for d in decoded)}

    streams = [
        PackedStream(
            [Source(str(src), fields="text")], vocab, tok, seq_len=16, batch_size=1, holdout=4, dp_rank=r, dp_size=2
        )
        for r in range(2)
    ]
    assert seen(seq for epoch in range(2) for seq in streams[0].sequences(epoch)) == set(texts[:16])
    batches = [s.validation_batches() for s in streams]
    assert len(batches[0]) == len(batches[1]) > 0
    assert seen(seq for rank in batches for b in rank for seq in b) == set(texts[16:])
    with pytest.raises(ValueError, match="has 20 examples: data.holdout 20 leaves none to train on"):
        PackedStream([Source(str(src), fields="text")], vocab, tok, seq_len=16, batch_size=1, holdout=20)

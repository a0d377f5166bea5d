import json
import tracemalloc

import numpy as np
import pytest
import torch
from code_samples import T_FRAMES

from lwm.data import (
    CodeStore,
    Encoded,
    ExampleError,
    Packer,
    Sharding,
    Source,
    encode_example,
    shard_batch,
)
from lwm.data.batches import LOSS_ROWS
from lwm.data.sampling import uniform_indices


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

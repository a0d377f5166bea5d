"""The packed stream at scale, on CPU: start-up (the index made, then read), resume, the share of the stream
a rank encodes, and batches per second per rank against encoding the whole global stream.

A synthetic corpus of N examples is written to a temporary folder for each size (question-answer text
of 10-60 words, and one example in ten a question over a video of cached codes, 8-64 frames), with a
sentencepiece model trained on its words. Measured in the same run:

- start-up against corpus size: constructing the stream with no index (the index made, by two processes),
  again with the index but no kept plan (epoch 0 planned), and again with both (read and mapped); and the
  memory and files the index and an epoch's plan take;
- resume against batches already done: the first batch after a resume at batch k, against re-packing
  the epoch from its start and skipping k batches (how the stream resumed before it had a plan);
- tokens a rank encodes against dp (a global batch of 64 sequences of 4096 tokens shared by dp ranks);
- batches per second of one rank (32768 tokens a sequence, one per rank), against encoding every
  sequence of the global stream and keeping the rank's share (the stream before plans), at dp 1 and 4.

    python -m bench.data                          # writes docs/benchmarks.md
    python -m bench.data --sizes 10000 --no-write
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from itertools import islice
from pathlib import Path

import numpy as np
import sentencepiece as spm

from bench.report import command_line, host_line, publish
from lwm.data import CodeStore, PackedStream, Source, StreamState, TextTokenizer, Vocab
from lwm.data.code_cache import save_codes

WORDS = "the a red green blue yellow circle square triangle moves left right up down appears turns stops frame video second".split()
VIDEOS = 200


def make_tokenizer_and_codes(root: Path) -> tuple[TextTokenizer, CodeStore]:
    rng = np.random.default_rng(0)
    (root / "codes" / "tokens").mkdir(parents=True)
    with open(root / "codes" / "manifest.jsonl", "w") as manifest:
        for i in range(VIDEOS):
            t = int(rng.integers(8, 65))
            with open(root / "codes" / "tokens" / f"v{i}.npy", "wb") as f:
                sha = save_codes(f, rng.integers(0, 8192, (t, 256)).astype(np.uint16))
            manifest.write(json.dumps({"id": f"v{i}", "timestamps": list(range(t)), "sha256": sha}) + "\n")
    (root / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS, 30)) for _ in range(3000)))
    spm.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"), model_prefix=str(root / "sp"), vocab_size=200, model_type="bpe",
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    return TextTokenizer(root / "sp.model"), CodeStore(root / "codes")


def make_source(path: Path, n: int, seed: int = 0) -> Source:
    rng = np.random.default_rng(seed)
    words = np.asarray(WORDS)
    lengths = rng.integers(10, 61, n)
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(words[rng.integers(0, len(WORDS), lengths[i])])
            if i % 10 == 0:
                row = {"vision": f"v{i % VIDEOS}", "question": text[:80], "answer": text[80:] or "yes",
                       "fields": "[vision+question],answer"}  # fmt: skip
            else:
                row = {"question": text[:100], "answer": text[100:] or "yes"}
            f.write(json.dumps(row) + "\n")
    return Source(str(path), fields="[question],answer")


def stream(source, tok, codes, seq_len, batch_size=1, dp_rank=0, dp_size=1) -> PackedStream:
    return PackedStream(
        [source], Vocab(tok.vocab_size), tok, seq_len, batch_size, codes=codes, dp_rank=dp_rank, dp_size=dp_size,
        index_workers=2,
    )  # fmt: skip


def whole_stream_batches(s: PackedStream, state: StreamState):
    """The stream before plans: every sequence of the epoch encoded in order, the first `state.batches`
    global batches skipped, this rank's share of the others kept."""
    per_global, B = s.batch_size * s.dp_size, s.batch_size
    buf = []
    for n, seq in enumerate(s.sequences(state.epoch)):
        g, k = divmod(n, per_global)
        if g < state.batches:
            continue
        if s.dp_rank * B <= k < (s.dp_rank + 1) * B:
            buf.append(seq)
        if k == per_global - 1:
            yield buf
            buf = []


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def startup_rows(root: Path, sizes, tok, codes, seq_len: int) -> tuple[list[str], dict]:
    rows, sources = [], {}
    for n in sizes:
        source = make_source(root / f"ex{n}.jsonl", n)
        sources[n] = source
        cold, s = timed(lambda: stream(source, tok, codes, seq_len))
        for kept in root.glob(f"ex{n}.jsonl.*.lwm-plan.npy"):
            kept.unlink()
        planning, s = timed(lambda: stream(source, tok, codes, seq_len))  # how a warm start was before kept plans
        warm, s = timed(lambda: stream(source, tok, codes, seq_len))
        planned, p = timed(lambda: s.plan(1))  # epoch 0's was mapped with the stream
        first_warm, _ = timed(lambda: next(s.batches(StreamState())))
        tracemalloc.start()
        held = stream(source, tok, codes, seq_len)
        held.plan(0)
        retained, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del held
        per_million = retained / n * 1e6 / 2**20
        size = s.indexes[0].file.stat().st_size
        plan_size = s.plan(0).file.stat().st_size
        print(
            f"{n} examples: cold {cold:.2f}s; warm {warm:.3f}s (planning epoch 0: {planning:.2f}s; another epoch "
            f"{planned:.2f}s) + first batch {first_warm:.3f}s; {len(p)} sequences; index file {size / 2**20:.1f} MiB, "
            f"plan file {plan_size / 2**20:.1f} MiB; {per_million:.0f} MiB held per million examples",
            flush=True,
        )
        rows.append(
            f"| {n:,} | {cold:.2f} | {planning:.3f} | {warm:.3f} | {planning / warm:.0f}x | {planned:.2f} | "
            f"{first_warm:.3f} | {size / n:.0f} | {plan_size / n:.0f} | {per_million:.0f} |"
        )
    return rows, sources


def resume_rows(source, tok, codes, seq_len: int, points, baseline_upto: int) -> list[str]:
    rows = []
    s = stream(source, tok, codes, seq_len)
    per_epoch = len(s.plan(0))
    for k in points:
        if k >= per_epoch:
            continue
        state = StreamState(0, k)
        new, _ = timed(lambda: next(stream(source, tok, codes, seq_len).batches(state)))
        if k <= baseline_upto:
            old, _ = timed(lambda: next(whole_stream_batches(stream(source, tok, codes, seq_len), state)))
            old_cell, ratio = f"{old:.2f}", f"{old / new:.0f}x"
        else:
            old_cell, ratio = "not run", ""
        print(f"resume at batch {k}: {new:.3f}s; re-packing the epoch: {old_cell}{'s' if ratio else ''}", flush=True)
        rows.append(f"| {k:,} | {new:.3f} | {old_cell} | {ratio} |")
    return rows


def share_rows(source, tok, codes, seq_len: int, dps, global_batch: int, batches: int) -> list[str]:
    """Tokens each rank encodes for the first `batches` global batches: the mean and the largest over the
    dp ranks (a rank encodes the whole of an example of which its sequence holds a truncated piece)."""
    rows, base = [], None
    for dp in dps:
        per_rank = []
        for r in range(dp):
            s = stream(source, tok, codes, seq_len, batch_size=global_batch // dp, dp_rank=r, dp_size=dp)
            list(islice(s.batches(StreamState()), batches))
            per_rank.append(s.encoded["tokens"])
        mean, most = float(np.mean(per_rank)), max(per_rank)
        base = base or mean
        print(
            f"dp {dp}: a rank encoded {mean:,.0f} tokens on average ({mean / base:.3f} of dp 1's), at most {most:,}",
            flush=True,
        )
        rows.append(
            f"| {dp} | {global_batch // dp} | {mean:,.0f} | {mean / base:.3f} | {most / base:.3f} | {1 / dp:.3f} |"
        )
    return rows


def rate_rows(source, tok, codes, seq_len: int, dps, batches: int) -> list[str]:
    rows = []
    for dp in dps:
        s = stream(source, tok, codes, seq_len, dp_size=dp)
        next(s.batches(StreamState()))  # the plan made
        new, _ = timed(lambda: list(islice(s.batches(StreamState()), batches)))
        s = stream(source, tok, codes, seq_len, dp_size=dp)
        old, _ = timed(lambda: list(islice(whole_stream_batches(s, StreamState()), batches)))
        print(f"dp {dp}: {batches / new:.2f} batches/s against {batches / old:.2f} ({old / new:.1f}x)", flush=True)
        rows.append(f"| {dp} | {batches / new:.2f} | {batches / old:.2f} | {old / new:.1f}x |")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok, codes = make_tokenizer_and_codes(root)
        startup, sources = startup_rows(root, args.sizes, tok, codes, args.seq_len)
        mid = sources[sorted(sources)[len(sources) // 2]]
        resume = resume_rows(mid, tok, codes, args.seq_len, [0, 10, 100, 1000], baseline_upto=100)
        share = share_rows(mid, tok, codes, 4096, [1, 4, 16, 64], global_batch=64, batches=2)
        rate = rate_rows(mid, tok, codes, args.seq_len, [1, 4], args.batches)
        mid_n = sorted(sources)[len(sources) // 2]
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        "Synthetic corpora of question-answer examples (10-60 words; one in ten over a video of cached codes, "
        f"8-64 frames of 257 tokens), one JSON-lines source each; {args.seq_len} tokens a sequence; indexes made "
        "by two processes; every stream in the training process (no loader workers).",
        "",
        "Start-up against corpus size: the stream made with no index (cold: every example encoded once, the index "
        "and epoch 0's plan kept); again without a kept plan (the index read, epoch 0 planned: every warm start "
        "before plans were kept); and again (warm: the index read, the plan mapped); planning another epoch (once "
        "a run, by the first rank to reach it), the first batch after a warm start, the bytes of the files, and "
        "what a rank holds in memory (the index; the plan is mapped).",
        "",
        "| examples | cold start (s) | start, planning (s) | warm start (s) | planning / warm | an epoch's plan (s) | "
        "first batch (s) | index bytes per example | plan bytes per example | MiB held per million examples |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *startup,
        "",
        f"Resume against batches already done ({mid_n:,} examples): the first batch after resuming at batch k, "
        "against re-packing the epoch from its start and skipping k batches (the stream before plans).",
        "",
        "| batches done | resume (s) | re-packing (s) | ratio |",
        "| ---: | ---: | ---: | ---: |",
        *resume,
        "",
        f"Tokens a rank encodes for 2 global batches of 64 sequences of 4096 tokens ({mid_n:,} examples), shared "
        "by dp ranks, over every rank of each dp (before plans every rank encoded the whole global batch: 1.000 "
        "at every dp).",
        "",
        "| dp | sequences per rank | tokens encoded, mean per rank | mean, of dp 1 | largest, of dp 1 | 1/dp |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        *share,
        "",
        f"Batches per second of rank 0 (one sequence of {args.seq_len} tokens a batch, {args.batches} batches), "
        "against encoding every sequence of the global stream and keeping the rank's share, in the same run.",
        "",
        "| dp | batches/s | whole stream (batches/s) | ratio |",
        "| ---: | ---: | ---: | ---: |",
        *rate,
    ]
    publish("data", "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()

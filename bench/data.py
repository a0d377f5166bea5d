"""Datamodule throughput at the 7B stage shapes: packed batches of 32K tokens per second on CPU.

A synthetic corpus is written to a temporary folder (cached video codes of 8-64 frames each,
question-answer examples over them, long text documents), then the datamodule is timed from a
cold start: reading, encoding, packing, making targets and sharding for context parallelism.

    python -m bench.data                    # writes docs/benchmarks.md
    python -m bench.data --seq-len 32768 --batches 20 --no-write
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm

from bench.report import command_line, host_line, publish
from lwm.data import DataConfig, Sharding, Source
from lwm.train.datamodule import LWMDataModule

WORDS = "the a red green blue yellow circle square triangle moves left right up down appears turns stops frame video second".split()


def make_corpus(root: Path, n_videos: int, n_docs: int, seed: int = 0) -> list[Source]:
    rng = np.random.default_rng(seed)
    (root / "codes" / "tokens").mkdir(parents=True)
    with open(root / "codes" / "manifest.jsonl", "w") as manifest:
        for i in range(n_videos):
            t = int(rng.integers(8, 65))
            np.save(root / "codes" / "tokens" / f"v{i}.npy", rng.integers(0, 8192, (t, 256)).astype(np.uint16))
            manifest.write(json.dumps({"id": f"v{i}", "timestamps": list(range(t))}) + "\n")
    sentence = lambda n: " ".join(rng.choice(WORDS, n))  # noqa: E731
    with open(root / "qa.jsonl", "w") as f:
        for i in range(n_videos * 4):
            f.write(
                json.dumps(
                    {
                        "vision": f"v{i % n_videos}",
                        "question": sentence(12),
                        "answer": sentence(20),
                        "fields": "[vision+question],answer",
                    }
                )
                + "\n"
            )
    with open(root / "docs.jsonl", "w") as f:
        for _ in range(n_docs):
            f.write(json.dumps({"text": sentence(40_000)}) + "\n")
    (root / "corpus.txt").write_text("\n".join(sentence(30) for _ in range(3000)))
    spm.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"),
        model_prefix=str(root / "sp"),
        vocab_size=200,
        model_type="bpe",
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
    )
    return [Source(str(root / "qa.jsonl")), Source(str(root / "docs.jsonl"), fields="text", overflow="window")]


def measure(root: Path, sources, seq_len: int, batches: int, sharding: Sharding) -> tuple[float, float]:
    cfg = DataConfig(sources=sources, tokenizer=str(root / "sp.model"), codes=str(root / "codes"), batch_size=1)
    start = time.perf_counter()
    dm = LWMDataModule(cfg, seq_len=seq_len, sharding=sharding)
    it = iter(dm.train_dataloader())
    next(it)
    first = time.perf_counter() - start  # set-up (reading the sources) and the first batch
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - t0), first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--videos", type=int, default=200)
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument(
        "--gpu-step-s",
        type=float,
        default=3.0,
        help="an estimate of one 7B training step on 32K tokens on one GPU, for the comparison",
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sources = make_corpus(root, args.videos, args.docs)
        for sharding in (Sharding(), Sharding(cp_rank=3, cp_size=8, layout="striped"), Sharding(dp_rank=1, dp_size=4)):
            rate, first = measure(root, sources, args.seq_len, args.batches, sharding)
            label = f"dp {sharding.dp_rank}/{sharding.dp_size}, cp {sharding.cp_rank}/{sharding.cp_size} ({sharding.layout})"
            rows.append((label, rate, first))
            print(
                f"{label}: {rate:.2f} batches/s ({rate * args.seq_len / 1e3:.0f}K tokens/s), first batch {first:.2f}s",
                flush=True,
            )
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        f"Synthetic corpus: {args.videos} videos of cached codes (8-64 frames, 257 tokens each), {args.videos * 4} "
        f"question-answer examples over them, {args.docs} text documents of 40K words (windowed); one packed sequence "
        f"of {args.seq_len} tokens per batch, one data-loading process. Target: faster than a 7B step on 32K tokens "
        f"consumes batches on a GPU (estimated here at {args.gpu_step_s:.0f} s per step, i.e. {1 / args.gpu_step_s:.2f} batches/s; "
        "an estimate, not measured on a GPU).",
        "",
        "| rank | batches/s | tokens/s | first batch (s) | margin over the GPU step |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [f"| {l} | {r:.2f} | {r * args.seq_len:,.0f} | {f:.2f} | {r * args.gpu_step_s:.0f}x |" for l, r, f in rows]
    markdown = "\n".join(lines)
    publish("data", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

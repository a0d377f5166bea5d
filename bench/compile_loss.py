"""The chunked loss's softmax and gradient over one chunk of logits (lwm.model.loss.chunk_softmax_), eager
against the same function compiled by torch.compile: why parallel.compile_blocks leaves the loss eager.

The eager function works in place on one reused (rows, V) fp32 buffer: about seven passes over it. Compiled,
inductor fuses the passes but writes a new buffer and copies it back (the input's mutation), or, written
without mutation, allocates its outputs. Each variant runs on the same logits, `--repeats` times after a
first call (which compiles); the best time is reported.

    python -m bench.compile_loss                          # 1024 x 12352 (the tiny preset's vocabulary), writes docs/benchmarks.md
    python -m bench.compile_loss --rows 256 --vocab 4096 --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.report import command_line, host_line, publish
from lwm.model.loss import chunk_softmax_


def best(fn, base: torch.Tensor, repeats: int) -> float:
    buf = base.clone()
    fn(buf)  # compiles where compiled
    times = []
    for _ in range(repeats):
        buf.copy_(base)
        start = time.perf_counter()
        fn(buf)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024, help="tokens in a chunk (model.loss_chunk_size)")
    parser.add_argument("--vocab", type=int, default=12352)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    logits = torch.randn(args.rows, args.vocab)  # (r, V) fp32
    targets = torch.randint(0, args.vocab, (args.rows,))
    targets[::7] = -100  # some positions carry no loss
    coeff = torch.full((args.rows,), 1 / args.rows)
    variants = {
        "eager, in place": chunk_softmax_,
        "compiled (static shapes)": torch.compile(chunk_softmax_, dynamic=False),
        "compiled (dynamic shapes)": torch.compile(chunk_softmax_, dynamic=True),
    }
    times = {
        name: best(lambda x, fn=fn: fn(x, targets, coeff, True), logits, args.repeats) for name, fn in variants.items()
    }
    base = times["eager, in place"]
    rows = [f"| {name} | {t * 1e3:.2f} | {t / base:.2f}x |" for name, t in times.items()]
    for name, t in times.items():
        print(f"{name}: {t * 1e3:.2f} ms ({t / base:.2f}x eager's time)", flush=True)
    markdown = "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"One chunk: {args.rows} x {args.vocab} fp32 logits, the softmax, the loss and the gradient in place; "
            f"best of {args.repeats} after a first call.",
            "",
            "| chunk_softmax_ | ms | time vs eager |",
            "| --- | ---: | ---: |",
            *rows,
        ]
    )
    publish("compile-loss", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

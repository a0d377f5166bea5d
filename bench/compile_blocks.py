"""A training step with compiled blocks (parallel.compile_blocks) against the same step eager.

The model is built twice from one seed, through the ring at one rank (apply_context_parallel) with
activation checkpointing, as train.py's one-process run builds it; the compiled one has each block's
norms, SwiGLU and RoPE compiled (lwm.parallel.apply_compile). Each step is forward, backward and AdamW
on one packed sequence. The two models run alternately, `--repeats` rounds after their first steps (the
compiled one's first step compiles: its time is reported apart); the median is reported.

    python -m bench.compile_blocks                       # tiny preset, 2K and 8K tokens, writes docs/benchmarks.md
    python -m bench.compile_blocks --preset debug --lengths 256 --repeats 2 --no-write
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.report import command_line, host_line, publish
from lwm.model import ModelConfig, Transformer
from lwm.parallel import apply_activation_checkpointing, apply_compile, apply_context_parallel


def build(preset: str, compiled: bool) -> tuple[Transformer, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = apply_activation_checkpointing(apply_context_parallel(Transformer(ModelConfig.from_preset(preset))))
    if compiled:
        apply_compile(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def stepper(model: Transformer, optimizer, seq_len: int):
    tokens = torch.randint(0, model.config.vocab_size, (1, seq_len + 1))
    coeff = torch.full((1, seq_len), 1 / seq_len)

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(tokens[:, :-1], targets=tokens[:, 1:], loss_coeff=coeff).loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


def measure(preset: str, seq_len: int, repeats: int) -> dict:
    steps = {name: stepper(*build(preset, name == "compiled"), seq_len) for name in ("eager", "compiled")}
    first = {name: step() for name, step in steps.items()}  # the compiled model's first step compiles
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(step())
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"first": first, "median": median, "speedup": median["eager"] / median["compiled"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for seq_len in args.lengths:
        r = measure(args.preset, seq_len, args.repeats)
        print(
            f"{args.preset} S={seq_len}: eager {r['median']['eager']:.3f} s, compiled {r['median']['compiled']:.3f} s "
            f"(first step {r['first']['compiled']:.1f} s), speed-up {r['speedup']:.2f}x",
            flush=True,
        )
        rows.append(
            f"| {seq_len} | {r['median']['eager']:.3f} | {r['median']['compiled']:.3f} | {r['speedup']:.2f}x | "
            f"{r['first']['eager']:.2f} | {r['first']['compiled']:.1f} |"
        )
    markdown = "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"`{args.preset}` preset, one process, fp32, batch 1, the ring at one rank with activation checkpointing; "
            f"a step = forward, backward, AdamW; median of {args.repeats} steps each, eager and compiled run "
            "alternately after their first step (the compiled one's compiles).",
            "",
            "| tokens | eager s/step | compiled s/step | speed-up | eager first step (s) | compiled first step (s) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )
    publish("compile-blocks", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

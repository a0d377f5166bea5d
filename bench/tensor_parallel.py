"""Per-rank memory of a training step under tensor parallelism: tp 1 against tp 2 (CPU, gloo).

Each configuration is a real training step in gloo processes (lwm.parallel.launch.run_distributed):
the tiny preset built by lwm.parallel.build_parallel_model (tensor parallelism, FSDP2 over the
remaining ranks), the chunked loss, backward, clipping, AdamW. FSDP2's memory tracker (the
planner's, lwm/plan/tracker.py) reports rank 0's peak of the second step and its parts; the
table gives each part per rank and as a ratio to tp 1 in the same run.

    python -m bench.tensor_parallel                 # 8K tokens, writes docs/benchmarks.md
    python -m bench.tensor_parallel --seq-len 2048 --no-write
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.report import command_line, host_line, publish
from lwm.core.config import OptimConfig, StageConfig
from lwm.model import ModelConfig
from lwm.parallel import ParallelDims, build_meshes, build_parallel_model, compute_settings
from lwm.parallel.launch import run_distributed
from lwm.plan.fake import make_batch
from lwm.plan.memory import tracked_step

PARTS = ("parameters", "gradients", "optimizer", "activations", "temporaries")


def step_memory(rank: int, world: int, preset: str, seq_len: int, tp: int) -> dict:
    """In a gloo worker: rank's tracked second training step at tp (dp = world / tp)."""
    config = ModelConfig.from_preset(preset, max_seq_len=seq_len)
    stage = StageConfig("bench", seq_len=seq_len, rope_theta=config.rope_theta, steps=2, lr=1e-4)
    meshes = build_meshes(ParallelDims(dp=world // tp, tp=tp), "cpu", rank)
    settings = compute_settings(torch.device("cpu"), config.head_dim)
    model = build_parallel_model(config, meshes, settings, "cpu", None)
    with torch.no_grad():
        for p in model.parameters():  # values, so the arithmetic is ordinary (to_empty left garbage)
            p.to_local().normal_(0, 0.02)
    torch.manual_seed(0)  # every rank the same sequence: the tp ranks read the same tokens
    batch = make_batch(config, seq_len, meshes, 1, "striped", "cpu")
    start = time.perf_counter()
    mem = tracked_step(model, batch, OptimConfig(), stage, meshes, document_mask=False)
    return {"peak": mem.peak, "parts": mem.parts, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = p.parse_args(argv)
    rows = {}
    for tp in args.tp:
        rows[tp] = run_distributed(step_memory, tp, args.preset, args.seq_len, tp, timeout=1800)[0]
        print(f"tp {tp}: peak {rows[tp]['peak'] / 2**20:.1f} MiB in {rows[tp]['seconds']:.1f} s", flush=True)
    base = rows[args.tp[0]]
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    lines = [
        f"Per-rank memory of one training step of the {args.preset} preset at {args.seq_len} tokens (one sequence, "
        "fp32, no activation checkpointing), rank 0's second step as FSDP2's memory tracker sees it; "
        f"ratios against tp {args.tp[0]} of the same run. {host_line()}.",
        "",
        f"`{command_line()}`",
        "",
        "| tp | peak MiB | "
        + " | ".join(f"{part} MiB" for part in PARTS)
        + " | peak ratio | "
        + " | ".join(f"{part} ratio" for part in PARTS)
        + " |",
        "|---|" + "---|" * (2 + 2 * len(PARTS)),
    ]
    for tp, row in rows.items():
        ratios = [row["parts"][part] / base["parts"][part] if base["parts"][part] else None for part in PARTS]
        lines.append(
            f"| {tp} | {mib(row['peak'])} | "
            + " | ".join(mib(row["parts"][part]) for part in PARTS)
            + f" | {row['peak'] / base['peak']:.2f} | "
            + " | ".join("-" if r is None else f"{r:.2f}" for r in ratios)
            + " |"
        )
    lines += [
        "",
        "Tensor parallelism splits the blocks' matrices (wq, wk, wv, wo, w1, w2, w3) and what attention and the "
        "MLP compute from them; the embedding, the norms and the output head stay whole on every tp rank "
        "(lwm/parallel/tensor.py), as do the residual stream's activations (each tp rank holds the whole "
        "hidden state between sublayers). So parameters, gradients and optimizer state fall to the blocks' "
        "share over tp plus the whole vocabulary matrices, and activations fall by less than tp. A part that "
        "is 0 at the peak (gradients and temporaries: the peak falls in the forward) has no ratio (-).",
    ]
    publish("tensor-parallel", "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()

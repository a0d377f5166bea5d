"""The training step's memory features, one at a time: activation checkpointing, activation offload,
head-grouped attention, sequence-tiled norms and the blockwise MLP, each a real CPU step of the tiny
model beside lwm-plan's plan of it.

Each configuration runs one real training step (lwm.core.step.train_step in a gloo world of one
process: FSDP2 and the parallel path, fp32, the CPU kernel) under the planner's own tracker
(lwm.plan.memory.tracked_step), and is planned under fake tensors with the same settings
(plan_step). Ratios are against activation checkpointing alone, measured in the same run.

Offload on CPU: the host a real CPU run copies to is the CPU itself, so the tracker counts the host
buffers in the device's peak. Every buffer is held from its block's forward to the end of the step
(the pool keeps it), so at a peak in backward all of them are live: the device peak is the tracker's
peak less ActivationOffload.host_bytes, and the host peak is host_bytes (checked: the peak must be in
backward). The plan copies to the meta device, which the tracker counts apart.

    python -m bench.memory_features                    # writes docs/benchmarks.md
    python -m bench.memory_features --lengths 256 --real-lengths 256 --chunk 64 --no-write
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bench.report import command_line, host_line, publish
from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import activation_offload
from lwm.model import ModelConfig
from lwm.parallel import build_parallel_model, compute_settings
from lwm.plan.fake import make_batch, place
from lwm.plan.memory import Mesh, StepMemory, plan_step, tracked_step

OPTIM = OptimConfig()
MIB = 2**20


@dataclass(frozen=True)
class Feature:
    """One configuration of the memory features; head groups and chunk sizes are given at use."""

    name: str
    checkpointing: bool = True
    offload: bool = False
    head_groups: bool = False
    norm_chunks: bool = False
    mlp_chunks: bool = False
    keep_attention: bool = False

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(
            activation_checkpointing=self.checkpointing,
            activation_offload=self.offload,
            keep_attention=self.keep_attention,
            document_mask=False,  # one document: the plan reads document runs on the host
        )

    def model(self, config: ModelConfig, head_groups: int, chunk: int) -> ModelConfig:
        return config.replace(
            attn_head_groups=head_groups if self.head_groups else 1,
            norm_chunk_size=chunk if self.norm_chunks else 0,
            mlp_chunk_size=chunk if self.mlp_chunks else 0,
        )

    def label(self, head_groups: int, chunk: int) -> str:
        on = [
            "checkpointing" if self.checkpointing else "no checkpointing",
            "offload" if self.offload else "",
            "kept attention" if self.keep_attention else "",
            f"attn_head_groups={head_groups}" if self.head_groups else "",
            f"norm_chunk_size={chunk}" if self.norm_chunks else "",
            f"mlp_chunk_size={chunk}" if self.mlp_chunks else "",
        ]
        return " + ".join(s for s in on if s)


TILED = dict(head_groups=True, norm_chunks=True, mlp_chunks=True)
FEATURES = {
    f.name: f
    for f in (
        Feature("checkpointing"),  # the baseline every ratio is against
        Feature("none", checkpointing=False),
        Feature("offload", offload=True),
        Feature("head_groups", head_groups=True),
        Feature("norm_chunks", norm_chunks=True),
        Feature("mlp_chunks", mlp_chunks=True),
        Feature("tiled", **TILED),
        Feature("all", offload=True, **TILED),
        Feature("kept", keep_attention=True),  # no attention forward in the recompute
        Feature("kept_offload", offload=True, keep_attention=True),
    )
}
CPU_FEATURES = ["checkpointing", "none", "offload", "head_groups", "norm_chunks", "mlp_chunks", "all"]


def setup(preset: str, seq_len: int, feature: Feature, head_groups: int, chunk: int, layers: int | None = None):
    """(model config, stage) of one configuration at seq_len tokens."""
    base = ModelConfig.from_preset(preset, **({"n_layers": layers} if layers else {}))
    config = feature.model(base.replace(max_seq_len=max(base.max_seq_len, seq_len)), head_groups, chunk)
    return config, StageConfig("features", seq_len, rope_theta=config.rope_theta, steps=2, lr=1e-5)


def planned(preset: str, seq_len: int, feature: Feature, head_groups: int, chunk: int) -> StepMemory:
    config, stage = setup(preset, seq_len, feature, head_groups, chunk)
    settings = compute_settings(torch.device("cpu"), config.head_dim)
    return plan_step(config, stage, Mesh(seq_len, 1, 1), feature.parallel(), OPTIM, settings)


def measured(preset: str, seq_len: int, feature: Feature, head_groups: int, chunk: int) -> dict:
    """One real step in the current (gloo, one rank) process group under the planner's tracker:
    the device peak and the host bytes, offload's buffers taken out of the CPU's peak."""
    config, stage = setup(preset, seq_len, feature, head_groups, chunk)
    parallel = feature.parallel()
    settings = compute_settings(torch.device("cpu"), config.head_dim)
    where = place(1, 1)
    torch.manual_seed(0)
    batch = make_batch(config, seq_len, where, 1, parallel.layout, "cpu")
    offload = activation_offload(parallel, torch.device("cpu"))
    model = build_parallel_model(
        config, where, settings, "cpu", None, parallel.layout, parallel.activation_checkpointing, offload
    )
    with torch.no_grad():
        for p in model.parameters():  # values, so the arithmetic is ordinary (to_empty left garbage)
            p.to_local().normal_(0, 0.02)
    start = time.perf_counter()
    mem = tracked_step(model, batch, OPTIM, stage, where, parallel.document_mask)
    seconds = time.perf_counter() - start
    host = offload.host_bytes if offload is not None else 0
    if host and not any(r["phase"] in ("backward", "recompute") for r in mem.breakdown):
        raise RuntimeError(f"{feature.name} at {seq_len}: the peak is in forward, where not every host buffer is live")
    return {"peak": mem.peak - host, "host": host, "seconds": seconds}


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / MIB:.1f}"


def section(args, rows: list[dict]) -> str:
    c = ModelConfig.from_preset(args.preset)
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        f"`{args.preset}` model ({c.n_layers} layers, dim {c.dim}, {c.n_heads}/{c.n_kv_heads} heads), one sequence, "
        "cp 1 in a gloo world of one process (FSDP2 and the parallel path), fp32 CPU settings, AdamW's state "
        "made before the measured step. Measured: the planner's tracker (FSDPMemTracker, "
        "lwm/plan/tracker.py) on one real training step; planned: lwm-plan's plan of the same step under "
        "fake tensors. Offload's host buffers are CPU memory in a real CPU run, counted by the tracker in the "
        "device's peak: measured device = tracker peak less the buffers' bytes (all live at a peak in backward, "
        "which the script checks), measured host = those bytes. Lengths not in --real-lengths "
        f"({', '.join(map(str, args.real_lengths))}) are planned only: a real fp32 step of each configuration "
        "there takes minutes on 2 cores. Ratios are against checkpointing alone at the same length.",
        "",
        "| tokens | configuration | device peak MiB | vs checkpointing | planned MiB | planned / measured "
        "| host MiB | planned host MiB |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        base = next(b for b in rows if b["seq_len"] == r["seq_len"] and b["feature"] == "checkpointing")
        peak = r["real_peak"] if r["real_peak"] is not None else r["plan_peak"]
        base_peak = base["real_peak"] if base["real_peak"] is not None else base["plan_peak"]
        vs = f"{peak / base_peak:.2f}x" + ("" if r["real_peak"] is not None else " (plan)")
        ratio = f"{r['plan_peak'] / r['real_peak']:.3f}" if r["real_peak"] else "n/a"
        lines.append(
            f"| {r['seq_len']} | {r['label']} | {_mib(r['real_peak'])} | {vs} | {_mib(r['plan_peak'])} | {ratio} | "
            f"{_mib(r['real_host'])} | {_mib(r['plan_host'])} |"
        )
    return "\n".join(lines)


def run(args) -> list[dict]:
    rows = []
    for seq_len in args.lengths:
        for name in args.features:
            feature = FEATURES[name]
            plan = planned(args.preset, seq_len, feature, args.head_groups, args.chunk)
            rows.append(
                {
                    "seq_len": seq_len, "feature": name, "label": feature.label(args.head_groups, args.chunk),
                    "plan_peak": plan.peak, "plan_host": plan.host_peak, "real_peak": None, "real_host": None,
                }
            )  # fmt: skip
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())  # FSDP2 needs a group
    try:
        for r in rows:
            if r["seq_len"] in args.real_lengths:
                real = measured(args.preset, r["seq_len"], FEATURES[r["feature"]], args.head_groups, args.chunk)
                r.update(real_peak=real["peak"], real_host=real["host"])
            print(
                f"{r['seq_len']} {r['label']}: device {_mib(r['real_peak'])} MiB (planned {_mib(r['plan_peak'])}), "
                f"host {_mib(r['real_host'])} MiB (planned {_mib(r['plan_host'])})",
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768], help="tokens per sequence")
    parser.add_argument(
        "--real-lengths", type=int, nargs="*", default=[8192], help="the lengths also run for real (others: plan only)"
    )
    parser.add_argument("--features", nargs="+", choices=list(FEATURES), default=CPU_FEATURES)
    parser.add_argument("--head-groups", type=int, default=2, help="attn_head_groups where head groups are on")
    parser.add_argument("--chunk", type=int, default=2048, help="norm_chunk_size and mlp_chunk_size where on")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args.features = ["checkpointing", *(f for f in args.features if f != "checkpointing")]  # the baseline first
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    publish("memory-features", section(args, run(args)), write=not args.no_write)


if __name__ == "__main__":
    main()

"""Training throughput: the tiny model through train.py on CPU (cp=1 vs cp=2), and a few layers
of a large preset on one GPU (tokens/s, TFLOP/s, MFU, peak memory).

1. run (default): each configuration is a real `python train.py` run of the tiny schedule's
   longest stage (8K tokens, stopped after a few steps); tokens/s and peak memory come from its
   metrics.csv (the Throughput and PeakMemory callbacks).
2. layers: the training step of train.py's GPU path without Lightning around it: FSDP2 over one
   rank (fp32 master weights, bf16 compute), activation checkpointing, the chunked loss, clipping,
   AdamW (lwm-plan's step), beside lwm-plan's plan of it (peak memory, and step time on a GPU
   lwm-plan lists). FLOPs are model FLOPs (6 x matmul parameters per token + causal attention once;
   the recomputation of checkpointing is not counted), MFU against the device's dense bf16 peak.
   With --features: the same step under each memory configuration of bench/memory_features.py
   (offload, head groups, tiled norms, blockwise MLP), peak and time as ratios to checkpointing alone.
3. plans: lwm-plan's plans of the steps `layers` runs with the same arguments, made beforehand on a
   machine without a GPU (the settings of --device, fake tensors) into --plans; `layers --plans FILE`
   reads them from there, so that a GPU's time goes to measuring.

    python -m bench.train            # writes docs/benchmarks.md
    python -m bench.train --steps 4 --no-write
    python -m bench.train --part layers --device cuda --preset 7b --layers 4 --lengths 8192 32768
    python -m bench.train --part layers --device cuda --preset 7b --layers 4 --lengths 32768 131072 \
        --steps 1 --features checkpointing offload tiled --head-groups 4 --chunk 16384
    python -m bench.train --part plans --device cuda --preset 7b --layers 4 --lengths 8192 --plans plans.json
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.memory_features import FEATURES, Feature
from bench.report import command_line, host_line, peak_mib, peak_tflops, publish, sync
from lwm.core.config import OptimConfig, StageConfig
from lwm.core.step import activation_offload, build_optimizer, train_step
from lwm.model import ModelConfig, Transformer
from lwm.parallel import build_parallel_model, compute_settings
from lwm.parallel.flash_impl import KERNELS, NAME, activate, choose_kernel, installed_kernels
from lwm.plan.devices import DEVICES
from lwm.plan.fake import make_batch, place
from lwm.plan.memory import Mesh, plan_step
from lwm.plan.time import step_time, step_work

ROOT = Path(__file__).resolve().parent.parent


def run(cp: int, steps: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "train.py",
        f"trainer.out_dir={out}",
        "model=tiny",
        "schedule=tiny",
        "stage_only=s8k",
        "export=false",
        "evaluate.lengths=null",
        "trainer.log_every=1",
        f"trainer.devices={cp}",
        f"+schedule.stages.2.cp={cp}",
        f"+stop_at_step={steps}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode not in (0, 4):  # 4: stopped at stop_at_step, as asked
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = [r for r in csv.DictReader(open(out / "s8k" / "logs" / "metrics.csv")) if r.get("perf/tokens_per_s")]
    later = rows[1:] or rows  # the first step pays for start-up
    return {
        "tokens_per_s": statistics.median(float(r["perf/tokens_per_s"]) for r in later),
        "peak_mib": max(float(r["perf/peak_mem_mib"]) for r in rows),
        "steps": len(rows),
    }


def model_flops_per_token(config, seq_len: int) -> float:
    """6 x the parameters every token goes through in matmuls (not the embedding lookup), plus the
    causal attention scores and values: 2 matmuls x 2 FLOPs x seq_len/2 keys x dim, x3 for the
    backward."""
    c = config
    per_layer = c.dim * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads) + 3 * c.dim * c.ffn_dim
    matmul = c.n_layers * per_layer + c.vocab_size * c.dim
    return 6 * matmul + 3 * c.n_layers * 2 * 2 * (seq_len / 2) * c.dim


def layer_step(
    preset: str,
    layers: int,
    seq_len: int,
    steps: int,
    device_type: str,
    memory: Memory | None = None,
    kernel: str = "auto",
) -> dict:
    """In a one-rank process group: the training step LWMModule and lwm-plan run
    (lwm.core.step.train_step: the objective, backward, clipping, AdamW, the schedule) on real
    tensors, under `memory`'s features (None: checkpointing alone); times `steps` steps after one
    warm-up step, the device's peak allocation over them, and offload's host buffers. kernel: the
    parallel.attention_kernel chosen (cudnn: the blocks call cuDNN's attention; the others act through
    torch's registry, activated by the caller)."""
    memory = memory or Memory()
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    gc.collect()  # the previous configuration's model: FSDP2 and the offload hooks hold it in reference cycles
    config, stage = layer_setup(preset, layers, seq_len, steps, memory)
    parallel = memory.feature.parallel()
    torch.manual_seed(0)
    with device:
        init_state = Transformer(config).state_dict()
    where = place(1, 1, device.type)
    settings = compute_settings(device, config.head_dim, kernel)
    offload = activation_offload(parallel, device)
    model = build_parallel_model(
        config,
        where,
        settings,
        device,
        init_state,
        parallel.layout,
        parallel.activation_checkpointing,
        offload,
        keep_attention=parallel.kept_blocks(config.n_layers),
    )
    del init_state
    optimizer, scheduler = build_optimizer(model, stage, OPTIM)
    batch = make_batch(config, seq_len, where, 1, parallel.layout, device)

    def step():
        train_step(model, batch, optimizer, OPTIM, where.cp_group, False, scheduler)

    step()  # warm-up: kernels chosen, optimizer state made
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    secs = (time.perf_counter() - start) / steps
    return {
        "step_s": secs,
        "peak_mib": peak_mib(device),
        "flops_per_token": model_flops_per_token(config, seq_len),
        "params": sum(p.numel() for p in model.parameters()),
        "host_mib": offload.host_bytes / 2**20 if offload is not None else 0.0,
    }


OPTIM = OptimConfig()


@dataclass(frozen=True)
class Memory:
    """A memory configuration of the step: bench/memory_features.py's feature with its sizes."""

    feature: Feature = FEATURES["checkpointing"]
    head_groups: int = 1
    chunk: int = 0

    def label(self) -> str:
        return self.feature.label(self.head_groups, self.chunk)


def layer_setup(
    preset: str, layers: int, seq_len: int, steps: int, memory: Memory | None = None
) -> tuple[ModelConfig, StageConfig]:
    memory = memory or Memory()
    config = ModelConfig.from_preset(preset, n_layers=layers, max_seq_len=seq_len)
    config = memory.feature.model(config, memory.head_groups, memory.chunk)
    return config, StageConfig("layers", seq_len, rope_theta=config.rope_theta, steps=steps + 1, lr=1e-5)


def plan_key(preset: str, layers: int, seq_len: int, device_type: str, memory: Memory) -> str:
    """What a plan depends on, as the plans file (--plans) names it."""
    return f"{preset} x{layers} S={seq_len} on {device_type}: {memory.label()}"


def plan_of(preset: str, layers: int, seq_len: int, device_type: str, memory: Memory | None = None) -> dict:
    """lwm-plan's plan of the step (fake tensors, the settings of device_type; needs no GPU): the tracked peak,
    the host peak, and the roofline step time on each GPU lwm.plan.devices lists."""
    memory = memory or Memory()
    config, stage = layer_setup(preset, layers, seq_len, 1, memory)
    parallel = memory.feature.parallel()
    settings = compute_settings(torch.device(device_type), config.head_dim)
    mesh = Mesh(seq_len, 1, 1)
    mem = plan_step(config, stage, mesh, parallel, OPTIM, settings)
    work = step_work(config, mesh, mem, parallel.layout, parallel.mode, parallel.activation_checkpointing)
    times = {name: step_time(work, mesh, gpu, 8).seconds for name, gpu in DEVICES.items()}
    return {"peak_mib": mem.peak / 2**20, "host_mib": mem.host_peak / 2**20, "step_s": times}


def planned_step(
    preset: str,
    layers: int,
    seq_len: int,
    device: torch.device,
    memory: Memory | None = None,
    ahead: dict | None = None,
) -> dict:
    """The plan of the step on `device`: from `ahead` (a plans file's, made beforehand on any machine) when it
    holds it, else planned here; the step time where lwm.plan.devices knows the GPU, else None."""
    memory = memory or Memory()
    key = plan_key(preset, layers, seq_len, device.type, memory)
    plan = (ahead or {}).get(key)
    print(f"plan of {key}: {'from the plans file' if plan else 'planned here'}", flush=True)
    plan = plan or plan_of(preset, layers, seq_len, device.type, memory)
    gpu = known_gpu(device)
    return {**plan, "step_s": plan["step_s"].get(gpu) if gpu else None}


def plans_part(args) -> None:
    """Plan beforehand, on any machine, every step --part layers would run with the same arguments, into --plans
    (added to what it holds), so that a GPU run spends its time measuring."""
    path = args.plans
    plans = read_plans(path)
    for memory in memories(args):
        for seq_len in args.lengths:
            key = plan_key(args.preset, args.layers, seq_len, args.device, memory)
            if key in plans:  # another part's (gpu_check's parts share the baseline)
                continue
            start = time.perf_counter()
            plans[key] = plan_of(args.preset, args.layers, seq_len, args.device, memory)
            print(f"planned {key} in {time.perf_counter() - start:.1f} s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    print(f"{len(plans)} plans in {path}")


def memories(args) -> list[Memory]:
    """The memory configurations --part layers runs: each of --features, or checkpointing alone."""
    if not args.features:
        return [Memory()]
    return [Memory(FEATURES[name], args.head_groups, args.chunk) for name in args.features]


def read_plans(path: Path | None) -> dict:
    return json.loads(path.read_text()) if path is not None and path.exists() else {}


def known_gpu(device: torch.device) -> str | None:
    """The lwm-plan device of this GPU's name (H100, H200, A100, B200), or None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((key for key in DEVICES if key.split("-")[0].upper() in name), None)


def ratio(measured: float, planned: float | None) -> str:
    return f"{measured / planned:.2f}" if planned else "n/a"


def layers_part(args) -> str:
    """The step at each length, under each of --kernels (parallel.attention_kernel values; the first measured
    is the baseline of the ratio column): a kernel this device cannot run, or whose module is not installed,
    is named with the reason and skipped."""
    import torch.distributed as dist

    peak = peak_tflops(args.device)
    device = torch.device(args.device)
    ahead = read_plans(args.plans)
    plans = {
        n: planned_step(args.preset, args.layers, n, device, ahead=ahead) for n in args.lengths
    }  # before the group
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    kernels, skipped = [], []
    for setting in args.kernels:
        try:
            kernels.append((setting, choose_kernel(setting, device.type, capability, installed_kernels())))
        except ValueError as e:
            skipped.append(str(e))
    label = NAME if device.type == "cuda" else {"fa2": "torch's CPU kernel"}
    rows, base = [], {}
    # FSDP2 needs a process group: one rank, NCCL on a GPU and gloo on CPU
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1, store=dist.HashStore())
    for setting, kernel in kernels:
        activate(kernel)
        for seq_len in args.lengths:
            r = layer_step(args.preset, args.layers, seq_len, args.steps, args.device, kernel=kernel)
            if args.device == "cuda":
                torch.cuda.empty_cache()
            plan, first = plans[seq_len], base.setdefault(seq_len, r)
            tps = seq_len / r["step_s"]
            tflops = tps * r["flops_per_token"] / 1e12
            mfu = f"{100 * tflops / peak:.1f}%" if peak else "n/a"
            planned_s = f"{plan['step_s']:.3f}" if plan["step_s"] else "n/a"
            rows.append(
                f"| {seq_len} | {label[kernel]} | {r['step_s']:.3f} | {first['step_s'] / r['step_s']:.2f}x | {tps:.0f} | "
                f"{tflops:.1f} | {mfu} | {r['peak_mib'] / 1024:.2f} | {plan['peak_mib'] / 1024:.2f} | "
                f"{ratio(r['peak_mib'], plan['peak_mib'])} | {planned_s} | {ratio(r['step_s'], plan['step_s'])} |"
            )
            print(
                f"layers {args.preset} x{args.layers} S={seq_len} {label[kernel]}: {r['step_s']:.3f} s/step, {tps:.0f} "
                f"tokens/s, {tflops:.1f} TFLOP/s, MFU {mfu}, peak {r['peak_mib'] / 1024:.2f} GiB (planned "
                f"{plan['peak_mib'] / 1024:.2f} GiB, {planned_s} s)",
                flush=True,
            )
    activate("fa2")
    where = f"{args.device}" + (f", peak {peak} TFLOP/s dense bf16" if peak else "")
    dist.destroy_process_group()
    params = f"{r['params'] / 1e6:,.0f}M parameters with the embedding and output" if kernels else "none measured"
    return "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"`{args.preset}` shapes with {args.layers} layers ({params}), batch 1, {where}; FSDP2 over one rank "
            "(fp32 master weights, bf16 compute on a GPU), activation checkpointing, chunked loss, clipping, AdamW "
            f"(lwm-plan's step); mean of {args.steps} steps after a warm-up, under each attention kernel "
            "(parallel.attention_kernel; the speed-up column is against the first kernel's step at the same length). "
            "Model FLOPs per token = 6 x matmul parameters + causal attention (each score once); peak memory "
            "= the device's peak allocation (CPU: the process's peak RSS, interpreter and libraries included, so the "
            "ratio to the plan means something on a GPU only). Planned: lwm-plan's tracked peak of the same step "
            "(no margins) and its roofline time for this GPU with FlashAttention-2 (docs/planning.md; n/a for a "
            "device it does not list).",
            "",
            "| tokens per sequence | attention | s/step | speed-up | tokens/s | TFLOP/s | MFU | peak memory (GiB) "
            "| planned peak (GiB) | measured / planned | planned s/step | measured / planned |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            *(["", "Not measured: " + "; ".join(skipped) + "."] if skipped else []),
        ]
    )


def features_part(args) -> None:
    """The step under each of --features (the first is the baseline) at each length, one at a time:
    planned (a fake process group), then run in a one-rank group of its own; the section is published
    after each, so a run cut off by its time cap keeps every row it measured."""
    import torch.distributed as dist

    device = torch.device(args.device)
    ahead = read_plans(args.plans)
    todo = [(n, m) for n in args.lengths for m in memories(args)]
    rows, base = [], {}
    for i, (seq_len, memory) in enumerate(todo):
        plan = planned_step(args.preset, args.layers, seq_len, device, memory, ahead)  # outside the real group
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1, store=dist.HashStore()
        )
        try:
            r = layer_step(args.preset, args.layers, seq_len, args.steps, args.device, memory)
        finally:
            dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        b = base.setdefault(seq_len, r)
        rows.append(
            f"| {seq_len} | {memory.label()} | {r['step_s']:.3f} | {r['step_s'] / b['step_s']:.2f}x | "
            f"{r['peak_mib'] / 1024:.2f} | {r['peak_mib'] / b['peak_mib']:.2f}x | {plan['peak_mib'] / 1024:.2f} | "
            f"{ratio(r['peak_mib'], plan['peak_mib'])} | {r['host_mib'] / 1024:.2f} | {plan['host_mib'] / 1024:.2f} |"
        )
        print(
            f"features {args.preset} x{args.layers} S={seq_len} {memory.label()}: {r['step_s']:.3f} s/step, "
            f"peak {r['peak_mib'] / 1024:.2f} GiB (planned {plan['peak_mib'] / 1024:.2f}), host "
            f"{r['host_mib'] / 1024:.2f} GiB (planned {plan['host_mib'] / 1024:.2f})",
            flush=True,
        )
        left = [f"{n} {m.feature.name}" for n, m in todo[i + 1 :]]
        publish(f"train-features-{args.device}", features_section(args, rows, left), write=not args.no_write)


def features_section(args, rows: list[str], left: list[str]) -> str:
    base = Memory(FEATURES[args.features[0]], args.head_groups, args.chunk).label()
    pending = f"Not measured (the run was still going, or stopped, when this was written): {', '.join(left)}."
    return "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"`{args.preset}` shapes with {args.layers} layers, batch 1, {args.device}; the step of the "
            "train-layers section under each memory configuration (bench/memory_features.py; docs/planning.md), "
            f"mean of {args.steps} steps after a warm-up, ratios to `{base}` at the same length. Peak memory = "
            "the device's peak allocation (CPU: the process's peak RSS; offload's host buffers are then in it); "
            "host = offload's host buffers (pinned memory on a GPU, not in the device's peak). Planned: lwm-plan's "
            "tracked peak and host peak of the same step (no margins).",
            "",
            "| tokens | configuration | s/step | vs baseline | peak (GiB) | vs baseline | planned peak (GiB) "
            "| measured / planned | host (GiB) | planned host (GiB) |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            *(["", pending] if left else []),
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["run", "layers", "plans"], default="run")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="layers: cpu or cuda")
    parser.add_argument("--preset", default="7b", help="layers: the model preset whose shapes are used")
    parser.add_argument("--layers", type=int, default=4, help="layers: how many of its layers")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768], help="layers: tokens per sequence")
    parser.add_argument(
        "--features",
        nargs="+",
        choices=list(FEATURES),
        help="layers: memory configurations to compare (bench/memory_features.py), the first the baseline",
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        choices=list(KERNELS),
        default=["auto"],
        help="layers: the attention kernels to time the step with (parallel.attention_kernel), the first the baseline",
    )
    parser.add_argument("--head-groups", type=int, default=4, help="layers --features: attn_head_groups where on")
    parser.add_argument("--chunk", type=int, default=16384, help="layers --features: norm and MLP chunk where on")
    parser.add_argument(
        "--plans",
        type=Path,
        help="layers: read the plans from this file where it has them (made by --part plans); plans: write them here",
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.part == "plans":
        if args.plans is None:
            parser.error("--part plans: name the file to write with --plans")
        plans_part(args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.part == "layers" and args.features:
        features_part(args)
        return
    if args.part == "layers":
        publish(f"train-layers-{args.device}", layers_part(args), write=not args.no_write)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cp in (1, 2):
            results[cp] = run(cp, args.steps, Path(tmp) / f"cp{cp}")
            r = results[cp]
            print(f"cp={cp}: {r['tokens_per_s']:.0f} tokens/s, peak {r['peak_mib']:.0f} MiB per rank", flush=True)
    base = results[1]
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        f"`tiny` model, stage s8k of the tiny schedule (8192 tokens per sequence, batch 1), fp32, {args.steps} steps, "
        "median tokens/s after the first step; peak memory = the rank's peak RSS (includes the Python process, "
        "torch and the data). cp=2 runs two processes (FSDP2 over both, ring attention, gloo) on the same 2 cores.",
        "",
        "| cp | processes | tokens/s (all ranks) | vs cp=1 | peak memory per rank (MiB) | vs cp=1 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cp, r in results.items():
        lines.append(
            f"| {cp} | {cp} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
            f"{r['peak_mib']:.0f} | {r['peak_mib'] / base['peak_mib']:.2f}x |"
        )
    lines.append("")
    lines.append("7B-shaped layers on one GPU (tokens/s, MFU at 8K and 32K) are `--part layers`: the GPU section.")
    markdown = "\n".join(lines)
    publish("train", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

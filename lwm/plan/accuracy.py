"""How close the plan comes, measured on this machine's CPU: the plan of a step (fake tensors, CPU
settings: fp32, the CPU kernel) against the same step run for real over gloo, 1 or 2 processes.

    python -m lwm.plan.accuracy --preset tiny --seq-lens 2048 8192 --cps 1 2

Memory: the tracker's peak in both (equal when the plan is right), and the real process's peak
RSS growth (VmHWM after the steps less RSS before the model is built; glibc told to return freed
memory at once: MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0). Time: the plan's roofline
with this CPU's measured matmul rate and copy bandwidth, against an untracked real step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig, stage_model_config
from lwm.core.step import build_optimizer, train_step
from lwm.model import ModelConfig
from lwm.model.config import PRESETS
from lwm.parallel import build_parallel_model, compute_settings
from lwm.parallel.launch import run_distributed
from lwm.plan.devices import cpu_device
from lwm.plan.fake import make_batch, place
from lwm.plan.memory import Mesh, plan_step, tracked_step
from lwm.plan.time import step_time, step_work

MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
PARALLEL = ParallelConfig(document_mask=False)  # as planned: document runs are read on the host


@dataclass
class AccuracyConfig:
    preset: str = field(default="tiny", metadata={"help": f"model preset: {', '.join(PRESETS)}"})
    seq_lens: list[int] = field(default_factory=lambda: [2048, 8192], metadata={"help": "sequence lengths"})
    cps: list[int] = field(
        default_factory=lambda: [1, 2], metadata={"help": "context-parallel sizes (one process each)"}
    )
    workspace_mib: float = field(
        default=0.0, metadata={"help": "the CPU's untracked workspaces added to the plan (MiB)"}
    )
    out: str = field(default="", metadata={"help": "a JSON file for the results (empty: print only)"})


def _setup(preset: str, seq_len: int, cp: int):
    stage = StageConfig("accuracy", seq_len, rope_theta=1e4, steps=4, lr=1e-4, cp=cp)
    return stage_model_config(ModelConfig.from_preset(preset), stage), stage


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("VmHWM"))
    return int(line.split()[1]) * 1024


def real_step(rank: int, world: int, preset: str, seq_len: int, cp: int, tp: int = 1) -> dict:
    """In a gloo worker: the step for real, tracked (two steps), then two untracked, the last timed."""
    config, stage = _setup(preset, seq_len, cp)
    optim, settings = OptimConfig(), compute_settings(torch.device("cpu"), config.head_dim)
    where = place(world // (cp * tp), cp, tp=tp)
    torch.manual_seed(rank // tp)  # a tp group's ranks read the same batch
    batch = make_batch(config, seq_len, where, 1, PARALLEL.layout, "cpu")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the RSS now
    before = _rss()
    model = build_parallel_model(
        config, where, settings, "cpu", None, PARALLEL.layout, PARALLEL.activation_checkpointing
    )
    with torch.no_grad():
        for p in model.parameters():  # values, so the arithmetic is ordinary (to_empty left garbage)
            p.to_local().normal_(0, 0.02)
    mem = tracked_step(model, batch, optim, stage, where, PARALLEL.document_mask)
    grown = _hwm() - before
    optimizer, scheduler = build_optimizer(model, stage, optim)
    train_step(model, batch, optimizer, optim, where.cp_group, False, scheduler)
    start = time.perf_counter()
    train_step(model, batch, optimizer, optim, where.cp_group, False, scheduler)
    return {"peak": mem.peak, "breakdown": mem.breakdown, "rss_growth": grown, "seconds": time.perf_counter() - start}


def cpu_rates(threads: int = 1) -> tuple[float, float]:
    """(TFLOP/s of a 1024^3 fp32 matmul, GB/s of a 256 MiB copy: read + write) on `threads` threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    start, n = time.perf_counter(), 20
    for _ in range(n):
        a @ b
    tflops = 2 * 1024**3 * n / (time.perf_counter() - start) / 1e12
    x = torch.empty(2**26)  # 256 MiB of fp32
    y = x.clone()
    start = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    gbps = 2 * x.nbytes * 5 / (time.perf_counter() - start) / 1e9
    return tflops, gbps


def measure(config: AccuracyConfig) -> list[dict]:
    os.environ.update(MALLOC)  # read by each spawned worker's allocator at its start
    tflops, gbps = cpu_rates()
    device = cpu_device(tflops, gbps, 64.0, config.workspace_mib)
    rows = []
    for seq_len in config.seq_lens:
        for cp in config.cps:
            model_config, stage = _setup(config.preset, seq_len, cp)
            mesh = Mesh(seq_len, cp, 1)
            settings = compute_settings(torch.device("cpu"), model_config.head_dim)
            plan = plan_step(model_config, stage, mesh, PARALLEL, OptimConfig(), settings)
            work = step_work(
                model_config, mesh, plan, PARALLEL.layout, PARALLEL.mode, PARALLEL.activation_checkpointing
            )
            predicted = step_time(work, mesh, device, node_size=cp)
            real = run_distributed(real_step, cp, config.preset, seq_len, cp, timeout=600, fresh=True)[0]
            planned = plan.peak + config.workspace_mib * 2**20
            rows.append(
                {
                    "preset": config.preset, "seq_len": seq_len, "cp": cp,
                    "plan_peak": plan.peak, "real_peak": real["peak"], "rss_growth": real["rss_growth"],
                    "plan_over_rss": planned / real["rss_growth"], "gap_mib": (real["rss_growth"] - plan.peak) / 2**20,
                    "plan_s": predicted.seconds, "real_s": real["seconds"], "time_ratio": predicted.seconds / real["seconds"],
                    "time_parts": predicted.parts, "cpu_tflops": tflops, "cpu_gbps": gbps,
                }
            )  # fmt: skip
            r = rows[-1]
            print(
                f"{config.preset} {seq_len} cp {cp}: plan {r['plan_peak'] / 2**20:.2f} MiB, real tracker "
                f"{r['real_peak'] / 2**20:.2f} MiB, RSS growth {r['rss_growth'] / 2**20:.2f} MiB "
                f"(plan/RSS {r['plan_over_rss']:.3f}, gap {r['gap_mib']:.1f} MiB); time plan {r['plan_s']:.3f} s "
                f"real {r['real_s']:.3f} s (ratio {r['time_ratio']:.2f})",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(AccuracyConfig):
        default = f.default if f.default is not MISSING else f.default_factory()
        many = isinstance(default, list)
        kind = int if many else type(default)
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=kind,
            nargs="+" if many else None,
            default=default,
            help=f.metadata["help"],
        )
    config = AccuracyConfig(**vars(p.parse_args(argv)))
    rows = measure(config)
    if config.out:
        Path(config.out).write_text(json.dumps({"config": asdict(config), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Forward+backward time and peak memory: lwm's Transformer vs transformers' LlamaForCausalLM.

Both models get the same config and the same weights (through lwm.interop.hf), SDPA attention,
fp32, batch 1, on CPU. Each is trained the way it is meant to be: ours with the chunked loss
(`model(tokens, targets=...)`), transformers' with `labels=` (full logits + cross entropy).

Time: both models live in this process and are run alternately, `--repeats` rounds after a
warm-up; the median is reported. Memory: each (model, length) runs in a fresh subprocess that
resets the peak resident set size (/proc/self/clear_refs) after building the model and reports
how far the peak rose during one forward+backward.

    python -m bench.model                     # tiny preset, 1K/4K/8K, prints and writes docs/benchmarks.md
    python -m bench.model --no-write --lengths 1024
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

import torch

from bench.report import command_line, host_line, publish, reset_peak_rss, status_kib
from lwm.interop.hf import config_to_hf, to_hf_state_dict
from lwm.model import ModelConfig, Transformer
from lwm.paths import REPO


def build(impl: str, preset: str, seed: int = 0):
    torch.manual_seed(seed)
    ours = Transformer(ModelConfig.from_preset(preset))
    if impl == "ours":
        return ours
    from transformers import LlamaForCausalLM

    hf_config = config_to_hf(ours.config)
    hf_config._attn_implementation = "sdpa"
    theirs = LlamaForCausalLM(hf_config)
    theirs.load_state_dict(to_hf_state_dict(ours.state_dict(), ours.config))
    return theirs


def step_fn(impl: str, model, seq_len: int, vocab_size: int):
    """One training step's forward+backward on a fixed random sequence."""
    tokens = torch.randint(0, vocab_size, (1, seq_len + 1), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if impl == "ours":
        return lambda: model(inputs, targets=targets).loss.backward()
    return lambda: model(input_ids=inputs, labels=inputs).loss.backward()  # shifts labels itself


def time_both(preset: str, seq_len: int, repeats: int) -> dict[str, float]:
    models = {impl: build(impl, preset) for impl in ("ours", "hf")}
    vocab = models["ours"].config.vocab_size
    steps = {impl: step_fn(impl, m, seq_len, vocab) for impl, m in models.items()}
    times: dict[str, list[float]] = {impl: [] for impl in steps}
    for impl in steps:  # warm-up
        steps[impl]()
    for _ in range(repeats):
        for impl, step in steps.items():
            for p in models[impl].parameters():
                p.grad = None
            gc.collect()
            start = time.perf_counter()
            step()
            times[impl].append(time.perf_counter() - start)
    return {impl: statistics.median(t) for impl, t in times.items()}


def measure_memory_here(impl: str, preset: str, seq_len: int) -> float:
    """Rise of the peak RSS during one forward+backward, in MiB (run in a fresh process)."""
    model = build(impl, preset)
    step = step_fn(impl, model, seq_len, ModelConfig.from_preset(preset).vocab_size)
    gc.collect()
    base = reset_peak_rss()
    step()
    return (status_kib("VmHWM") - base) / 1024


def measure_memory(impl: str, preset: str, seq_len: int) -> float:
    cmd = [sys.executable, "-m", "bench.model", "--memory-child", impl, "--preset", preset, "--lengths", str(seq_len)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; do not update docs/benchmarks.md")
    parser.add_argument("--memory-child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.memory_child:
        print(json.dumps({"peak_mib": measure_memory_here(args.memory_child, args.preset, args.lengths[0])}))
        return

    cfg = ModelConfig.from_preset(args.preset)
    rows = []
    for seq_len in args.lengths:
        t = time_both(args.preset, seq_len, args.repeats)
        mem = {impl: measure_memory(impl, args.preset, seq_len) for impl in ("ours", "hf")}
        row = dict(seq_len=seq_len, t_ours=t["ours"], t_hf=t["hf"], m_ours=mem["ours"], m_hf=mem["hf"])
        rows.append(row)
        print(
            f"S={seq_len:5d}  time ours {t['ours']:.3f}s  hf {t['hf']:.3f}s  ratio {t['ours'] / t['hf']:.3f}   "
            f"peak mem ours {mem['ours']:.0f} MiB  hf {mem['hf']:.0f} MiB  ratio {mem['ours'] / mem['hf']:.3f}",
            flush=True,
        )

    table = [
        "| seq len | ours fwd+bwd (s) | transformers (s) | time ratio | ours peak (MiB) | transformers peak (MiB) | memory ratio |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        table.append(
            f"| {r['seq_len']} | {r['t_ours']:.3f} | {r['t_hf']:.3f} | {r['t_ours'] / r['t_hf']:.3f} | "
            f"{r['m_ours']:.0f} | {r['m_hf']:.0f} | {r['m_ours'] / r['m_hf']:.3f} |"
        )
    markdown = "\n".join(
        [
            f"Command: `{command_line()}`  ",
            f"Host: {host_line()}  ",
            f"Model: preset `{args.preset}` ({cfg.num_params() / 1e6:.1f}M parameters, dim {cfg.dim}, "
            f"{cfg.n_layers} layers, {cfg.n_heads}/{cfg.n_kv_heads} heads, vocab {cfg.vocab_size}), fp32, batch 1; "
            f"time is the median of {args.repeats} alternating rounds, memory the rise of peak RSS in a fresh process.",
            "",
            *table,
        ]
    )
    publish("model", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

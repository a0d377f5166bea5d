"""Inference speed and memory of the tiny model: prefill and decode tokens/s with cp=1 (one
process, 2 threads) and cp=2 (two processes, 1 thread each, ring prefill + sharded KV cache),
and peak memory per rank against prompt length. `--parts longest`: the longest prompt the tiny
model can prefill on one device (chunked prefill, bf16), from 128K tokens up to 2M, and decode
tokens/s after it; its section is written again after each length, so a run stopped at a long one
keeps the shorter ones.

    python -m bench.infer                      # writes docs/benchmarks.md
    python -m bench.infer --lengths 2048 --no-write
    python -m bench.infer --parts longest --device cuda
"""

from __future__ import annotations

import argparse
import time
from typing import Iterator

import torch

from bench.report import command_line, host_line, peak_mib, publish, sync
from lwm.data.vocab import Vocab
from lwm.infer import Generator
from lwm.model import ModelConfig, Transformer
from lwm.parallel.launch import run_distributed

N_DECODE = 32


def _model(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    vocab = Vocab(4096)
    config = ModelConfig.from_preset(
        "tiny", vocab_size=vocab.size, rope_theta=1e6, max_seq_len=1 << 21, mlp_chunk_size=8192
    )
    return Transformer(config).to(device=device, dtype=dtype).eval(), vocab


def _measure(rank: int, world: int, length: int, threads: int) -> dict:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    model, vocab = _model()
    prompt = torch.randint(0, vocab.text_size, (length,), generator=torch.Generator().manual_seed(0))
    gen = Generator(model, vocab, group=dist.group.WORLD if world > 1 else None)
    gen.prefill(prompt[:256])  # warm-up: first-call kernel setup is not part of the measurement
    gen.release()
    before = peak_mib()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    gen.prefill(prompt, reserve=N_DECODE)
    if world > 1:
        dist.barrier()
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for t in range(N_DECODE):
        gen.extend([t + 5])
    decode_s = time.perf_counter() - start
    cache_bytes = sum(2 * layer.cache.keys.numel() * layer.cache.keys.element_size() for layer in gen.cache.layers)
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "peak_mib": peak_mib(),
        "model_mib": before,
        "cache_mib": cache_bytes / 2**20,
    }


def measure_cpu(cp: int, length: int) -> dict:
    results = run_distributed(_measure, cp, length, 2 // cp, timeout=3600)
    return {
        "prefill_tps": length / max(r["prefill_s"] for r in results),
        "decode_tps": N_DECODE / max(r["decode_s"] for r in results),
        "peak_mib": max(r["peak_mib"] for r in results),
        "added_mib": max(r["peak_mib"] - r["model_mib"] for r in results),
        "cache_mib": max(r["cache_mib"] for r in results),
    }


def longest_prefill(device: str, lengths: list[int], chunk: int) -> Iterator[dict]:
    """Prefill each length in turn (bf16, chunks of `chunk` tokens), then decode N_DECODE tokens; each
    row as soon as it is measured. Stops after the first length that runs out of memory (its row says so)."""
    model, vocab = _model(device, torch.bfloat16)
    for length in lengths:
        row = _longest_row(model, vocab, device, length, chunk)
        if row["prefill_s"] is None:
            yield row
            return
        print(
            f"{device} prefill {length}: {row['prefill_s']:.1f} s ({length / row['prefill_s']:.0f} tok/s), decode "
            f"{row['decode_tps']:.1f} tok/s, peak {row['peak_gib']:.1f} GiB",
            flush=True,
        )
        yield row


def _longest_row(model, vocab, device: str, length: int, chunk: int) -> dict:
    """One length's prefill and decode: {"length", "prefill_s", "decode_tps", "peak_gib"}; prefill_s None
    when it ran out of memory."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    prompt = torch.randint(0, vocab.text_size, (length,), device=device)
    gen = Generator(model, vocab, prefill_chunk=chunk)
    try:
        sync(device)
        start = time.perf_counter()
        gen.prefill(prompt, reserve=N_DECODE)
        sync(device)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for t in range(N_DECODE):
            gen.extend([t + 5])
        sync(device)
        decode_s = time.perf_counter() - start
        return {
            "length": length,
            "prefill_s": prefill_s,
            "decode_tps": N_DECODE / decode_s,
            "peak_gib": peak_mib(device) / 1024,
        }
    except torch.OutOfMemoryError:
        return {"length": length, "prefill_s": None}
    finally:
        gen.release()
        del prompt


def longest_section(device: str, lengths: list[int], chunk: int, rows: list[dict]) -> list[str]:
    """The table of the rows measured so far; a line names the lengths still to come, so a section
    left by a run that was stopped says where it stopped."""
    lines = [
        f"{device}, one device, `tiny` model (random weights) in bf16, batch 1, a random text prompt prefilled in "
        f"chunks of {chunk} tokens, then {N_DECODE} single-token decode steps. Peak = the device's peak "
        "allocation (CPU: the process's peak RSS). Target: an hour of video, 925,200 tokens, or more.",
        "",
        "| prompt tokens | prefill (s) | prefill tok/s | decode tok/s | peak GiB |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r["prefill_s"] is None:
            lines.append(f"| {r['length']} | out of memory | | | |")
        else:
            lines.append(
                f"| {r['length']} | {r['prefill_s']:.1f} | {r['length'] / r['prefill_s']:.0f} | "
                f"{r['decode_tps']:.1f} | {r['peak_gib']:.1f} |"
            )
    stopped = rows and rows[-1]["prefill_s"] is None
    if len(rows) < len(lengths) and not stopped:
        lines += [
            "",
            f"Not measured (the run was still going, or stopped, when this was written): {lengths[len(rows) :]}.",
        ]
    return lines


def publish_longest(device: str, lengths: list[int], chunk: int, write: bool) -> None:
    """The infer-longest section, published again after each length: a run cut off at a long length
    (a part's time cap) keeps the rows measured before it."""
    head = [f"Command: `{command_line()}`  ", f"Host: {host_line()}  "]
    rows: list[dict] = []
    for row in longest_prefill(device, lengths, chunk):
        rows.append(row)
        markdown = "\n".join([*head, *longest_section(device, lengths, chunk, rows)])
        publish(f"infer-longest-{device}", markdown, write=write)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["cp", "longest"],
        default=["cp"],
        help="cp: cp=1 vs cp=2 on CPU; longest: the longest prefill on --device",
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768], help="cp: prompt lengths")
    parser.add_argument("--device", default="cuda", help="longest: cuda or cpu")
    parser.add_argument(
        "--longest-lengths",
        type=int,
        nargs="+",
        default=[131072, 262144, 524288, 925200, 1048576, 2097152],
        help="longest: prompts, in order",
    )
    parser.add_argument("--chunk", type=int, default=16384, help="longest: prefill chunk")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if "longest" in args.parts and args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--parts longest --device cuda: no CUDA device here (--device cpu runs it on CPU)")
    if "longest" in args.parts:
        publish_longest(args.device, args.longest_lengths, args.chunk, write=not args.no_write)
    if "cp" not in args.parts:
        return
    rows = []
    for length in args.lengths:
        base = None
        for cp in (1, 2):
            r = measure_cpu(cp, length)
            base = base or r
            print(
                f"{length} tokens, cp={cp}: prefill {r['prefill_tps']:.0f} tok/s, decode {r['decode_tps']:.1f} tok/s, "
                f"peak {r['peak_mib']:.0f} MiB, cache {r['cache_mib']:.1f} MiB per rank",
                flush=True,
            )
            rows.append(
                f"| {length} | {cp} | {r['prefill_tps']:.0f} | {r['prefill_tps'] / base['prefill_tps']:.2f}x | "
                f"{r['decode_tps']:.1f} | {r['decode_tps'] / base['decode_tps']:.2f}x | {r['peak_mib']:.0f} | "
                f"{r['peak_mib'] / base['peak_mib']:.2f}x | {r['added_mib']:.0f} | {r['cache_mib']:.1f} |"
            )
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        "`tiny` model (random weights), fp32, batch 1, a random text prompt; prefill = the whole prompt into the KV "
        "cache (cp=1: chunks of 8192 tokens; cp=2: ring prefill over 2 gloo processes in segments of 8192 tokens "
        f"per rank), decode = {N_DECODE} "
        "single-token steps after it. cp=1 is one process with 2 threads, cp=2 two processes with 1 thread each "
        "on the same 2 cores. Peak memory = the rank's peak RSS (Python, torch, model, cache, activations); cache = "
        "the rank's K/V; added = peak RSS minus the RSS with the model loaded, before the prompt.",
        "",
        "| prompt tokens | cp | prefill tok/s | vs cp=1 | decode tok/s | vs cp=1 | peak MiB per rank | vs cp=1 "
        "| added by inference MiB | cache MiB per rank |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]
    lines.append("The longest prompt on one GPU is `--parts longest` (section infer-longest-cuda).")
    markdown = "\n".join(lines)
    publish("infer", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

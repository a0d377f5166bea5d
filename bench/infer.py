"""Inference speed and memory of the tiny model: prefill and decode tokens/s with cp=1 (one
process, 2 threads) and cp=2 (two processes, 1 thread each, ring prefill + sharded KV cache),
and peak memory per rank against prompt length. With a GPU: the longest prompt the tiny model
can prefill on one GPU (chunked prefill, bf16), from 128K tokens up to 2M.

    python bench/infer.py                      # writes docs/benchmarks.md
    python bench/infer.py --lengths 2048 --no-write
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import command_line, host_line, publish  # noqa: E402

N_DECODE = 32


def _model(device="cpu", dtype=torch.float32):
    from lwm.data.vocab import Vocab
    from lwm.model import ModelConfig, Transformer

    torch.manual_seed(0)
    vocab = Vocab(4096)
    config = ModelConfig.from_preset("tiny", vocab_size=vocab.size, rope_theta=1e6, max_seq_len=1 << 21, mlp_chunk_size=8192)
    return Transformer(config).to(device=device, dtype=dtype).eval(), vocab


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(rank: int, world: int, length: int, threads: int) -> dict:
    import torch.distributed as dist

    from lwm.infer import Generator

    torch.set_num_threads(threads)
    model, vocab = _model()
    prompt = torch.randint(0, vocab.text_size, (length,), generator=torch.Generator().manual_seed(0))
    gen = Generator(model, vocab, group=dist.group.WORLD if world > 1 else None)
    gen.prefill(prompt[:256])  # warm-up: first-call kernel setup is not part of the measurement
    gen.release()
    before = _peak_mib()
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
    return {"prefill_s": prefill_s, "decode_s": decode_s, "peak_mib": _peak_mib(), "model_mib": before,
            "cache_mib": cache_bytes / 2**20}


def measure_cpu(cp: int, length: int) -> dict:
    from lwm.parallel.launch import run_distributed

    results = run_distributed(_measure, cp, length, 2 // cp, timeout=3600)
    return {
        "prefill_tps": length / max(r["prefill_s"] for r in results),
        "decode_tps": N_DECODE / max(r["decode_s"] for r in results),
        "peak_mib": max(r["peak_mib"] for r in results),
        "added_mib": max(r["peak_mib"] - r["model_mib"] for r in results),
        "cache_mib": max(r["cache_mib"] for r in results),
    }


def longest_gpu_prefill() -> list[tuple[int, float | None]]:
    """(length, seconds or None when out of memory) from 128K doubling, plus an hour of video."""
    from lwm.infer import Generator

    model, vocab = _model("cuda", torch.bfloat16)
    results = []
    for length in (131072, 262144, 524288, 925200, 1048576, 2097152):
        torch.cuda.empty_cache()
        prompt = torch.randint(0, vocab.text_size, (length,), device="cuda")
        gen = Generator(model, vocab, prefill_chunk=16384)
        try:
            torch.cuda.synchronize()
            start = time.perf_counter()
            gen.prefill(prompt)
            torch.cuda.synchronize()
            results.append((length, time.perf_counter() - start, torch.cuda.max_memory_allocated() / 2**30))
        except torch.OutOfMemoryError:
            results.append((length, None, None))
            break
        finally:
            gen.release()
        print(f"GPU prefill {length}: {results[-1][1]:.1f} s, {results[-1][2]:.1f} GiB", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    for length in args.lengths:
        base = None
        for cp in (1, 2):
            r = measure_cpu(cp, length)
            base = base or r
            print(f"{length} tokens, cp={cp}: prefill {r['prefill_tps']:.0f} tok/s, decode {r['decode_tps']:.1f} tok/s, "
                  f"peak {r['peak_mib']:.0f} MiB, cache {r['cache_mib']:.1f} MiB per rank", flush=True)
            rows.append(f"| {length} | {cp} | {r['prefill_tps']:.0f} | {r['prefill_tps'] / base['prefill_tps']:.2f}x | "
                        f"{r['decode_tps']:.1f} | {r['decode_tps'] / base['decode_tps']:.2f}x | {r['peak_mib']:.0f} | "
                        f"{r['peak_mib'] / base['peak_mib']:.2f}x | {r['added_mib']:.0f} | {r['cache_mib']:.1f} |")
    lines = [
        f"Command: `{command_line()}`  ",
        f"Host: {host_line()}  ",
        "`tiny` model (random weights), fp32, batch 1, a random text prompt; prefill = the whole prompt into the KV "
        f"cache (cp=1: chunks of 8192 tokens; cp=2: ring prefill over 2 gloo processes in segments of 8192 tokens per rank), decode = {N_DECODE} "
        "single-token steps after it. cp=1 is one process with 2 threads, cp=2 two processes with 1 thread each "
        "on the same 2 cores. Peak memory = the rank's peak RSS (Python, torch, model, cache, activations); cache = "
        "the rank's K/V; added = peak RSS minus the RSS with the model loaded, before the prompt.",
        "",
        "| prompt tokens | cp | prefill tok/s | vs cp=1 | decode tok/s | vs cp=1 | peak MiB per rank | vs cp=1 | added by inference MiB | cache MiB per rank |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]
    if torch.cuda.is_available():
        lines += ["GPU, one device, bf16, chunked prefill (16384):", "", "| prompt tokens | seconds | peak GiB |",
                  "| ---: | ---: | ---: |"]
        for length, secs, gib in longest_gpu_prefill():
            lines.append(f"| {length} | {'out of memory' if secs is None else f'{secs:.1f}'} | {'' if gib is None else f'{gib:.1f}'} |")
    else:
        lines.append("No GPU in this session: the longest prompt the tiny model can prefill on one GPU (target: an hour "
                     "of video, 925,200 tokens) is not measured.")
    markdown = "\n".join(lines)
    publish("infer", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

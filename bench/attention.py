"""Context-parallel attention: balance, decomposition overhead, and scaling over gloo processes.

    python -m bench.attention                       # all three parts, writes docs/benchmarks.md
    python -m bench.attention --parts balance --no-write

1. balance: per-rank work per ring step under a causal mask, for contiguous / striped / zigzag at
   N = 2, 4, 8: unmasked score entries (exact counts from the block plans) and the measured time of
   each rank's block kernels (forward+backward) at that step; max/mean over ranks, worst step.
2. decomposition: the N-step ring schedule over N virtual ranks in one process (same kernels and
   merges, no communication; lwm.parallel.simulate_ring) vs one fused SDPA call on the whole
   sequence, forward+backward; throughput ratio = fused time / ring time.
3. scaling: real ring attention over N = 1, 2 gloo processes for the same total sequence: time
   per forward+backward and the rise of each rank's peak RSS during it.
4. documents: the ring schedule with document masks (packed documents of 256-4096 tokens) vs the
   same schedule unmasked, forward+backward: the time ratio against allowed / total entries, and
   the score entries the pieces compute against the allowed ones.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.report import command_line, host_line, publish, sync
from lwm.model.documents import Documents
from lwm.parallel import block_backward, block_forward, block_part, block_work, ring_attention, simulate_ring
from lwm.parallel.launch import run_distributed
from lwm.parallel.layout import LAYOUTS
from lwm.parallel.pieces import StepPlanner, piece_work


def timed(fn, repeats: int, reduce=statistics.median, device="cpu") -> float:
    fn()  # warm-up
    sync(device)
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return reduce(times)


# ----------------------------------------------------------------------------------------- 1. balance


def block_step_time(plan, L, heads, dim, repeats):
    if plan is None:
        return 0.0
    q, k, v = (torch.randn(1, heads, L, dim) for _ in range(3))
    qs, ks, vs = q[:, :, plan.q], k[:, :, plan.k], v[:, :, plan.k]

    def run():
        out, lse = block_forward(qs, ks, vs, plan.causal)
        block_backward(torch.ones_like(out), qs, ks, vs, out, lse, plan.causal)

    return timed(run, repeats, reduce=min)  # the least disturbed run


def balance(seq_len, heads, dim, repeats):
    rows = []
    for layout in LAYOUTS:
        for n in (2, 4, 8):
            L = seq_len // n
            cache: dict = {}  # plans repeat across (rank, step): time each distinct one once
            worst_work, worst_time = 1.0, 1.0
            for step in range(n):
                plans = [block_part(layout, r, (r - step) % n, L, True) for r in range(n)]
                work = [block_work(p, L) for p in plans]
                secs = []
                for p in plans:
                    key = repr(p)  # slices are unhashable before Python 3.12
                    if key not in cache:
                        cache[key] = block_step_time(p, L, heads, dim, repeats)
                    secs.append(cache[key])
                worst_work = max(worst_work, max(work) / (sum(work) / n))
                worst_time = max(worst_time, max(secs) / (sum(secs) / n))
            rows.append((layout, n, worst_work, worst_time))
            print(
                f"balance {layout:10s} N={n}  work max/mean {worst_work:.4f}  time max/mean {worst_time:.4f}",
                flush=True,
            )
    lines = [
        f"Causal, S = {seq_len}, {heads} heads, head dim {dim}, fp32; the worst ring step's max/mean over ranks "
        "(1.0 = every rank does the same at every step). Target: striped and zigzag <= 1.02.",
        "",
        "| layout | N | work max/mean | time max/mean |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {l} | {n} | {w:.4f} | {t:.3f} |" for l, n, w, t in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- 2. decomposition


def decomposition(lengths, heads, dim, worlds, repeats, device="cpu", dtype=torch.float32):
    rows = []
    cpu = device == "cpu"
    for S in lengths:
        reps = repeats if S <= 8192 or not cpu else 1  # a 32K fused call takes ~15 s on 2 cores
        q, k, v = (torch.randn(1, heads, S, dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        dout = torch.randn(1, heads, S, dim, device=device, dtype=dtype)
        flops = 4 * heads * dim * S * S / 2 * 3.5  # causal entries once: fwd 2 matmuls, bwd ~2.5x

        def fused():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)

        t_fused = timed(fused, reps, device=device)
        for layout in ("striped", "zigzag"):
            for n in worlds:
                t_ring = timed(lambda: simulate_ring(q, k, v, n, True, layout).backward(dout), reps, device=device)
                rows.append((S, layout, n, t_fused, t_ring, t_fused / t_ring, flops / t_fused, flops / t_ring))
                print(
                    f"decomposition S={S} {layout} N={n}: fused {t_fused:.3f}s ring {t_ring:.3f}s "
                    f"throughput ratio {t_fused / t_ring:.3f}, ring {flops / t_ring / 1e12:.2f} TFLOP/s",
                    flush=True,
                )
        q = k = v = dout = None  # freed before the next length's tensors
    unit, scale = ("GFLOP/s", 1e9) if cpu else ("TFLOP/s", 1e12)
    target = "0.9" if cpu else "0.95"
    lines = [
        f"Causal, {heads} heads, head dim {dim}, {str(dtype).removeprefix('torch.')}, {device}, batch 1, "
        f"forward+backward; median of {repeats} runs{' (1 above 8K)' if cpu else ''} after a warm-up. "
        f"FLOPs count each causal score entry once (forward 2 matmuls, backward 2.5x that). "
        f"Target: ring throughput >= {target} of the fused call.",
        "",
        f"| S | layout | N (virtual) | fused SDPA (s) | ring schedule (s) | throughput ratio | fused {unit} | ring {unit} |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {S} | {lay} | {n} | {tf:.3f} | {tr:.3f} | {r:.3f} | {ff / scale:.1f} | {fr / scale:.1f} |"
        for S, lay, n, tf, tr, r, ff, fr in rows
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- 3. scaling


def _status_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _scaling_worker(rank, world, seq_len, heads, dim, layers, repeats):
    def make(L):
        x = torch.randn(1, heads, L, dim, requires_grad=True)
        dout = torch.randn(1, heads, L, dim)

        def step():
            x.grad = None
            h = x
            for _ in range(layers):  # fresh q, k, v per layer, as projections would make them
                h = ring_attention(h * 1.0, h * 0.5, h * 0.25, layout="striped")
            h.backward(dout)

        return step

    make(64)()  # one tiny step first: thread pools, gloo and autograd start-up are not attention memory
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
    base = _status_kib("VmRSS")
    step = make(seq_len // world)  # the rank's input and output gradient count: they scale with S / N
    step()
    peak_mib = (_status_kib("VmHWM") - base) / 1024
    torch.distributed.barrier()
    t = timed(step, repeats)
    return {"time": t, "peak_mib": peak_mib}


def scaling(seq_len, heads, dim, repeats):
    # Every allocation of 64 KiB or more gets its own mapping, returned to the system when freed, so
    # the peak RSS follows the live tensors instead of what glibc's heap happens to keep.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    rows = []
    for layers in (1, 8):
        for n in (1, 2):
            res = run_distributed(
                _scaling_worker, n, seq_len, heads, dim, layers, repeats, threads=max(1, 2 // n), timeout=3600
            )
            t, mem = max(r["time"] for r in res), max(r["peak_mib"] for r in res)
            rows.append((layers, n, t, mem))
            print(f"scaling layers={layers} N={n}: {t:.2f}s per fwd+bwd, peak per rank {mem:.0f} MiB", flush=True)
    lines = [
        f"Causal ring attention, striped, S = {seq_len} in total, {heads} heads (q = k/v heads), head dim {dim}, fp32; "
        "2 threads at N=1, 1 thread per rank at N=2 (2 cores). Peak = rise of the rank's peak RSS from before its "
        "input is made to the end of one forward+backward (inputs, outputs, gradients, saved tensors and ring buffers "
        "all count). `layers` chains that many attention calls, each with its own q, k, v, so the tensors kept for "
        "backward add up as in a model. Target: per-rank peak falls >= 1.8x from N=1 to N=2.",
        "",
        "| layers | N | time per fwd+bwd (s) | peak per rank (MiB) | peak reduction vs N=1 |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    base = {layers: m for layers, n, _, m in rows if n == 1}
    lines += [f"| {l} | {n} | {t:.2f} | {m:.0f} | {base[l] / m:.2f}x |" for l, n, t, m in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- 4. documents


def document_lengths(seq_len: int, low: int, high: int, seed: int = 0) -> list[int]:
    """Uniform lengths in [low, high] filling seq_len (the last one cut to fit)."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < seq_len:
        lengths.append(min(int(torch.randint(low, high + 1, (1,), generator=g)), seq_len - sum(lengths)))
    return lengths


def computed_entries(segment_ids, n: int, layout: str) -> int:
    """Score entries the pieces of every rank and step compute (documents.piece_work)."""
    L = segment_ids.shape[1] // n
    docs = Documents(segment_ids, L)
    total = 0
    for r in range(n):
        planner = StepPlanner(layout, r, n, L, True, docs)
        total += sum(piece_work(planner(step), 1, L) for step in range(n))
    return total


def documents(lengths, heads, dim, worlds, repeats, low, high):
    rows = []
    for S in lengths:
        reps = repeats if S <= 8192 else 1
        docs = document_lengths(S, low, high)
        seg = torch.repeat_interleave(torch.arange(1, len(docs) + 1, dtype=torch.int32), torch.tensor(docs))[
            None
        ]  # (1, S)
        allowed = sum(l * (l + 1) // 2 for l in docs)  # causal pairs inside documents, counted from the lengths
        total = S * (S + 1) // 2
        q, k, v = (torch.randn(1, heads, S, dim, requires_grad=True) for _ in range(3))
        dout = torch.randn(1, heads, S, dim)
        for layout in ("striped", "zigzag"):
            for n in worlds:
                # the least disturbed of the runs: a ratio of two timings on a shared 2-core machine
                t_plain = timed(lambda: simulate_ring(q, k, v, n, True, layout).backward(dout), reps, reduce=min)
                t_masked = timed(
                    lambda: simulate_ring(q, k, v, n, True, layout, segment_ids=seg).backward(dout), reps, reduce=min
                )
                work = computed_entries(seg, n, layout) / allowed
                share = allowed / total
                rows.append((S, len(docs), layout, n, share, work, t_plain, t_masked))
                print(
                    f"documents S={S} ({len(docs)} docs) {layout} N={n}: allowed/total {share:.3f}, computed/allowed "
                    f"{work:.3f}, unmasked {t_plain:.2f}s masked {t_masked:.2f}s, time ratio {t_masked / t_plain:.3f} "
                    f"(limit {1.5 * share:.3f})",
                    flush=True,
                )
    lines = [
        f"Causal ring schedule over N virtual ranks (lwm.parallel.simulate_ring), {heads} heads, head dim {dim}, fp32, "
        f"batch 1, forward+backward; packed documents of {low}-{high} tokens (uniform, seed 0; the last one cut to fit). "
        f"Fastest of {repeats} runs (1 above 8K) after a warm-up. Computed = score entries of the pieces the planner "
        "gives every rank and step (a causal square counts its lower triangle); allowed = sum of l(l+1)/2 over the "
        "documents. Targets: computed/allowed <= 1.3, masked time <= 1.5 x (allowed/total) x unmasked time.",
        "",
        "| S | documents | layout | N | allowed/total | computed/allowed | unmasked (s) | masked (s) | time ratio "
        "| limit 1.5 x allowed/total |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {S} | {d} | {lay} | {n} | {sh:.3f} | {w:.3f} | {tp:.2f} | {tm:.2f} | {tm / tp:.3f} | {1.5 * sh:.3f} |"
        for S, d, lay, n, sh, w, tp, tm in rows
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["balance", "decomposition", "scaling", "documents"])
    parser.add_argument("--balance-seq", type=int, default=8192)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--scaling-seq", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--doc-range", type=int, nargs=2, default=[256, 4096], metavar=("LOW", "HIGH"))
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (decomposition only; the other parts are CPU studies)"
    )
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="decomposition only")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.device != "cpu" and set(args.parts) != {"decomposition"}:
        parser.error(f"--device {args.device}: only the decomposition part runs on a GPU; pass --parts decomposition")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    parts = {
        "balance": ("Balance", lambda: balance(args.balance_seq, args.heads, args.dim, args.repeats)),
        "decomposition": (
            "Decomposition overhead",
            lambda: decomposition(args.lengths, args.heads, args.dim, (2, 4, 8), args.repeats, args.device, dtype),
        ),
        "scaling": (
            "Scaling over gloo processes",
            lambda: scaling(args.scaling_seq, args.heads, args.dim, args.repeats),
        ),
        "documents": (
            "Document masks",
            lambda: documents(args.lengths, args.heads, args.dim, (2, 4, 8), args.repeats, *args.doc_range),
        ),
    }
    for name in args.parts:
        title, run = parts[name]
        markdown = f"### {title}\n\nCommand: `{command_line()}`  \nHost: {host_line()}\n\n{run()}"
        # each part its own section: parts can be rerun alone
        suffix = "" if args.device == "cpu" else f"-{args.device}"  # a GPU run has its own section
        publish(f"attention-{name}{suffix}", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

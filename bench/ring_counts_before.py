"""The "before" counts of docs/benchmarks.md's "The ring on a GPU, counted without one": rank 0's ring
step loops as they were at commit 156bd47 (documents read from the segment ids in every ring step,
one flash call per piece, K/V expanded for every piece), counted as bench.ring_gpu_counts counts
them now. It runs only in a checkout of that commit, whose API it uses:

    git worktree add /tmp/before 156bd47
    cp bench/ring_counts_before.py /tmp/before/bench/
    cd /tmp/before && python -m bench.ring_counts_before --lengths 131072 1048576

Rank 0 of cp 8, striped, causal; real bf16 tensors (4 q heads, 1 kv head, head dim 8) through the
CUDA flash kernel's CPU stand-ins of that commit (tests/cuda_standins.py); one sequence packed from
documents of 256-4096 tokens (bench.attention.document_lengths, seed 0). The key segment ids travel
the ring with their K/V, as that commit's ring sent them. Per step = over the 8 steps; host syncs and
K/V copy bytes are per layer call (rank 0's forward and backward).
"""

# ruff: noqa: I001  (the imports are commit 156bd47's modules, some of which no longer exist here)
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.attention import document_lengths
from lwm.parallel.documents import StepPlanner
from lwm.parallel.layout import shard
from lwm.parallel.ring import ring_backward, ring_forward
from lwm.plan.fake import OpCounter

N = 8


class KVCopies(TorchDispatchMode):
    """Bytes of grouped-head expansions: a clone of an expanded (stride 0) view, as repeat_interleave makes."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "clone" and 0 in args[0].stride():
            self.bytes += out.numel() * out.element_size()
        return out


def rank0_counts(S: int, ids: torch.Tensor) -> dict:
    """Rank 0's ring_forward + ring_backward at that commit; ids (1, S) the whole sequence's documents."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from cuda_standins import installed

    L = S // N
    q, dout = (torch.randn(1, 4, L, 8, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 1, L, 8, dtype=torch.bfloat16) for _ in range(2))
    local = [shard(ids, 1, r, N, "striped") for r in range(N)]  # (1, L) per rank
    with installed(), OpCounter() as counter, KVCopies() as copies:
        planner = StepPlanner("striped", 0, N, L, True, local[0])  # made in every layer call: it reads ids
        out, lse, pieces = ring_forward(q, ((k, v, local[-step % N]) for step in range(N)), planner, None, "cuda_flash")
        for _ in ring_backward(dout, q, out, lse, ((k, v) for _ in range(N)), pieces, None, "cuda_flash"):
            pass
    attn = counter.attention()
    fwd = sum(n for name, n in attn.items() if "backward" not in name)
    return {
        "forward calls / step": fwd / N,
        "backward calls / step": (sum(attn.values()) - fwd) / N,
        "aten calls / step": sum(counter.ops.values()) / N,
        "host syncs": dict(Counter(what for what, _ in counter.synced)),
        "kv copy bytes": copies.bytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--lengths", type=int, nargs="+", default=[131072, 1048576], help="total tokens S")
    args = parser.parse_args(argv)
    for S in args.lengths:
        docs = document_lengths(S, 256, 4096)
        ids = torch.repeat_interleave(torch.arange(1, len(docs) + 1, dtype=torch.int32), torch.tensor(docs))[None]
        print(S, f"{len(docs)} documents", rank0_counts(S, ids), flush=True)


if __name__ == "__main__":
    main()

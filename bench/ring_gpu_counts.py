"""The masked ring's GPU path, counted without a GPU: kernel calls and aten calls per ring step,
host syncs, bytes of K/V copies for grouped heads, and aten calls per training step.

    python -m bench.ring_gpu_counts                  # writes docs/benchmarks.md
    python -m bench.ring_gpu_counts --no-write --lengths 131072

Ring: the 7b attention shapes (32 q heads, 32 or 8 k/v heads, head dim 128, bf16, backend
cuda_flash), S tokens over cp = 8 ranks (striped), one sequence packed from documents of
LOW-HIGH tokens (bench.attention.document_lengths). `lwm.parallel.simulate_ring` runs all 8
ranks' forward+backward under FakeTensorMode (shapes only: the aten ops' meta kernels), its ops
counted by lwm.plan.fake's OpCounter; per step = over the 8 x 8 rank-steps. A host sync
under fake tensors cannot happen unseen: a read of a value raises. Rank 0's step loops alone
(ring_forward / ring_backward) also run on real CPU tensors (4 q heads, 1 kv head, head dim 8,
bf16) through the CUDA kernels' CPU stand-ins (tests/cuda_standins.py): the counts code that reads
document runs from device values can be measured with (the code before the varlen path).

Training step: lwm.plan.fake_step's 7b step at S tokens, cp 8, dp 4, with and without masks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from bench.attention import document_lengths
from bench.report import command_line, host_line, publish
from lwm.model.documents import Documents
from lwm.parallel import simulate_ring
from lwm.parallel.pieces import step_planner
from lwm.parallel.ring import new_dq, ring_backward, ring_forward
from lwm.parallel.ring_steps import ring_steps
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


def _documents(S: int, low: int, high: int) -> torch.Tensor:
    docs = document_lengths(S, low, high)
    return torch.repeat_interleave(torch.arange(1, len(docs) + 1, dtype=torch.int32), torch.tensor(docs))[None]


def ring_counts(S: int, hkv: int, seg) -> dict:
    """Rank-step averages of simulate_ring forward+backward (cp 8, striped, causal), 7b shapes, fake."""
    with FakeTensorMode():
        q, k, v = (torch.empty(1, h, S, 128, dtype=torch.bfloat16).requires_grad_() for h in (32, hkv, hkv))
        with OpCounter() as counter, KVCopies() as copies:
            out = simulate_ring(q, k, v, N, True, "striped", segment_ids=seg, backend="cuda_flash")
            out.backward(torch.empty_like(out))
    return _per_step(counter, copies, N * N)


def _per_step(counter: OpCounter, copies: KVCopies, steps: int) -> dict:
    attn = counter.attention()
    fwd = sum(n for name, n in attn.items() if "backward" not in name)
    return {
        "forward calls": fwd / steps,
        "backward calls": (sum(attn.values()) - fwd) / steps,
        "aten calls": sum(counter.ops.values()) / steps,
        "syncs": sum(counter.syncs().values()),
        "kv copy bytes": copies.bytes,
    }


def rank0_counts(S: int, ids: torch.Tensor) -> dict:
    """Rank 0's ring_forward + ring_backward, real small bf16 tensors through the CPU stand-ins."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from cuda_standins import installed

    L = S // N
    q, dout = (torch.randn(1, 4, L, 8, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 1, L, 8, dtype=torch.bfloat16) for _ in range(2))
    steps = ring_steps(step_planner("striped", 0, N, L, True, Documents(ids, L)), q, "cuda_flash")
    with installed(), OpCounter() as counter, KVCopies() as copies:
        out, lse = ring_forward(q, ((k, v) for _ in range(N)), steps, None)
        for _ in ring_backward(dout, q, out, lse, ((k, v) for _ in range(N)), steps, None, new_dq(q)):
            pass
    return _per_step(counter, copies, N)


def step_counts(S: int, documents: int) -> tuple[int, int]:
    """(aten calls, host syncs) of lwm.plan.fake_step's training step, 7b, cp 8, dp 4."""
    from lwm.plan.fake_step import FakeStepConfig, run

    report = run(FakeStepConfig(preset="7b", seq_len=S, cp=N, dp=4, prefill_chunk=S // N, documents=documents))
    return sum(report.step.counter.ops.values()), sum(report.step.device_syncs().values())


def length_counts(S: int, low: int, high: int) -> tuple[list, tuple]:
    """At S tokens, documents of low-high tokens: the fake ring's rows (S, kv heads, documents, counts)
    for 32 and 8 kv heads, without and with documents, and rank 0's loops' row (S, documents, counts)."""
    ids = _documents(S, low, high)
    described = f"{ids.max()} of {low}-{high}"
    rows = []
    for hkv in (32, 8):
        for name, seg in (("none", None), (described, Documents(ids, S // N))):
            rows.append((S, hkv, name, ring_counts(S, hkv, seg)))
            print(*rows[-1], flush=True)
    small = (S, described, rank0_counts(S, ids))
    print(*small, flush=True)
    return rows, small


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[131072, 1048576], help="total tokens S (multiples of 8)"
    )
    parser.add_argument(
        "--doc-range",
        type=int,
        nargs=2,
        default=[256, 4096],
        metavar=("LOW", "HIGH"),
        help="document lengths, uniform in [LOW, HIGH]",
    )
    parser.add_argument("--no-step", action="store_true", help="skip the training-step totals")
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks.md alone")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    low, high = args.doc_range
    rows, small = [], []
    for S in args.lengths:
        ring_rows, rank0_row = length_counts(S, low, high)
        rows += ring_rows
        small.append(rank0_row)
    head = "| attention calls / step fwd | bwd | aten calls / step | host syncs | K/V copy bytes |"
    cells = lambda c: (  # noqa: E731
        f"| {c['forward calls']:.2f} | {c['backward calls']:.2f} | {c['aten calls']:.1f} | {c['syncs']} "
        f"| {c['kv copy bytes']:,} |"
    )
    lines = [
        f"Ring forward+backward, cp {N} striped, causal, bf16, cuda_flash, 7b shapes (32 q heads, head dim 128) "
        f"under fake tensors; per rank-step averages over the {N * N} rank-steps (sharding the inputs over the "
        "virtual ranks included).",
        "",
        "| S | kv heads | documents " + head,
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {S} | {h} | {n} " + cells(c) for S, h, n, c in rows),
        "",
        "Rank 0's step loops alone, real tensors (4 q heads, 1 kv head, head dim 8) through the CPU stand-ins:",
        "",
        "| S | documents " + head,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {S} | {n} " + cells(c) for S, n, c in small),
    ]
    if not args.no_step:
        lines += [
            "",
            "| training step (7b, cp 8, dp 4) | S | aten calls | host syncs |",
            "| --- | ---: | ---: | ---: |",
        ]
        for S in args.lengths:
            for documents in (1, S // 4096):
                calls, syncs = step_counts(S, documents)
                lines.append(
                    f"| {'no masks' if documents == 1 else f'{documents} documents'} | {S} | {calls} | {syncs} |"
                )
    markdown = f"### Ring GPU path, counted\n\nCommand: `{command_line()}`  \nHost: {host_line()}\n\n" + "\n".join(
        lines
    )
    publish("ring-gpu-counts", markdown, write=not args.no_write)


if __name__ == "__main__":
    main()

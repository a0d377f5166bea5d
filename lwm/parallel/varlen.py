"""One variable-length flash call per ring step, whatever the number of documents.

FlashAttention-2's varlen kernel (aten._flash_attention_forward / _backward with cumulative
sequence lengths) computes many (query rows, key rows) pairs in one launch: q (total_q, Hq, D),
k/v (total_k, Hkv, D) (grouped heads native), pair i the rows cum_q[i]:cum_q[i+1] against the keys
cum_k[i]:cum_k[i+1]; causal is aligned bottom-right in each pair (query r of nq sees key c of nk
when c <= r + nk - nq); a row with no key gets output 0 and logsumexp +inf.

A step's pairs tile the local query block and the visiting key block in order (a layout keeps
token order, so documents come in the same order in both). Per document: its query run against
its key run, and under a causal plan (key j visible from query i when j <= i + d) the key run cut
at the last query's diagonal, so the bottom-right triangle is the plan's; query rows and keys no
document pairs go in pairs with no keys, or no queries. The packed tensors are then the blocks
themselves, (B, H, L, D) -> (B*L, H, D) (a view for B = 1), and the step's output and logsumexp
come back for the whole block: the (out, lse) merge is one per step.

Not every step fits: ids repeated in two runs, or a causal plan whose key run ends before a
query's diagonal (no layout of lwm.parallel.layout gives one). Those steps return None and the
caller computes the step's pieces one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lwm.model.documents import BatchRuns, Run
from lwm.parallel.blocks import BlockPart
from lwm.parallel.pieces import StepPlanner, kept, pair_groups


@dataclass(frozen=True)
class VarlenStep:
    offset: int  # where the step's cumulative lengths start in the rank's table (q, then k)
    pairs: int
    max_q: int
    max_k: int
    causal: bool
    covers: bool  # every query row sees a key (its logsumexp may start the accumulators)


def _row_pairs(plan: BlockPart, L: int, q_runs: list[Run], k_runs: list[Run]) -> list[tuple[int, int]] | None:
    """(query rows, keys) of each pair of one batch row, tiling [0, L) on both sides; None if the
    step does not fit one call."""
    qs, qe, _ = plan.q.indices(L)
    ks, ke, _ = plan.k.indices(L)
    d = ks - qs
    keys = {i: (max(b0, ks), min(b1, ke)) for b0, b1, i in k_runs if min(b1, ke) > max(b0, ks)}
    pairs, q_at, k_at = [], 0, 0
    for a0, a1, i in q_runs:
        a0, a1 = max(a0, qs), min(a1, qe)
        if a1 <= a0 or i not in keys:
            continue
        b0, b1 = keys[i]
        if plan.causal:
            if a1 + d > b1:  # rows below the key run's end see all of it: not one triangle
                return None
            b1 = a1 + d  # keys past the last row's diagonal are seen by none of these rows
            if b1 <= b0:
                continue
        pairs += [(a0 - q_at, 0), (0, b0 - k_at), (a1 - a0, b1 - b0)]
        q_at, k_at = a1, b1
    pairs += [(L - q_at, 0), (0, L - k_at)]
    return [p for p in pairs if p != (0, 0)]


def _covers(pairs: list[tuple[int, int]], plan: BlockPart, L: int) -> bool:
    """Whether every query row sees a key (a causal pair's first row sees its first key)."""
    return all(nk > 0 and (not plan.causal or nk >= nq) for nq, nk in pairs if nq > 0)


def plan_varlen(planner: StepPlanner, step: int, table: list[int]) -> VarlenStep | None:
    """The step's pairs, their cumulative lengths appended to `table`; None if the step does not fit."""
    plan = planner.plan(step)
    docs = planner.documents
    if plan is None or docs is None or not docs.unique:
        return None
    L, B = planner.local_len, docs.batch
    k_runs: BatchRuns = planner.runs((planner.rank - step) % planner.world_size)
    pairs = []
    for rows, qr, kr in pair_groups(planner.q_runs, k_runs, B):
        row = _row_pairs(plan, L, qr, kr)
        if row is None:
            return None
        pairs += row * len(range(*rows.indices(B)))  # the rows one after another: (B*L) packed tokens
    offset = len(table)
    for side in (0, 1):
        table.append(0)
        for p in pairs:
            table.append(table[-1] + p[side])
    return VarlenStep(
        offset, len(pairs), max(p[0] for p in pairs), max(p[1] for p in pairs), plan.causal, _covers(pairs, plan, L)
    )


class VarlenPlan:
    """Every step's varlen call of one rank, and their cumulative lengths on the device: one
    host-to-device copy per batch and device, never a read back. pinned (a CUDA run's): the table is
    made in page-locked memory and copied without blocking, so the host does not wait for the GPU's
    queue to drain at the first attention of each batch (a pageable copy does); the plan holds the
    pinned table for as long as its copy may run."""

    def __init__(self, planner: StepPlanner, pinned: bool = False):
        table: list[int] = []
        self.steps = [plan_varlen(planner, s, table) for s in range(planner.world_size)]
        self.table = torch.tensor(table, dtype=torch.int32)  # (sum of 2 (pairs + 1),) host
        self.pinned = pinned
        if pinned:
            self.table = self.table.pin_memory()
        self._on: dict = {}

    def lengths(self, step: VarlenStep, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cum_q, cum_k) int32 (pairs + 1,) on `device`, views of one copy of the table."""
        key = str(device)
        if key not in self._on:
            self._on[key] = self.table.to(device, non_blocking=self.pinned)
        t, n = self._on[key], step.pairs + 1
        return t[step.offset : step.offset + n], t[step.offset + n : step.offset + 2 * n]


def varlen_plan(planner: StepPlanner, pinned: bool = False) -> VarlenPlan:
    """The planner's varlen plan, made once per batch (kept with its documents)."""
    p = planner
    key = ("varlen", p.layout, p.rank, p.world_size, p.local_len, p.causal, pinned)
    return kept(p.documents, key, lambda: VarlenPlan(p, pinned))


# ----------------------------------------------------------------------------------------- calls


def pack(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) -> (B*L, H, D) tokens first, as the varlen kernel reads them (a view for B = 1)."""
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B * L, H, D)


def varlen_forward(q, k, v, step: VarlenStep, lengths, scale: float):
    """q (B, Hq, L, D), k/v (B, Hkv, L, D) -> out (B, Hq, L, D), lse (B, Hq, L) fp32 with -inf
    where a row saw no key."""
    B, H, L, D = q.shape
    out, lse = torch.ops.aten._flash_attention_forward(
        pack(q), pack(k), pack(v), *lengths, step.max_q, step.max_k, 0.0, step.causal, False, scale=scale
    )[:2]
    lse = lse.view(H, B, L).transpose(0, 1)  # (H, B*L) -> (B, H, L)
    if not step.covers:  # the kernel marks rows without keys +inf; merged they must weigh nothing
        lse = lse.masked_fill(lse == float("inf"), float("-inf"))
    return out.view(B, L, H, D).transpose(1, 2), lse  # (B*L, H, D) -> (B, H, L, D)


def varlen_backward(dout, q, k, v, out, lse, step: VarlenStep, lengths, scale: float):
    """Gradients of the step's share: dq (B, Hq, L, D), dk, dv (B, Hkv, L, D). `lse` is the final
    (merged) logsumexp as the kernel reads it: dense (Hq, B*L) (`packed_lse`)."""
    B, H, L, D = q.shape
    seed = torch.zeros(2, dtype=torch.uint64, device=q.device)  # no dropout: the RNG state is never read
    offset = torch.zeros((), dtype=torch.uint64, device=q.device)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        pack(dout), pack(q), pack(k), pack(v), pack(out), lse, *lengths, step.max_q, step.max_k, 0.0, step.causal,
        seed, offset, scale=scale,
    )  # fmt: skip
    unpack = lambda g: g.view(B, L, g.shape[1], D).transpose(1, 2)  # noqa: E731  (B*L, H, D) -> (B, H, L, D)
    return unpack(dq), unpack(dk), unpack(dv)


def packed_lse(lse: torch.Tensor) -> torch.Tensor:
    """(B, H, L) -> dense (H, B*L) fp32, the layout the varlen backward reads from its pointer."""
    B, H, L = lse.shape
    return lse.float().transpose(0, 1).reshape(H, B * L).contiguous()

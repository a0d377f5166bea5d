"""How a sequence is split over the ranks of a context-parallel group.

Layouts over N ranks (S tokens, L = S / N per rank):
    contiguous  rank r holds tokens [r L, (r+1) L)
    striped     rank r holds tokens r, r + N, r + 2N, ...   (the default: balanced under a causal mask)
    zigzag      2N chunks of L/2; rank r holds chunks r and 2N-1-r

Every rank's tokens are in increasing global order, so a causal mask within one rank's slice is
the plain lower triangle. For the hybrid (Ulysses inside groups of `ulysses_size` ranks, ring
across them) the sequence is first split over the ring by the layout, then each ring piece is
cut contiguously over its Ulysses group; global rank = ring_rank * ulysses_size + ulysses_rank.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "striped", "zigzag")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def ring_parts(ring: int, layout: str) -> int:
    """How many equal parts a layout cuts a sequence into over `ring` ranks: 2N chunks for zigzag, else N."""
    return 2 * ring if layout == "zigzag" else ring


def check_divisible(seq_len: int, world_size: int, layout: str, ulysses_size: int = 1) -> None:
    """Raise a ValueError naming the values when seq_len cannot be split this way."""
    check_layout(layout)
    if world_size < 1 or ulysses_size < 1 or world_size % ulysses_size:
        raise ValueError(f"world_size {world_size} must be a positive multiple of ulysses_size {ulysses_size}")
    ring = world_size // ulysses_size
    parts = ring_parts(ring, layout)
    if seq_len % parts:
        what = f"2 * ring size = {parts}" if layout == "zigzag" else f"ring size {parts}"
        raise ValueError(f"seq_len {seq_len} is not divisible by {what} ({layout})")
    if (seq_len // ring) % ulysses_size:
        raise ValueError(f"ring piece of {seq_len // ring} tokens is not divisible by ulysses_size {ulysses_size}")


def _ring_positions(seq_len: int, rank: int, ring: int, layout: str, device) -> torch.Tensor:
    if layout == "contiguous":
        n = seq_len // ring
        return torch.arange(rank * n, (rank + 1) * n, device=device)
    if layout == "striped":
        return torch.arange(rank, seq_len, ring, device=device)
    c = seq_len // (2 * ring)  # zigzag chunk
    return torch.cat(
        [
            torch.arange(rank * c, (rank + 1) * c, device=device),
            torch.arange((2 * ring - 1 - rank) * c, (2 * ring - rank) * c, device=device),
        ]
    )


def positions(
    seq_len: int, rank: int, world_size: int, layout: str = "striped", ulysses_size: int = 1, device=None
) -> torch.Tensor:
    """Global positions (LongTensor, increasing) of the tokens `rank` holds, made on `device` (host by default):
    made where they are used, never copied there (a host-to-device copy waits for the GPU)."""
    check_divisible(seq_len, world_size, layout, ulysses_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    ring_rank, u = divmod(rank, ulysses_size)
    pos = _ring_positions(seq_len, ring_rank, world_size // ulysses_size, layout, device)
    n = pos.numel() // ulysses_size
    return pos[u * n : (u + 1) * n]


def gathered_positions(seq_len: int, world_size: int, layout: str, ulysses_size: int, device=None) -> torch.Tensor:
    """Global positions of all ranks' tokens, concatenated in rank order, made on `device`."""
    return torch.cat([positions(seq_len, r, world_size, layout, ulysses_size, device) for r in range(world_size)])


def shard(
    x: torch.Tensor, dim: int, rank: int, world_size: int, layout: str = "striped", ulysses_size: int = 1
) -> torch.Tensor:
    """The slice of the full tensor x (sequence along `dim`) that `rank` holds."""
    idx = positions(x.shape[dim], rank, world_size, layout, ulysses_size, x.device)
    return x.index_select(dim, idx)


def unshard(
    pieces: list[torch.Tensor] | tuple[torch.Tensor, ...], dim: int, layout: str = "striped", ulysses_size: int = 1
) -> torch.Tensor:
    """The full tensor from every rank's slice (in rank order); differentiable."""
    world_size = len(pieces)
    sizes = {p.shape[dim] for p in pieces}
    if len(sizes) != 1:
        raise ValueError(f"pieces must have equal length along dim {dim}, got {[p.shape[dim] for p in pieces]}")
    joined = torch.cat(list(pieces), dim=dim)  # (..., N * L, ...) in rank order
    perm = gathered_positions(joined.shape[dim], world_size, layout, ulysses_size, joined.device)
    return joined.index_select(dim, torch.argsort(perm))

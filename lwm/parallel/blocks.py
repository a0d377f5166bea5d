"""Which part of a (query block, key block) pair a ring step computes, per layout.

At ring step s, rank r holds the keys of rank src = (r - s) mod N. Under a causal mask the
layout decides which rows attend to which keys; every part here is a (query rows, key rows)
rectangle that is either fully visible or plain-causal (lower triangle, diagonal included,
equal lengths), so one kernel call serves it:

    contiguous  src < r: all x all    src == r: causal    src > r: nothing (skipped)
    striped     src <= r: causal      src > r: rows 1: x keys :-1, causal (diagonal excluded)
    zigzag      src == r: causal      src < r: all rows x first half of keys
                                      src > r: second half of rows x all keys

With striped and zigzag every rank does the same work at every step (balance).
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = slice(None)


@dataclass(frozen=True)
class BlockPart:
    q: slice  # query rows of the local block
    k: slice  # key rows of the visiting block
    causal: bool


def block_part(layout: str, rank: int, src: int, local_len: int, causal: bool) -> BlockPart | None:
    if not causal:
        return BlockPart(ALL, ALL, False)
    if src == rank:
        return BlockPart(ALL, ALL, True)
    if layout == "contiguous":
        return BlockPart(ALL, ALL, False) if src < rank else None
    if layout == "striped":
        if src < rank:
            return BlockPart(ALL, ALL, True)
        if local_len == 1:
            return None
        return BlockPart(slice(1, None), slice(0, local_len - 1), True)
    if layout == "zigzag":
        half = local_len // 2
        if src < rank:
            return BlockPart(ALL, slice(0, half), False)
        return BlockPart(slice(half, None), ALL, False)
    raise ValueError(f"unknown layout {layout!r}")


def _length(s: slice, n: int) -> int:
    return len(range(*s.indices(n)))


def block_work(part: BlockPart | None, local_len: int) -> int:
    """Attention score entries the part computes (unmasked ones)."""
    if part is None:
        return 0
    nq, nk = _length(part.q, local_len), _length(part.k, local_len)
    return nq * (nq + 1) // 2 if part.causal else nq * nk

"""Packing encoded examples into fixed-length sequences (LWM's masked sequence packing).

A packed sequence holds `length` tokens (the stage's sequence length + 1, so that inputs and
next-token targets are each `seq_len` long). Examples are placed whole, in order; one that does
not fit in what is left starts a new sequence and the rest is padding. Segment ids number the
examples of a sequence from 1 (0 = padding). An example's first token is never a target (nothing
of its example precedes it), so predicting it from the end of the example before is not trained.
With loss weighting "example", every token's weight is 1 / (the example's loss tokens of its kind,
text or vision), so a packed batch weighs each example as unpacked training would, not by its
length.

Examples longer than `length`: "truncate" keeps the first `length` tokens, "drop" skips them,
"window" cuts them into consecutive windows of `length` (long text documents, books). All counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from lwm.data.example import Encoded

OVERFLOW = ("truncate", "drop", "window")
WEIGHTING = ("example", "token")


@dataclass
class Packed:
    tokens: np.ndarray  # (length,) int64
    loss_weight: np.ndarray  # (length,) float32, 0 where predicting the token is not trained
    vision_mask: np.ndarray  # (length,) bool
    segment_ids: np.ndarray  # (length,) int32, examples numbered from 1, 0 = padding


def example_weights(enc: Encoded, weighting: str) -> np.ndarray:
    w = enc.loss_mask.astype(np.float32)
    w[:1] = 0  # the first token has no input of its own example
    if weighting == "example":
        for kind in (enc.vision_mask, ~enc.vision_mask):
            n = w[kind].sum()
            if n > 0:
                w[kind] /= n
    return w


def pieces(n: int, length: int, overflow: str) -> tuple[list[tuple[int, int]], str]:
    """An example of n tokens as the (start, size) pieces packed from it into sequences of `length`
    tokens, and what its overflow policy did ("truncated", "windowed", "dropped_too_long", or "")."""
    if n <= length:
        return [(0, n)], ""
    if overflow == "drop":
        return [], "dropped_too_long"
    if overflow == "truncate":
        return [(0, length)], "truncated"
    return [(s, min(length, n - s)) for s in range(0, n, length)], "windowed"


def assemble(parts: list[tuple[Encoded, np.ndarray]], length: int, pad_id: int) -> Packed:
    """One packed sequence of `length` tokens from (piece, its loss weights) parts, in order, then padding."""
    tokens = np.full(length, pad_id, dtype=np.int64)
    weight = np.zeros(length, dtype=np.float32)
    vision = np.zeros(length, dtype=bool)
    segments = np.zeros(length, dtype=np.int32)
    pos = 0
    for seg, (enc, w) in enumerate(parts, start=1):
        end = pos + len(enc)
        tokens[pos:end], weight[pos:end], vision[pos:end], segments[pos:end] = enc.tokens, w, enc.vision_mask, seg
        pos = end
    return Packed(tokens, weight, vision, segments)


class Packer:
    def __init__(self, seq_len: int, overflow: str = "truncate", weighting: str = "example", pad_id: int = 0):
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow must be one of {OVERFLOW}, got {overflow!r}")
        if weighting not in WEIGHTING:
            raise ValueError(f"loss weighting must be one of {WEIGHTING}, got {weighting!r}")
        self.length, self.overflow, self.weighting, self.pad_id = seq_len + 1, overflow, weighting, pad_id
        self.stats: Counter = Counter()
        self._parts: list[tuple[Encoded, np.ndarray]] = []
        self._used = 0

    def _pieces(self, enc: Encoded) -> list[Encoded]:
        cut, kind = pieces(len(enc), self.length, self.overflow)
        if kind:
            self.stats[kind] += 1
        return [enc.slice(start, start + size) for start, size in cut]

    def _emit(self) -> Packed:
        packed = assemble(self._parts, self.length, self.pad_id)
        self.stats["sequences"] += 1
        self.stats["padding_tokens"] += self.length - self._used
        self._parts, self._used = [], 0
        return packed

    def add(self, enc: Encoded) -> Iterator[Packed]:
        """Add one example; yields the sequences it completes."""
        self.stats["examples"] += 1
        for piece in self._pieces(enc):
            if self._used + len(piece) > self.length:
                yield self._emit()
            self._parts.append((piece, example_weights(piece, self.weighting)))
            self._used += len(piece)
            if self._used == self.length:
                yield self._emit()

    def flush(self) -> Iterator[Packed]:
        if self._parts:
            yield self._emit()

    def pack(self, examples: Iterable[Encoded]) -> Iterator[Packed]:
        for enc in examples:
            yield from self.add(enc)
        yield from self.flush()

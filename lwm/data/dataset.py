"""A deterministic, resumable stream of packed sequences from JSON-lines sources.

Each epoch shuffles all examples of all sources with a seed derived from (seed, epoch), encodes
them, and packs them. Global batch g is made of sequences [g*B*D, (g+1)*B*D) of that stream
(B sequences per data-parallel rank, D ranks); data-parallel rank r takes its B of them, so ranks
read different samples, and every rank of a context-parallel group (same r) reads the same ones.
The state is (epoch, global batches done): resuming re-packs the epoch and skips what was done.
Bad examples are skipped with a warning naming file and line, and counted; `strict` raises.
With `holdout` H, the last H examples of every source are never trained on: they are packed once,
in file order, for the validation loss (`validation_batches`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from lwm.data.codes import CodeStore
from lwm.data.example import ExampleError, encode_example
from lwm.data.packing import Packed, Packer
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.io import JsonlError, LineIndex, read_lines

log = logging.getLogger(__name__)


@dataclass
class Source:
    path: str
    fields: str | list | None = None  # default spec for examples without their own "fields"
    overflow: str = "truncate"  # examples longer than the sequence: truncate | drop | window
    repeat: int = 1  # times each example appears per epoch (mixing weights)


@dataclass
class StreamState:
    epoch: int = 0
    batches: int = 0  # global batches done in this epoch

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches}


class PackedStream:
    def __init__(
        self,
        sources: list[Source],
        vocab: Vocab,
        text_tokenizer: TextTokenizer,
        seq_len: int,
        batch_size: int,
        codes: CodeStore | None = None,
        seed: int = 0,
        dp_rank: int = 0,
        dp_size: int = 1,
        max_frames: int | None = None,
        fps: float | None = None,
        weighting: str = "example",
        strict: bool = False,
        holdout: int = 0,
    ):
        vocab.check_tokenizer(text_tokenizer)
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is outside [0, dp_size {dp_size})")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.sources, self.vocab, self.text_tokenizer, self.codes = sources, vocab, text_tokenizer, codes
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.max_frames, self.fps, self.weighting, self.strict = max_frames, fps, weighting, strict
        if holdout < 0:
            raise ValueError(f"data.holdout must be >= 0, got {holdout}")
        self.lines, self.heldout = [], []
        for source in sources:
            lines = self._read(source)
            if holdout and len(lines) <= holdout:
                raise ValueError(
                    f"data source {source.path} has {len(lines)} examples: data.holdout {holdout} leaves none to train on"
                )
            self.lines.append(lines[: len(lines) - holdout])
            self.heldout.append(lines[len(lines) - holdout :])
        self.stats: Counter = Counter()
        self.errors: list[str] = []

    @staticmethod
    def _read(source: Source) -> LineIndex:
        path = Path(source.path)
        if not path.is_file():
            raise FileNotFoundError(f"data source {path} does not exist")
        return read_lines(path)  # byte offsets: parsed when an epoch reaches them; a partial last line is dropped

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, line index) of every example of one epoch, shuffled by (seed, epoch): two arrays, not
        a Python object per example."""
        src, idx = _items(self.lines, [source.repeat for source in self.sources])
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(src))
        return src[perm], idx[perm]

    def _encoded(self, order: tuple[np.ndarray, np.ndarray], lines: list[LineIndex]) -> Iterator[tuple]:
        for s, i in zip(*(a.tolist() for a in order)):
            line = lines[s][i]
            where = f"{self.sources[s].path}:{line.number}"
            try:
                example = line.parse()
                enc = encode_example(
                    example,
                    self.vocab,
                    self.text_tokenizer,
                    self.codes,
                    self.sources[s].fields,
                    self.max_frames,
                    self.fps,
                    self.seed,
                    key=where,
                )
            except (ExampleError, JsonlError) as e:
                why = e.reason if isinstance(e, JsonlError) else e  # a JsonlError names the place itself
                if self.strict:
                    raise ExampleError(f"{where}: {why}") from e
                self.stats["skipped"] += 1
                if len(self.errors) < 100:
                    self.errors.append(f"{where}: {why}")
                log.warning("skipping example %s: %s", where, why)
                continue
            yield s, enc

    def sequences(self, epoch: int) -> Iterator[Packed]:
        """All packed sequences of an epoch (every rank computes the same stream)."""
        yield from self._packed(self._order(epoch), self.lines)

    def validation_batches(self) -> list[list[Packed]]:
        """This rank's share of the held-out examples' sequences, as whole global batches (every
        rank gets the same number of batches; a last incomplete global batch is dropped)."""
        order = _items(self.heldout, [1] * len(self.heldout))  # in file order
        seqs = list(self._packed(order, self.heldout, count=False))
        per_global, B = self.batch_size * self.dp_size, self.batch_size
        return [
            seqs[g * per_global + self.dp_rank * B : g * per_global + (self.dp_rank + 1) * B]
            for g in range(len(seqs) // per_global)
        ]

    def _packed(self, order, lines, count: bool = True) -> Iterator[Packed]:
        """Pack the examples `order` names; `count`: add the packers' counts to the training stats."""
        packers = {}  # one per overflow policy, so documents are windowed and examples not

        def pack_all():
            for s, enc in self._encoded(order, lines):
                policy = self.sources[s].overflow
                packer = packers.setdefault(
                    policy, Packer(self.seq_len, policy, self.weighting, pad_id=self.vocab.pad_id)
                )
                yield from packer.add(enc)
            for packer in packers.values():
                yield from packer.flush()

        yield from pack_all()
        if count:
            for packer in packers.values():
                self.stats.update(packer.stats)

    def batches(self, state: StreamState) -> Iterator[tuple[list[Packed], StreamState]]:
        """This rank's batches from `state` on, forever (epoch after epoch), each with the state
        after it."""
        epoch, done = state.epoch, state.batches
        per_global = self.batch_size * self.dp_size
        while True:
            produced = 0
            buf: list[Packed] = []
            for n, seq in enumerate(self.sequences(epoch)):
                g, k = divmod(n, per_global)
                if g < done:
                    continue
                if self.dp_rank * self.batch_size <= k < (self.dp_rank + 1) * self.batch_size:
                    buf.append(seq)
                if k == per_global - 1:  # global batch g complete
                    yield buf, StreamState(epoch, g + 1)
                    buf, produced = [], produced + 1
            if produced == 0 and done == 0:
                raise ValueError(
                    f"an epoch yields fewer than one global batch ({per_global} sequences of {self.seq_len + 1} tokens)"
                )
            epoch, done = epoch + 1, 0  # an incomplete last global batch is dropped on every rank


def _items(lines: list[LineIndex], repeats: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(source, line index) of every line of every source, each `repeats[source]` times in a row."""
    counts = [len(index) for index in lines]
    src = np.repeat(np.arange(len(lines)), counts)
    idx = np.concatenate([np.arange(n) for n in counts]) if counts else np.zeros(0, np.int64)
    times = np.repeat(np.asarray(repeats, np.int64), counts)
    return np.repeat(src, times), np.repeat(idx, times)


def to_tensors(batch: list[Packed]) -> dict[str, torch.Tensor]:
    """Stack packed sequences and make next-token targets on the full sequence: (B, S+1) -> (B, S)."""
    tokens = torch.from_numpy(np.stack([p.tokens for p in batch]))
    weight = torch.from_numpy(np.stack([p.loss_weight for p in batch]))
    vision = torch.from_numpy(np.stack([p.vision_mask for p in batch]))
    segments = torch.from_numpy(np.stack([p.segment_ids for p in batch]))
    return {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_weight": weight[:, 1:],  # the weight of predicting each target
        "vision_mask": vision[:, 1:],  # whether each target is a vision token
        "segment_ids": segments[:, :-1],
    }

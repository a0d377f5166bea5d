"""A deterministic, resumable stream of packed sequences from JSON-lines sources.

Each epoch shuffles all examples of all sources with a seed derived from (seed, epoch), encodes
them, and packs them. Global batch g is made of sequences [g*B*D, (g+1)*B*D) of that stream
(B sequences per data-parallel rank, D ranks); data-parallel rank r takes its B of them, so ranks
read different samples, and every rank of a context-parallel group (same r) reads the same ones.
The state is (epoch, global batches done): resuming re-packs the epoch and skips what was done.
Bad examples (a line that is not JSON, or longer than `max_line_bytes`, which is never read whole; an
example that does not encode) are skipped with a warning naming file and line, and counted: `stats`,
the first reasons in `errors`, and the stream state's totals (a run logs them as data/skipped);
`strict` raises instead. Once an epoch has read JUDGED_AFTER examples, and again at the end of each
epoch's pass (so a small source is judged on all of it), more than `max_skipped_fraction` of the
examples read in that epoch skipped stops the stream (SkippedTooMany).
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

JUDGED_AFTER = 1000  # examples an epoch has read when max_skipped_fraction is first checked (then at its end)
REASONS = 100  # distinct reasons kept in `errors`


class SkippedTooMany(ValueError):
    """More than max_skipped_fraction of the examples an epoch read were skipped: the message has the
    fraction, the counts and the first reasons."""


class TooLittleData(ValueError):
    """A whole epoch of the sources does not fill one global batch: the message names the sources."""


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
    skipped: int = 0  # training examples skipped through the last of those batches, all epochs (a resume goes on)
    read: int = 0  # training examples read (skipped ones included) through it, all epochs

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches, "skipped": self.skipped, "read": self.read}


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
        max_line_bytes: int | None = None,
        max_skipped_fraction: float | None = None,
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
        self.max_line_bytes, self.max_skipped_fraction = max_line_bytes, max_skipped_fraction
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
        self.stats: Counter = Counter()  # "skipped": training examples, every pass; "heldout_skipped"; the packers'
        self.errors: list[str] = []  # the first REASONS distinct "file:line: why" of skipped examples
        self.tally: Counter = Counter()  # the training pass under way: examples "read" and "skipped" so far

    def _read(self, source: Source) -> LineIndex:
        path = Path(source.path)
        if not path.is_file():
            raise FileNotFoundError(f"data source {path} does not exist")
        # byte offsets: parsed when an epoch reaches them; a partial last line is dropped; a line over
        # max_line_bytes is indexed without being held, and skipped when an epoch reaches it
        return read_lines(path, self.max_line_bytes)

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, line index) of every example of one epoch, shuffled by (seed, epoch): two arrays, not
        a Python object per example."""
        src, idx = _items(self.lines, [source.repeat for source in self.sources])
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(src))
        return src[perm], idx[perm]

    def _encoded(
        self, order: tuple[np.ndarray, np.ndarray], lines: list[LineIndex], epoch: int | None
    ) -> Iterator[tuple]:
        """(source, encoded example) of `order`, bad ones skipped; `epoch`: a training pass (counted in
        `tally` and judged by max_skipped_fraction), None: the held-out examples."""
        tally = Counter()
        if epoch is not None:
            self.tally = tally
        for s, i in zip(*(a.tolist() for a in order)):
            enc = self._encode(s, lines[s][i], epoch is not None)
            tally["read"] += 1
            tally["skipped"] += enc is None
            if epoch is not None and tally["read"] == JUDGED_AFTER:
                self._judge(tally, f"the first {JUDGED_AFTER} examples epoch {epoch} read")
            if enc is not None:
                yield s, enc
        if epoch is not None:
            self._judge(tally, f"the {tally['read']} examples epoch {epoch} read")

    def _encode(self, s: int, line, training: bool):
        """The encoded example of a line of source s, None when it is skipped (counted, its reason kept)."""
        where = f"{self.sources[s].path}:{line.number}"
        try:
            return encode_example(
                line.parse(),
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
                raise ExampleError(f"{where}: {why} (data.strict=true: a bad example stops the run)") from e
            self.stats["skipped" if training else "heldout_skipped"] += 1
            reason = f"{where}: {why}"
            if len(self.errors) < REASONS and reason not in self.errors:  # each epoch meets them again
                self.errors.append(reason)
            log.warning("skipping example %s: %s", where, why)
            return None

    def _judge(self, tally: Counter, what: str) -> None:
        """Stop (SkippedTooMany) when more than max_skipped_fraction of the examples read were skipped."""
        limit = self.max_skipped_fraction
        if limit is None or not tally["read"] or tally["skipped"] <= limit * tally["read"]:
            return
        raise SkippedTooMany(
            f"{tally['skipped']} of {what} were skipped ({tally['skipped'] / tally['read']:.0%}), more than "
            f"data.max_skipped_fraction {limit:g}; first reasons: {first_reasons(self.errors)}. Fix or remove "
            "those examples, or raise data.max_skipped_fraction (1: never stop)"
        )

    def sequences(self, epoch: int) -> Iterator[Packed]:
        """All packed sequences of an epoch (every rank computes the same stream)."""
        yield from self._packed(self._order(epoch), self.lines, epoch)

    def validation_batches(self) -> list[list[Packed]]:
        """This rank's share of the held-out examples' sequences, as whole global batches (every
        rank gets the same number of batches; a last incomplete global batch is dropped)."""
        order = _items(self.heldout, [1] * len(self.heldout))  # in file order
        seqs = list(self._packed(order, self.heldout, None))
        per_global, B = self.batch_size * self.dp_size, self.batch_size
        return [
            seqs[g * per_global + self.dp_rank * B : g * per_global + (self.dp_rank + 1) * B]
            for g in range(len(seqs) // per_global)
        ]

    def _packed(self, order, lines, epoch: int | None) -> Iterator[Packed]:
        """Pack the examples `order` names; `epoch`: a training pass (counted in the stats), None: held out."""
        packers = {}  # one per overflow policy, so documents are windowed and examples not

        def pack_all():
            for s, enc in self._encoded(order, lines, epoch):
                policy = self.sources[s].overflow
                packer = packers.setdefault(
                    policy, Packer(self.seq_len, policy, self.weighting, pad_id=self.vocab.pad_id)
                )
                yield from packer.add(enc)
            for packer in packers.values():
                yield from packer.flush()

        yield from pack_all()
        if epoch is not None:
            for packer in packers.values():
                self.stats.update(packer.stats)

    def batches(self, state: StreamState) -> Iterator[tuple[list[Packed], StreamState]]:
        """This rank's batches from `state` on, forever (epoch after epoch), each with the state
        after it. The state's skipped and read count the whole stream through its batch (the same on
        every rank, each of which reads every example): the epochs before plus the pass so far. On a
        resume the epoch is read again up to `state`, which gives the same pass counts, and so the
        epochs before."""
        epoch, done = state.epoch, state.batches
        before = Counter({"skipped": state.skipped, "read": state.read} if done == 0 else {})
        per_global = self.batch_size * self.dp_size
        while True:
            produced = 0
            buf: list[Packed] = []
            for n, seq in enumerate(self.sequences(epoch)):
                g, k = divmod(n, per_global)
                if g < done:
                    if g == done - 1 and k == per_global - 1:  # the batch `state` ends with: so the epochs before
                        before = Counter({c: max(0, getattr(state, c) - self.tally[c]) for c in ("skipped", "read")})
                    continue
                if self.dp_rank * self.batch_size <= k < (self.dp_rank + 1) * self.batch_size:
                    buf.append(seq)
                if k == per_global - 1:  # global batch g complete
                    total = before + self.tally
                    yield buf, StreamState(epoch, g + 1, total["skipped"], total["read"])
                    buf, produced = [], produced + 1
            if produced == 0 and done == 0:
                names = ", ".join(str(source.path) for source in self.sources)
                raise TooLittleData(
                    f"the sources ({names}) yield fewer than one global batch in a whole epoch ({per_global} "
                    f"sequences of {self.seq_len + 1} tokens, {self.tally['skipped']} of {self.tally['read']} "
                    "examples skipped): add data, or lower the stage's batch or seq_len"
                )
            epoch, done = epoch + 1, 0  # an incomplete last global batch is dropped on every rank
            before = before + self.tally  # the whole pass, the dropped batch's examples included


def _items(lines: list[LineIndex], repeats: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(source, line index) of every line of every source, each `repeats[source]` times in a row."""
    counts = [len(index) for index in lines]
    src = np.repeat(np.arange(len(lines)), counts)
    idx = np.concatenate([np.arange(n) for n in counts]) if counts else np.zeros(0, np.int64)
    times = np.repeat(np.asarray(repeats, np.int64), counts)
    return np.repeat(src, times), np.repeat(idx, times)


def first_reasons(errors: list[str], n: int = 3) -> str:
    """The first `n` reasons of `errors`, and how many more there are."""
    more = f" (and {len(errors) - n} more)" if len(errors) > n else ""
    return "; ".join(errors[:n]) + more if errors else "none recorded"


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

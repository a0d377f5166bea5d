"""A deterministic, resumable stream of packed sequences from JSON-lines and parquet sources.

Each source is read through its index (lwm.data.index: every example's token count, made once and kept).
Each epoch orders all examples of all sources with a seed derived from (seed, epoch), and the epoch's
plan (lwm.data.epoch_plan) says from token counts alone which pieces of which examples make each packed
sequence; it is made once and kept in a file beside the first source's index (or in `data.index_dir`),
which every later start, rank and loader worker maps. Global batch g is made of sequences [g*B*D,
(g+1)*B*D) of that stream (B sequences per data-parallel rank, D ranks); data-parallel rank r takes its
B of them and encodes only their examples, so ranks read different samples, and every rank of a context-
parallel group (same r) reads the same ones. The stream depends on (seed, epoch, sequence length) and
not on D, so a run resumes onto another data-parallel degree at the same global batch. The state is
(epoch, global batches done): a resume starts at its next batch directly, and with loader workers each
worker makes every W-th batch.

Bad examples (a line that is not JSON, or longer than `max_line_bytes`, which is never read whole; a
parquet row or an example that does not encode) are found when the index is made: each is warned about
once naming its file and line or row, the first reasons are in `errors`, and the stream state counts
them as the epoch's order reaches them (a run logs them as data/skipped); `strict` raises instead. More
than `max_skipped_fraction` of an epoch's examples skipped stops the stream before its first batch
(SkippedTooMany). With `holdout` H, the last H examples of every source are never trained on: they are
packed once, in file order, for the validation loss (`validation_batches`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from lwm.data.code_cache import CodeStore
from lwm.data.epoch_plan import EpochPlan, EpochPlanFiles, plan_epoch
from lwm.data.example import Encoded, Encoder, ExampleError, parse_fields
from lwm.data.form import DIRECTIONS, ROLES, Form, source_form
from lwm.data.index import SourceIndex, example_key, source_index
from lwm.data.packing import OVERFLOW, WEIGHTING, Packed, assemble, example_weights
from lwm.data.sources import SourceError, check_columns, check_readable, check_record_keys
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.disk.weights import host_memory

log = logging.getLogger(__name__)

REASONS = 100  # reasons kept in `errors`
PLANS_KEPT = 2  # epochs whose plan a stream keeps (the one under way and the next)
# Host memory that planning an epoch takes per example of its order (repeats counted): its shuffled order,
# the planner's lists and the plan file's arrays; measured at 128 bytes (200K examples, 10 repeats)
PLAN_BYTES = 128


class SkippedTooMany(ValueError):
    """More than max_skipped_fraction of an epoch's examples are skipped: the message has the fraction,
    the counts and the first reasons."""


class TooLittleData(ValueError):
    """A whole epoch of the sources does not fill one global batch: the message names the sources."""


class StaleIndex(ValueError):
    """An example reads or encodes differently from what its source's index says: the source or the codes
    changed while the run read them. The next start remakes the index."""


class SourceChanged(StaleIndex):
    """A source whose identity (size, examples, token counts) differs from the one a checkpoint's data
    position was taken on: the message names it and data.on_changed_source."""


class EpochTooLarge(TooLittleData):
    """An epoch's order (every source's examples times its repeat) that this host's memory cannot plan: the
    message names the sources and their repeats. A TooLittleData, so that its callers refuse it alike: the
    epoch's size does not suit the run."""


@dataclass
class Source:
    path: str  # a source file in one of lwm.data.sources.FORMATS
    fields: str | list | None = None  # default spec for examples without their own "fields"
    overflow: str = "truncate"  # examples longer than the sequence: truncate | drop | window
    repeat: int = 1  # times each example appears per epoch (mixing weights)
    # the columns whose values are media files (a video or an image, or a list of them; lwm.data.form)
    media: list[str] = field(default_factory=list)
    media_root: str | None = None  # what media paths are relative to; None: the source file's folder
    conversation: str | None = None  # the column holding a conversation (LLaVA's "conversations")
    roles: dict[str, str] | None = None  # the conversation's role names -> user | assistant | system (None: LLaVA's)
    direction: str | None = None  # understanding | generation | both (LWM-Chat's; lwm.data.form); None: as written

    def form(self) -> Form:
        fields = (self.fields, self.media, self.media_root, self.conversation, self.roles, self.direction)
        return source_form(self.path, *fields)

    def spec_columns(self) -> list[str]:
        """The columns the source's default fields spec names (none for a conversation source)."""
        specs = [] if self.fields is None else [self.fields] if isinstance(self.fields, str) else list(self.fields)
        return (
            [n for spec in specs for group in parse_fields(spec) for n in group.fields] if not self.conversation else []
        )

    def columns(self) -> list[str]:
        """The columns the source says its records have: media, the conversation, the default spec's fields."""
        conversation = [self.conversation] if self.conversation else []
        return list(dict.fromkeys([*self.media, *conversation, *self.spec_columns()]))

    def check(self, name: str) -> None:
        """Range checks before any work, naming the source (`data.sources.<name>`, or its path): a planned
        epoch holds every example `repeat` times, so even a one-example source bounds repeat by memory."""
        try:
            check_readable(self.path)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        if self.overflow not in OVERFLOW:
            raise ValueError(f"{name}: overflow must be one of {OVERFLOW}, got {self.overflow!r}")
        if self.repeat < 1:
            raise ValueError(f"{name}: repeat (times each example appears per epoch) must be >= 1, got {self.repeat}")
        bad_roles = {k: v for k, v in (self.roles or {}).items() if v not in ROLES}
        if bad_roles:
            raise ValueError(f"{name}: roles map a conversation's role names to one of {ROLES}, got {bad_roles}")
        if self.direction is not None and (self.direction not in DIRECTIONS or self.conversation is not None):
            raise ValueError(
                f"{name}: direction must be one of {DIRECTIONS}, for a source of field specs (a conversation's "
                f"direction is where its media are), got {self.direction!r}"
            )
        if self.conversation is None and self.roles is not None:
            raise ValueError(f"{name}: roles name a conversation's roles; the source has no conversation column")
        try:
            check_columns(self.path, self.columns())
            # JSON records: a conversation source's conversation column (its text-only records lack the media);
            # else the media and the default spec's names, where a record has no spec of its own
            if self.conversation:
                check_record_keys(self.path, [self.conversation])
            else:
                check_record_keys(self.path, [*self.media, *self.spec_columns()], unless="fields")
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        most = host_memory() // PLAN_BYTES
        if self.repeat > most:
            raise ValueError(
                f"{name}: repeat {self.repeat} makes an epoch of at least {self.repeat} examples, each taking "
                f"{PLAN_BYTES} bytes to plan: more than this host's {host_memory() / 2**30:.1f} GiB of memory "
                f"holds (repeat at most {most} for a one-example source)"
            )


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
        index_dir: str | None = None,
        index_workers: int = 1,
    ):
        if not sources:
            raise ValueError("the packed stream has no data sources: give at least one JSON-lines or parquet file")
        vocab.check_tokenizer(text_tokenizer)
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is outside [0, dp_size {dp_size})")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if weighting not in WEIGHTING:
            raise ValueError(f"loss weighting must be one of {WEIGHTING}, got {weighting!r}")
        if holdout < 0:
            raise ValueError(f"data.holdout must be >= 0, got {holdout}")
        for source in sources:
            source.check(f"data source {source.path}")
        self.sources, self.vocab, self.seq_len, self.batch_size, self.seed = sources, vocab, seq_len, batch_size, seed
        self.dp_rank, self.dp_size, self.weighting, self.strict = dp_rank, dp_size, weighting, strict
        self.max_line_bytes, self.max_skipped_fraction = max_line_bytes, max_skipped_fraction
        self.encoder = Encoder(vocab, text_tokenizer, codes, max_frames, fps, seed)
        self.forms = [s.form() for s in sources]
        self.indexes: list[SourceIndex] = [
            source_index(s.path, self.encoder, form, max_line_bytes, index_dir, index_workers)
            for s, form in zip(sources, self.forms)
        ]
        self._warn_undeclared_media()
        self.trained: list[int] = []  # examples of each source trained on (the rest are held out)
        for source, index in zip(sources, self.indexes):
            if holdout and len(index) <= holdout:
                raise ValueError(
                    f"data source {source.path} has {len(index)} examples: data.holdout {holdout} leaves none to train on"
                )
            self.trained.append(len(index) - holdout)
        self.errors: list[str] = [  # the first REASONS "file:line: why" of skipped examples
            why for index in self.indexes for why in index.reasons.values()
        ][:REASONS]
        if strict and self.errors:
            raise ExampleError(f"{self.errors[0]} (data.strict=true: a bad example stops the run)")
        self._check_epoch_size()
        self.skipped = sum(  # training examples an epoch skips, repeats counted
            source.repeat * int(np.count_nonzero(index.lengths[:n] < 0))
            for source, index, n in zip(sources, self.indexes, self.trained)
        )
        self._judge()
        self.encoded: Counter = Counter()  # what this process encoded: "examples", "tokens"
        self._plans: dict[int, EpochPlan] = {}
        self._plan_files = self._plans_kept_in(index_dir)
        self._last: tuple | None = None  # ((source, example), Encoded): a windowed example spans sequences
        self._global_batches(self.plan(0))  # too little data is said here, before any batch is made

    def _warn_undeclared_media(self) -> None:
        """A source's first example with a text column of media paths: warned about, naming the source and
        the column (its media are not trained on)."""
        for source, form, index in zip(self.sources, self.forms, self.indexes):
            first = next((i for i in range(min(len(index), 100)) if index.lengths[i] >= 0), None)
            columns = [] if first is None else form.undeclared_media(index.reader.example(first))
            if columns:
                log.warning(
                    "data source %s: column %r holds media file paths and is read as text; name it in the source's "
                    "media to train on the files' codes",
                    source.path,
                    columns[0],
                )

    def identities(self) -> list[dict]:
        """What each source was when its index was read: what a data position means (a checkpoint keeps it)."""
        return [
            {
                "path": str(source.path),
                "size": int(index.header["size"]),
                "mtime_ns": int(index.header["mtime_ns"]),
                "examples": len(index),
                "index_sha256": hashlib.sha256(np.ascontiguousarray(index.lengths, np.int32).tobytes()).hexdigest(),
            }
            for source, index in zip(self.sources, self.indexes)
        ]

    def _check_epoch_size(self) -> None:
        """Refuse (EpochTooLarge) an epoch whose plan would take more than the host's memory."""
        items = sum(source.repeat * n for source, n in zip(self.sources, self.trained))
        if items * PLAN_BYTES > host_memory():
            each = ", ".join(f"{s.path}: {n} examples x repeat {s.repeat}" for s, n in zip(self.sources, self.trained))
            raise EpochTooLarge(
                f"an epoch of {items} examples ({each}) takes {items * PLAN_BYTES / 2**30:.1f} GiB to plan, more "
                f"than this host's {host_memory() / 2**30:.1f} GiB of memory: lower the sources' repeat"
            )

    def _judge(self) -> None:
        """Stop (SkippedTooMany) when more than max_skipped_fraction of an epoch's examples are skipped."""
        limit = self.max_skipped_fraction
        total = sum(source.repeat * n for source, n in zip(self.sources, self.trained))
        if limit is None or not total or self.skipped <= limit * total:
            return
        raise SkippedTooMany(
            f"{self.skipped} of the {total} examples of an epoch are skipped ({self.skipped / total:.0%}), more "
            f"than data.max_skipped_fraction {limit:g}; first reasons: {first_reasons(self.errors)}. Fix or "
            "remove those examples, or raise data.max_skipped_fraction (1: never stop)"
        )

    def _global_batches(self, p: EpochPlan) -> int:
        """The whole global batches of an epoch's plan; none raises TooLittleData naming the sources."""
        per_global = self.batch_size * self.dp_size
        if len(p) < per_global:
            names = ", ".join(str(source.path) for source in self.sources)
            raise TooLittleData(
                f"the sources ({names}) yield fewer than one global batch in a whole epoch ({per_global} "
                f"sequences of {self.seq_len + 1} tokens, {p.total_skipped} of {len(p.src)} examples "
                "skipped): add data, or lower the stage's batch or seq_len"
            )
        return len(p) // per_global

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, example) of every example of one epoch, shuffled by (seed, epoch): two arrays, not
        a Python object per example."""
        src, idx = _items(self.trained, [source.repeat for source in self.sources])
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(src))
        return src[perm], idx[perm]

    def plan(self, epoch: int) -> EpochPlan:
        """The packing plan of an epoch, from its file (EpochPlanFiles), or made and kept there (held for the
        epoch under way and the next)."""
        if epoch not in self._plans:
            self._plans[epoch] = self._plan_files.get(epoch, lambda: self._make_plan(epoch))
            for old in sorted(self._plans)[:-PLANS_KEPT]:
                del self._plans[old]
        return self._plans[epoch]

    def _make_plan(self, epoch: int) -> EpochPlan:
        lengths = [index.lengths for index in self.indexes]
        return plan_epoch(*self._order(epoch), lengths, [s.overflow for s in self.sources], self.seq_len)

    def _plans_kept_in(self, index_dir: str | None) -> EpochPlanFiles:
        """Where the epochs' plans are kept (data.index_dir, else beside the first source's index), keyed
        by what a plan depends on: each index (its file's name holds the encoding's key; its header, the
        source's size and mtime), the examples trained on, repeats, overflow policies, seed and sequence
        length."""
        identity = {
            "indexes": [(index.file.name, index.header) for index in self.indexes],
            "trained": self.trained,
            "repeat": [s.repeat for s in self.sources],
            "overflow": [s.overflow for s in self.sources],
            "seed": self.seed,
            "seq_len": self.seq_len,
        }
        folder = Path(index_dir) if index_dir is not None else self.indexes[0].file.parent
        return EpochPlanFiles(folder, Path(self.sources[0].path).name, identity)

    def __getstate__(self) -> dict:
        """A loader worker maps the kept plans from their files instead of receiving a copy of them."""
        state = dict(self.__dict__)
        state["_plans"] = {e: p for e, p in self._plans.items() if p.file is None}
        return state

    def _example(self, s: int, i: int) -> Encoded:
        """Example i of source s, encoded; it must be what the index measured."""
        if self._last is not None and self._last[0] == (s, i):
            return self._last[1]
        index, source = self.indexes[s], self.sources[s]
        try:
            enc = self.encoder(index.reader.example(i), self.forms[s], example_key(source.path, i))
        except (ExampleError, SourceError) as e:
            index.file.unlink(missing_ok=True)
            raise StaleIndex(
                f"{index.reader.where(i)} encoded when its index {index.file} was made, and now does not ({e}): "
                "the source or the codes changed during the run; the index is removed, and the next start makes it again"
            ) from None
        if len(enc) != index.lengths[i]:
            index.file.unlink(missing_ok=True)
            raise StaleIndex(
                f"{index.reader.where(i)} has {len(enc)} tokens, its index {index.file} says {index.lengths[i]}: the "
                "source or the codes changed during the run; the index is removed, and the next start makes it again"
            )
        self.encoded["examples"] += 1
        self.encoded["tokens"] += len(enc)
        self._last = ((s, i), enc)
        return enc

    def packed(self, pieces: list[tuple[int, int, int, int]]) -> Packed:
        """A planned sequence, encoded: its (source, example, start, length) pieces, then padding."""
        parts = []
        for s, i, start, size in pieces:
            piece = self._example(s, i).slice(start, start + size)
            parts.append((piece, example_weights(piece, self.weighting)))
        return assemble(parts, self.seq_len + 1, self.vocab.pad_id)

    def sequences(self, epoch: int) -> Iterator[Packed]:
        """All packed sequences of an epoch, every one encoded (the global stream; a rank takes `batches`)."""
        p = self.plan(epoch)
        for n in range(len(p)):
            yield self.packed(p.sequence(n))

    def validation_batches(self) -> list[list[Packed]]:
        """This rank's share of the held-out examples' sequences, as whole global batches (every
        rank gets the same number of batches; a last incomplete global batch is dropped)."""
        src, idx = [], []
        for s, (index, n) in enumerate(zip(self.indexes, self.trained)):  # in file order
            src.append(np.full(len(index) - n, s, np.int64))
            idx.append(np.arange(n, len(index), dtype=np.int64))
        lengths = [index.lengths for index in self.indexes]
        held = plan_epoch(
            np.concatenate(src), np.concatenate(idx), lengths, [s.overflow for s in self.sources], self.seq_len
        )
        per_global, B = self.batch_size * self.dp_size, self.batch_size
        first = self.dp_rank * B
        return [
            [self.packed(held.sequence(g * per_global + first + b)) for b in range(B)]
            for g in range(len(held) // per_global)
        ]

    def batches(
        self, state: StreamState, worker: int = 0, workers: int = 1
    ) -> Iterator[tuple[list[Packed], StreamState]]:
        """This rank's batches from `state` on, forever (epoch after epoch), each with the state after
        it; with loader workers, worker w of W makes the batches w, w + W, ... of them. The state's skipped
        and read count the whole stream through its batch, the same on every rank: the epochs before plus
        the epoch's order up to where its plan completed the batch."""
        epoch, done = state.epoch, state.batches
        per_global, B = self.batch_size * self.dp_size, self.batch_size
        p = self.plan(epoch)
        if done == 0:
            before = (state.skipped, state.read)
        else:  # what the state counted, less what its epoch counted through its batch
            last = done * per_global - 1
            before = (state.skipped - int(p.skipped[last]), state.read - int(p.read[last]))
        turn = 0  # this rank's batches from `state` on, across epochs
        while True:
            n_batches = self._global_batches(p)  # an incomplete last global batch is dropped on every rank
            for g in range(done, n_batches):
                turn += 1
                if (turn - 1) % workers != worker:
                    continue
                first = g * per_global + self.dp_rank * B
                seqs = [self.packed(p.sequence(first + b)) for b in range(B)]
                last = (g + 1) * per_global - 1
                after = StreamState(epoch, g + 1, before[0] + int(p.skipped[last]), before[1] + int(p.read[last]))
                yield seqs, after
            before = (before[0] + p.total_skipped, before[1] + len(p.src))  # the whole pass, dropped batch included
            epoch, done = epoch + 1, 0
            p = self.plan(epoch)


def _items(counts: list[int], repeats: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(source, example) of the first counts[source] examples of every source, each `repeats[source]`
    times in a row."""
    src = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    idx = np.concatenate([np.arange(n, dtype=np.int32) for n in counts]) if counts else np.zeros(0, np.int32)
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

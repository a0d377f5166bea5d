"""Configuring the packed stream and cutting its batches for one rank.

Targets are made on the full packed sequence; then every tensor is sharded along the sequence for
this rank of its context-parallel group (the layout of the parallel config), with the global
positions of its tokens, or each token's position within its example.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from lwm.data.packing import WEIGHTING
from lwm.data.stream import PackedStream, Source, StreamState, to_tensors
from lwm.model.documents import Documents
from lwm.parallel.layout import positions, shard
from lwm.processes import alive

POSITIONS = ("sequence", "document")
ON_CHANGED_SOURCE = ("refuse", "restart_epoch")
WHOLE_IDS = "sequence_segment_ids"  # the whole sequence's segment ids, kept on the host for with_documents
LOSS_ROWS = "loss_rows"  # (n,) the flat positions of the rank's (B, S / cp) slice that carry loss weight


@dataclass
class StreamOptions:
    """How examples become sequences: what a run's data config (conf/data, lwm.core.config.DataSpec)
    and the stream of one stage (DataConfig) have in common."""

    tokenizer: str = "data/sample/tokenizer.model"
    codes: str | None = None  # output folder of lwm-tokenize
    seed: int = 0
    max_frames: int | None = None  # frames per video (uniform over the clip)
    fps: float | None = None  # or frames per second
    weighting: str = "example"  # loss weight per example ("example") or per token ("token")
    holdout: int = 0  # the last this many examples of every source: never trained on, the validation loss's
    strict: bool = False  # stop at a bad example (naming file, line and why) instead of skipping and counting it
    # a longer line (bytes, its newline not counted) is skipped and counted without ever being read whole
    # (read 1 MiB at a time), or stops the run under strict; 64 MiB by default
    max_line_bytes: int = 64 * 2**20
    # stop (train.py exits 2) when more than this fraction of an epoch's examples are skipped; judged from
    # the sources' indexes before the first batch. 1: never stop
    max_skipped_fraction: float = 0.5
    # where each source's index (every example's token count: lwm.data.index) is kept; None: beside the source
    index_dir: str | None = None
    index_workers: int = 8  # processes that make the index of a source of 20000 or more examples
    # loader worker processes per rank that encode and pack its batches while it trains (0: in the training
    # process); 2 keep up with a GPU step at every stage (docs/benchmarks.md, bench.data)
    num_workers: int = 2
    # a source changed (appended to, replaced, truncated) since the checkpoint a run resumes from: "refuse"
    # (train.py exits 2 naming it), or "restart_epoch": the epoch's plan made again from the source as it is
    # now, from its first batch (the checkpoint's position means nothing in the new plan)
    on_changed_source: str = "refuse"

    def __post_init__(self) -> None:
        if self.on_changed_source not in ON_CHANGED_SOURCE:
            raise ValueError(
                f"data.on_changed_source must be one of {ON_CHANGED_SOURCE}, got {self.on_changed_source!r}"
            )
        if self.weighting not in WEIGHTING:
            raise ValueError(f"data.weighting must be one of {WEIGHTING}, got {self.weighting!r}")
        if self.holdout < 0:
            raise ValueError(f"data.holdout (examples held out of every source) must be >= 0, got {self.holdout}")
        if not 0 <= self.seed < 2**32:  # numpy's generators take no negative seed
            raise ValueError(f"data.seed must lie in [0, 2**32), got {self.seed}")
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError(f"data.max_frames must be >= 1 (null: every sampled frame), got {self.max_frames}")
        if self.fps is not None and not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"data.fps must be a finite number > 0 (null: max_frames alone), got {self.fps}")
        # the run's named sources (conf/data: a dict) or a stage's (a list), checked where the config is built
        sources = getattr(self, "sources", None) or {}
        named = sources.items() if isinstance(sources, dict) else ((s.path, s) for s in sources)
        for name, source in named:
            if isinstance(source, Source):
                source.check(f"data.sources.{name}" if isinstance(sources, dict) else f"data source {name}")
        for name in ("index_workers", "num_workers"):
            if getattr(self, name) < (1 if name == "index_workers" else 0):
                raise ValueError(
                    f"data.{name} must be >= {1 if name == 'index_workers' else 0}, got {getattr(self, name)}"
                )
        if self.max_line_bytes < 1:
            raise ValueError(f"data.max_line_bytes must be >= 1, got {self.max_line_bytes}")
        if not 0 <= self.max_skipped_fraction <= 1:
            raise ValueError(
                f"data.max_skipped_fraction must lie in [0, 1] (1: never stop), got {self.max_skipped_fraction}"
            )


@dataclass
class DataConfig(StreamOptions):
    """The packed stream of one stage."""

    sources: list[Source] = field(default_factory=list)
    batch_size: int = 1  # sequences per data-parallel rank
    positions: str = "sequence"  # RoPE positions: "sequence" (0..S-1) or "document" (restart in each example)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.positions not in POSITIONS:
            raise ValueError(f"data.positions must be one of {POSITIONS}, got {self.positions!r}")


@dataclass
class Sharding:
    """Where this process sits: data-parallel rank/size, context-parallel rank/size and layout."""

    dp_rank: int = 0
    dp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    layout: str = "striped"
    ulysses_size: int = 1


def document_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, S) ids -> (B, S) long: each token's position in its example, restarting at 0 where the
    id changes (as Hugging Face packing with position_ids does)."""
    B, S = segment_ids.shape
    idx = torch.arange(S).expand(B, S)
    start = torch.ones(B, S, dtype=torch.bool)
    start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (B, S): where each run starts
    return idx - first


def shard_batch(
    batch: dict[str, torch.Tensor], sharding: Sharding, position_mode: str = "sequence"
) -> dict[str, torch.Tensor]:
    """Every (B, S) tensor -> this rank's (B, S / cp) slice, plus `positions`: (S / cp,) global
    positions, or (B, S / cp) positions within each example (computed on the whole sequence), and
    `WHOLE_IDS`: the whole sequence's segment ids, from which `with_documents` reads the documents, and
    `LOSS_ROWS` when some positions carry no loss weight (the loss's head runs on the others only)."""
    S = batch["tokens"].shape[1]
    sh = sharding
    if position_mode == "document":
        batch = {**batch, "positions": document_positions(batch["segment_ids"])}
    out = {k: shard(v, 1, sh.cp_rank, sh.cp_size, sh.layout, sh.ulysses_size) for k, v in batch.items()}
    if position_mode == "sequence":
        out["positions"] = positions(S, sh.cp_rank, sh.cp_size, sh.layout, sh.ulysses_size)
    if "segment_ids" in batch:
        out[WHOLE_IDS] = batch["segment_ids"]
    if "loss_weight" in out:  # read here, on the host: the step never waits on the device to count them
        rows = out["loss_weight"].reshape(-1).nonzero().squeeze(1)  # (B * S / cp,) -> (n,)
        if rows.numel() < out["loss_weight"].numel():
            out[LOSS_ROWS] = rows
    return out


def with_documents(batch: dict) -> dict:
    """The batch with `documents` (lwm.model.documents.Documents) read from its WHOLE_IDS (taken out),
    on the host, once: every attention call of the step uses them, and moving the batch to a device
    leaves them on the host. Called as the training loop takes a batch, before it moves."""
    if WHOLE_IDS not in batch:
        return batch
    rest = {k: v for k, v in batch.items() if k != WHOLE_IDS}  # a new dict: a stored batch stays whole
    return {**rest, "documents": Documents(batch[WHOLE_IDS], batch["segment_ids"].shape[1])}


class ShardedBatches(IterableDataset):
    """The stream's batches from `state` on, sharded for this rank; each carries the stream state after it.
    In a loader's worker w of W it makes batches w, w + W, ...: the loader takes them from its workers in
    turn, so the batches come in the stream's order."""

    def __init__(self, stream: PackedStream, state: StreamState, sharding: Sharding, position_mode: str):
        self.stream, self.state, self.sharding, self.position_mode = stream, state, sharding, position_mode
        self.owner = os.getpid()  # the rank's process

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            exit_with(self.owner)
        for seqs, after in self.stream.batches(self.state, worker, workers):
            batch = shard_batch(to_tensors(seqs), self.sharding, self.position_mode)
            batch["data_state"] = torch.tensor([after.epoch, after.batches, after.skipped, after.read])
            yield batch


def exit_with(owner: int, every_s: float = 1.0) -> None:
    """In a loader worker: end this process once the rank's process `owner` is gone. A worker forked from a
    fork server outlives a killed rank otherwise (torch's own watchdog watches the worker's parent, the
    server, which lives as long as its workers do)."""

    def watch():
        while alive(owner):
            time.sleep(every_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="rank-watchdog").start()

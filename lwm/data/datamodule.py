"""The Lightning datamodule: packed sequences, next-token targets, this rank's context-parallel slice.

Targets are made on the full packed sequence; then every tensor is sharded along the sequence for
this rank of its context-parallel group (layout from the parallel config), with the global
positions of its tokens. The datamodule's state (epoch, global batches consumed) goes into
checkpoints: it is updated when the training loop takes a batch (on_before_batch_transfer), not
when the loader prefetches one, so a resumed run continues with the very next batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lwm.data.codes import CodeStore
from lwm.data.dataset import PackedStream, Source, StreamState, to_tensors
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.parallel.layout import check_divisible, positions, shard

POSITIONS = ("sequence", "document")


@dataclass
class DataConfig:
    sources: list[Source] = field(default_factory=list)
    tokenizer: str = "data/sample/tokenizer.model"
    codes: str | None = None  # output folder of lwm-tokenize
    batch_size: int = 1  # sequences per data-parallel rank
    seed: int = 0
    max_frames: int | None = None  # frames per video (uniform over the clip)
    fps: float | None = None  # or frames per second
    weighting: str = "example"  # loss weight per example ("example") or per token ("token")
    strict: bool = False  # raise on a bad example instead of skipping it
    positions: str = "sequence"  # RoPE positions: "sequence" (0..S-1) or "document" (restart in each example)
    holdout: int = 0  # the last this many examples of every source: never trained on, the validation loss's

    def __post_init__(self) -> None:
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
    positions, or (B, S / cp) positions within each example (computed on the whole sequence)."""
    S = batch["tokens"].shape[1]
    sh = sharding
    if position_mode == "document":
        batch = {**batch, "positions": document_positions(batch["segment_ids"])}
    out = {k: shard(v, 1, sh.cp_rank, sh.cp_size, sh.layout, sh.ulysses_size) for k, v in batch.items()}
    if position_mode == "sequence":
        out["positions"] = positions(S, sh.cp_rank, sh.cp_size, sh.layout, sh.ulysses_size)
    return out


class _Batches(IterableDataset):
    def __init__(self, stream: PackedStream, state: StreamState, sharding: Sharding, position_mode: str):
        self.stream, self.state, self.sharding, self.position_mode = stream, state, sharding, position_mode

    def __iter__(self) -> Iterator[dict]:
        for seqs, after in self.stream.batches(self.state):
            batch = shard_batch(to_tensors(seqs), self.sharding, self.position_mode)
            batch["data_state"] = torch.tensor([after.epoch, after.batches])
            yield batch


class LWMDataModule(L.LightningDataModule):
    """`sharding` places this process explicitly; without it, a datamodule attached to a Trainer
    places itself from the trainer's rank: dp = world / cp_size, global rank = dp_rank * cp + cp_rank."""

    def __init__(
        self,
        config: DataConfig,
        seq_len: int,
        vocab: Vocab | None = None,
        sharding: Sharding | None = None,
        cp_size: int = 1,
        layout: str = "striped",
    ):
        super().__init__()
        self.config, self.seq_len = config, seq_len
        self.explicit = sharding is not None
        self.sharding = sharding or Sharding(cp_size=cp_size, layout=layout)
        sh = self.sharding
        check_divisible(seq_len, sh.cp_size, sh.layout, sh.ulysses_size)
        self.text_tokenizer = TextTokenizer(config.tokenizer)
        self.vocab = vocab or Vocab(self.text_tokenizer.vocab_size)
        self.state = StreamState()
        self.stream: PackedStream | None = None

    def _place_from_trainer(self) -> None:
        trainer = getattr(self, "trainer", None)
        if self.explicit or trainer is None or trainer.world_size == 1:
            return
        cp, world, rank = self.sharding.cp_size, trainer.world_size, trainer.global_rank
        if world % cp:
            raise ValueError(f"world size {world} is not divisible by the context-parallel degree {cp}")
        self.sharding = Sharding(rank // cp, world // cp, rank % cp, cp, self.sharding.layout)

    def setup(self, stage: str | None = None) -> None:
        if self.stream is not None:
            return
        self._place_from_trainer()
        c, sh = self.config, self.sharding
        if not c.sources:
            raise ValueError("DataConfig.sources is empty: give at least one JSON-lines file")
        self.stream = PackedStream(
            c.sources,
            self.vocab,
            self.text_tokenizer,
            self.seq_len,
            c.batch_size,
            codes=CodeStore(c.codes) if c.codes else None,
            seed=c.seed,
            dp_rank=sh.dp_rank,
            dp_size=sh.dp_size,
            max_frames=c.max_frames,
            fps=c.fps,
            weighting=c.weighting,
            strict=c.strict,
            holdout=c.holdout,
        )

    def train_dataloader(self) -> DataLoader:
        self.setup()
        # batch_size=None: the stream already yields whole batches; one process keeps the state exact
        return DataLoader(
            _Batches(
                self.stream, StreamState(self.state.epoch, self.state.batches), self.sharding, self.config.positions
            ),
            batch_size=None,
        )

    def val_dataloader(self) -> DataLoader:
        """The held-out sequences (data.holdout), this rank's share, sharded like training batches."""
        self.setup()
        batches = self.stream.validation_batches() if self.config.holdout else []
        if self.config.holdout and not batches:
            raise ValueError(
                f"data.holdout {self.config.holdout} gives fewer sequences than one global batch "
                f"({self.config.batch_size * self.sharding.dp_size} of {self.seq_len + 1} tokens)"
            )
        return DataLoader(
            [shard_batch(to_tensors(b), self.sharding, self.config.positions) for b in batches], batch_size=None
        )

    def on_before_batch_transfer(self, batch, dataloader_idx: int = 0):
        if "data_state" in batch:  # a training batch (validation batches carry no stream state)
            epoch, done = batch.pop("data_state").tolist()
            self.state = StreamState(epoch, done)  # the loop has taken this batch
        return batch

    def state_dict(self) -> dict:
        return self.state.as_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state = StreamState(int(state["epoch"]), int(state["batches"]))

"""The Lightning datamodule: the packed stream of lwm.data, sharded for this rank, as loaders.

The datamodule's state (epoch, global batches consumed, and the stream's counts of examples read and
skipped, which data/skipped logs) goes into checkpoints: it is updated when
the training loop takes a batch (on_before_batch_transfer), not when the loader prefetches one, so
a resumed run continues with the very next batch.
"""

from __future__ import annotations

import multiprocessing
import sys
import types

import lightning as L
from torch.utils.data import DataLoader

from lwm.data import CodeStore, PackedStream, SourceChanged, StreamState, TextTokenizer, Vocab, to_tensors
from lwm.data.batches import DataConfig, ShardedBatches, Sharding, shard_batch, with_documents
from lwm.parallel.dims import ParallelDims
from lwm.parallel.layout import check_divisible
from lwm.ranks import say


def worker_context():
    """Loader workers forked from a fresh server process, not from this rank: a worker forked from the rank
    would hold the rank's sockets open after it died, and its peers would wait in their collectives until
    the timeout instead of failing at once. The server imports lwm.data and what the main script imports
    once, so a stage's workers start in milliseconds (spawning each would import torch again)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["lwm.data.batches", *main_imports()])
    return context


def main_imports() -> list[str]:
    """The modules the main script's names come from. A worker imports the main script again (as
    __mp_main__); CPython 3.11's fork server does not import it once for all of them (it looks for a
    "main_path" its preparation data names "init_main_from_path"), so what it imports must already be there
    (3 s a worker for train.py otherwise)."""
    main = sys.modules.get("__main__")
    names = set()
    for value in vars(main).values() if main is not None else ():
        module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(module, str) and module.split(".")[0] not in ("__main__", "__mp_main__", "builtins"):
            names.add(module)
    return sorted(names)


class LWMDataModule(L.LightningDataModule):
    """`sharding` places this process explicitly; without it, a datamodule attached to a Trainer
    places itself from the trainer's rank by `dims` (lwm.parallel.dims: the tp ranks of a cp rank
    read the same tokens)."""

    def __init__(
        self,
        config: DataConfig,
        seq_len: int,
        vocab: Vocab | None = None,
        sharding: Sharding | None = None,
        dims: ParallelDims | None = None,
        layout: str = "striped",
    ):
        super().__init__()
        self.config, self.seq_len = config, seq_len
        self.explicit = sharding is not None
        self.dims = dims or ParallelDims()
        self.sharding = sharding or Sharding(cp_size=self.dims.cp, layout=layout, ulysses_size=self.dims.data_ulysses)
        sh = self.sharding
        check_divisible(seq_len, sh.cp_size, sh.layout, sh.ulysses_size)
        self.text_tokenizer = TextTokenizer(config.tokenizer)
        self.vocab = vocab or Vocab(self.text_tokenizer.vocab_size)
        self.state = StreamState()
        self.stream: PackedStream | None = None
        self.recorded: list[dict] | None = None  # the sources a loaded checkpoint's position was taken on

    def _place_from_trainer(self) -> None:
        trainer = getattr(self, "trainer", None)
        if self.explicit or trainer is None or trainer.world_size == 1:
            return
        self.dims.check_world(trainer.world_size)
        dp_rank, cp_rank, _ = self.dims.coords(trainer.global_rank)
        sh = self.sharding
        self.sharding = Sharding(dp_rank, self.dims.dp, cp_rank, self.dims.cp, sh.layout, sh.ulysses_size)

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
            max_line_bytes=c.max_line_bytes,
            max_skipped_fraction=c.max_skipped_fraction,
            index_dir=c.index_dir,
            index_workers=c.index_workers,
        )
        self._check_sources()

    def train_dataloader(self) -> DataLoader:
        self.setup()
        # batch_size=None: the stream already yields whole batches. Workers make them ahead of the step; each
        # batch carries its stream state, which becomes the datamodule's only when the loop takes it
        workers = self.config.num_workers
        return DataLoader(
            ShardedBatches(self.stream, StreamState(**self.state.as_dict()), self.sharding, self.config.positions),
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=worker_context() if workers else None,
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
            self.state = StreamState(*batch.pop("data_state").tolist())  # the loop has taken this batch
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        # where the documents are is read on the host, from the whole sequence's ids, before the move
        return super().transfer_batch_to_device(with_documents(batch), device, dataloader_idx)

    def state_dict(self) -> dict:
        """The stream's position, and what it means: each source's identity (PackedStream.identities)."""
        if self.stream is None:
            return self.state.as_dict()
        return {**self.state.as_dict(), "sources": self.stream.identities()}

    def load_state_dict(self, state: dict) -> None:
        # skipped and read: the whole stream's counts (0 from a checkpoint written before they were kept)
        self.state = StreamState(*(int(state.get(k, 0)) for k in ("epoch", "batches", "skipped", "read")))
        self.recorded = state.get("sources")  # None from a checkpoint written before sources were kept
        if self.stream is not None:  # Lightning restores after setup
            self._check_sources()

    def _check_sources(self) -> None:
        """The loaded position against the sources as they are now: a source whose size, examples or token
        counts changed is refused (SourceChanged), or with data.on_changed_source=restart_epoch the epoch's
        plan starts again (from the new sources, at its first batch). A newer modification time alone (a
        copy, a touch) is said and the position kept: the plan it indexes is the same."""
        if self.recorded is None or self.state.batches == 0:
            return
        now = self.stream.identities()
        changed, touched = [], []
        for i, was in enumerate(self.recorded):
            new = now[i] if i < len(now) else None
            if new is None or new["path"] != was.get("path"):
                changed.append(f"{was.get('path')} (not a source of this stage now)")
            elif any(new[k] != was.get(k) for k in ("size", "examples", "index_sha256")):
                what = [f"{k} {was.get(k)} -> {new[k]}" for k in ("size", "examples") if new[k] != was.get(k)]
                changed.append(f"{new['path']} ({', '.join(what) or 'the same size, other token counts'})")
            elif new["mtime_ns"] != was.get("mtime_ns"):
                touched.append(new["path"])
        changed += [f"{new['path']} (a source added)" for new in now[len(self.recorded) :]]
        self.recorded = None
        if touched and not changed:
            say(f"note: {', '.join(touched)} modified since the checkpoint, with the same size and token counts")
        if not changed:
            return
        epoch = self.state.epoch
        if self.config.on_changed_source == "restart_epoch":
            say(f"data.on_changed_source=restart_epoch: {'; '.join(changed)} changed; epoch {epoch} planned again")
            self.state = StreamState(epoch, 0, self.state.skipped, self.state.read)
            return
        raise SourceChanged(
            f"data sources changed since the checkpoint was taken at batch {self.state.batches} of epoch {epoch}: "
            f"{'; '.join(changed)}. Its position means other examples now (some trained twice, some never): put the "
            "sources back as they were, or rerun with data.on_changed_source=restart_epoch to plan the epoch again"
        )

"""A held-out answer probe: at the start and at the end of every stage, the fraction of held-out
answers the model gets exactly right, logged (probe/accuracy in metrics.csv), written to
<stage>/probe.json and printed.

Examples are JSON lines in the training format; each group of an example that carries loss (its
closing EOS aside) is one answer, and it is right when every one of its tokens is the model's
argmax given all that precedes it, which is what greedy decoding would write. Each example runs as
one sequence, split over the context-parallel group as training splits its batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from lwm.core.config import ProbeConfig
from lwm.data import Sharding, shard_batch
from lwm.data.code_cache import CodeStore
from lwm.data.example import Encoded, ExampleError, encode_example
from lwm.io import records
from lwm.ranks import is_rank0, say


def answer_ids(enc: Encoded) -> np.ndarray:
    """(L,) int: 1, 2, ... for the tokens of each answer (a run of loss tokens), 0 elsewhere; the
    closing EOS is not an answer."""
    mask = enc.loss_mask.copy()
    mask[-1] = False
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    return np.where(mask, np.cumsum(starts), 0)


def probe_batch(enc: Encoded, multiple: int) -> tuple[dict[str, torch.Tensor], int]:
    """One example as a training-style batch padded to a multiple of `multiple` inputs, and its
    number of answers. `answers` holds, per target, the answer it belongs to (0: none)."""
    n = len(enc) - 1  # inputs
    length = -(-n // multiple) * multiple
    tokens = np.zeros(length + 1, dtype=np.int64)
    tokens[: len(enc)] = enc.tokens
    seg = np.zeros(length + 1, dtype=np.int32)
    seg[: len(enc)] = 1
    answers = np.zeros(length + 1, dtype=np.int64)
    ids = answer_ids(enc)
    answers[: len(enc)] = ids
    t = lambda a: torch.from_numpy(a)[None]  # noqa: E731
    batch = {"tokens": t(tokens[:-1]), "targets": t(tokens[1:]), "segment_ids": t(seg[:-1]), "answers": t(answers[1:])}
    return batch, int(ids.max())


def read_examples(config: ProbeConfig, datamodule) -> list[Encoded]:
    """The first `config.examples` examples, encoded with the stage's vocabulary and codes; a bad
    one is an error naming its line (a probe that skipped examples would not mean what it says)."""
    dc = datamodule.config
    codes = CodeStore(dc.codes) if dc.codes else None
    out = []
    for n, row in records(config.path):
        if len(out) == config.examples:
            break
        try:
            out.append(
                encode_example(
                    row,
                    datamodule.vocab,
                    datamodule.text_tokenizer,
                    codes,
                    max_frames=dc.max_frames,
                    fps=dc.fps,
                    seed=dc.seed,
                    key=f"{config.path}:{n}",
                )
            )
        except ExampleError as e:
            raise ValueError(f"probe.path {config.path}:{n}: {e}") from None
    if not out:
        raise ValueError(f"probe.path {config.path} has no examples")
    return out


class AnswerProbe(L.Callback):
    """Scores the held-out answers at the stage's first step and after its last; a stage stopped early
    is not at its end yet, and a resumed one keeps the start score it had (probe.json, metrics.csv)."""

    def __init__(self, config: ProbeConfig, out: Path, stage: str, steps: int):
        self.config, self.out, self.stage, self.steps = config, out, stage, steps
        self.examples: list[Encoded] = []
        self.results: dict[str, dict] = {}

    def setup(self, trainer, pl_module, stage=None):
        if not self.examples:
            self.examples = read_examples(self.config, trainer.datamodule)

    @torch.no_grad()
    def accuracy(self, pl_module, sharding: Sharding, position_mode: str) -> tuple[float, int]:
        model, group = pl_module.model, pl_module.cp_group
        masked = pl_module.parallel.document_mask
        was_training = model.training
        model.eval()
        right = total = 0
        for enc in self.examples:
            batch, n = probe_batch(enc, 2 * sharding.cp_size * sharding.ulysses_size)
            local = {k: v.to(pl_module.device) for k, v in shard_batch(batch, sharding, position_mode).items()}
            logits = model(local["tokens"], local["positions"], segment_ids=local["segment_ids"] if masked else None)
            wrong = (logits.argmax(-1) != local["targets"]) & (local["answers"] > 0)  # (1, L)
            per_answer = torch.zeros(n + 1, dtype=torch.long, device=pl_module.device)
            per_answer.scatter_add_(0, local["answers"][0], wrong[0].long())
            if sharding.cp_size > 1:
                dist.all_reduce(per_answer, group=group)  # an answer's tokens lie on every rank
            right += int((per_answer[1:] == 0).sum())
            total += n
        model.train(was_training)
        return right / max(total, 1), total

    def _run(self, trainer, pl_module, when: str) -> None:
        dm = trainer.datamodule
        acc, n = self.accuracy(pl_module, dm.sharding, dm.config.positions)
        self.results[when] = {"accuracy": acc, "answers": n, "step": trainer.global_step}
        for logger in trainer.loggers:
            logger.log_metrics({f"probe/accuracy_{when}": acc}, step=trainer.global_step)
        if is_rank0():
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "probe.json").write_text(json.dumps(self.results, indent=2))
        say(f"stage {self.stage}: probe at its {when}: {acc:.1%} of {n} held-out answers right")

    def on_train_start(self, trainer, pl_module):
        if trainer.global_step == 0:
            self._run(trainer, pl_module, "start")
        else:  # resumed: the start was scored before the stop
            self.results = self._recorded()

    def on_train_end(self, trainer, pl_module):
        if trainer.global_step >= self.steps:
            self._run(trainer, pl_module, "end")

    def _recorded(self) -> dict[str, dict]:
        try:
            results = json.loads((self.out / "probe.json").read_text())
        except (OSError, ValueError):
            return {}
        return results if isinstance(results, dict) else {}

"""Skipped training examples, made visible: the data/skipped metric, each stage's <stage>/data.json, and
the lines of train.py's summary that read them back.

data/skipped counts the examples the stage's training stream has skipped (a line that is not JSON or is
longer than data.max_line_bytes, a parquet row or an example that does not encode: found when the source's
index is made, lwm.data.index) through the batch of each step, cumulative over the stage's epochs: every
epoch's order holds every example again, so one bad example counts once an epoch. It is the whole
stream's count, the same on every rank (each rank's plan of the epoch knows every example's place, though
the rank encodes only its own), so it is logged as it is, never summed over ranks; it is part of the data
state in the checkpoint, so a resumed stage goes on counting where it stopped. Held-out examples
(data.holdout) are not in it.

The report also counts the vision tokens the stage trained on (positions of a vision code or of the <eof> /
<eov> closing a frame, summed over the ranks' slices of each batch, so that media a source names and failed
to reach the codes shows as none); the count is kept in checkpoints, so a resumed stage adds to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from lwm.disk.writes import write_atomic
from lwm.ranks import is_rank0

REPORT = "data.json"  # in the stage's folder: {"skipped", "read", "reasons"}
SHOWN = 3  # reasons in the summary


class SkippedExamples(L.Callback):
    """Logs data/skipped each step (see the module's doc) and, at the stage's end (a stop included),
    writes <stage>/data.json on rank 0: the stream's counts of examples skipped and read, the first
    reasons ("file:line: why") and the vision tokens trained on. tp: the ranks that hold the same slice of a
    batch (tensor parallelism), counted once."""

    def __init__(self, stage_dir: Path, tp: int = 1):
        self.path, self.tp = Path(stage_dir) / REPORT, tp
        self.vision = None  # this rank's vision tokens since it started: a device tensor, read at the end only
        self.before = 0  # the count a resumed stage's checkpoint holds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.datamodule is not None:
            pl_module.log("data/skipped", float(trainer.datamodule.state.skipped), on_step=True, on_epoch=False)
        if isinstance(batch, dict) and "vision_mask" in batch:
            counted = batch["vision_mask"].sum()
            self.vision = counted if self.vision is None else self.vision + counted

    def _vision_tokens(self, trainer, pl_module) -> int:
        """The stage's vision tokens so far, over all ranks (a collective: every rank calls it)."""
        mine = self.vision if self.vision is not None else torch.zeros((), dtype=torch.long, device=pl_module.device)
        return self.before + int(trainer.strategy.reduce(mine.double(), reduce_op="sum").item()) // self.tp

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["vision_tokens"] = self._vision_tokens(trainer, pl_module)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.before = int(checkpoint.get("vision_tokens", 0))

    def on_train_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        vision = self._vision_tokens(trainer, pl_module)
        if is_rank0() and dm is not None and dm.stream is not None:
            report = {"skipped": dm.state.skipped, "read": dm.state.read, "reasons": dm.stream.errors}
            write_atomic(self.path, json.dumps({**report, "vision_tokens": vision}, indent=1) + "\n")


def summary(run_dir: Path, stages: list[str]) -> list[str]:
    """train.py's summary lines on skipped examples: one per stage that has a report, then its first
    reasons, one a line, when it skipped any."""
    out = []
    for stage in stages:
        path = Path(run_dir) / stage / REPORT
        if not path.is_file():
            continue
        report = json.loads(path.read_text())
        skipped, read, reasons = report["skipped"], report["read"], report["reasons"]
        vision = f"; {report['vision_tokens']:,} vision tokens trained on" if "vision_tokens" in report else ""
        if not skipped:
            out.append(f"  {'skipped':13s} {stage}: none of the {read} examples read{vision}")
            continue
        more = f", {len(reasons) - SHOWN} more in {path}" if len(reasons) > SHOWN else ""
        out.append(
            f"  {'skipped':13s} {stage}: {skipped} of the {read} examples read ({skipped / max(read, 1):.0%}; "
            f"every epoch reads them all){vision}; first reasons{more}:"
        )
        out += [f"  {'':13s}   {reason}" for reason in reasons[:SHOWN]]
    return out

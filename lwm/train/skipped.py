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
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from lwm.ranks import is_rank0
from lwm.writes import write_atomic

REPORT = "data.json"  # in the stage's folder: {"skipped", "read", "reasons"}
SHOWN = 3  # reasons in the summary


class SkippedExamples(L.Callback):
    """Logs data/skipped each step (see the module's doc) and, at the stage's end (a stop included),
    writes <stage>/data.json on rank 0: the stream's counts of examples skipped and read and the
    first reasons ("file:line: why")."""

    def __init__(self, stage_dir: Path):
        self.path = Path(stage_dir) / REPORT

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.datamodule is not None:
            pl_module.log("data/skipped", float(trainer.datamodule.state.skipped), on_step=True, on_epoch=False)

    def on_train_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        if is_rank0() and dm is not None and dm.stream is not None:
            report = {"skipped": dm.state.skipped, "read": dm.state.read, "reasons": dm.stream.errors}
            write_atomic(self.path, json.dumps(report, indent=1) + "\n")


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
        if not skipped:
            out.append(f"  {'skipped':13s} {stage}: none of the {read} examples read")
            continue
        more = f", {len(reasons) - SHOWN} more in {path}" if len(reasons) > SHOWN else ""
        out.append(
            f"  {'skipped':13s} {stage}: {skipped} of the {read} examples read ({skipped / max(read, 1):.0%}; "
            f"every epoch reads them all); first reasons{more}:"
        )
        out += [f"  {'':13s}   {reason}" for reason in reasons[:SHOWN]]
    return out

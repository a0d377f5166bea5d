"""Training callbacks: throughput (tokens/s, model TFLOP/s, MFU), peak memory per rank, the
stage's progress bar, and the metric history of a resumed stage."""

from __future__ import annotations

import csv
import io
import math
import resource
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lwm.disk.stage_folder import KEPT_METRICS
from lwm.disk.writes import write_atomic
from lwm.model import ModelConfig
from lwm.ranks import is_rank0

# each kind's mean cross entropy, logged every step: nan where the step has no target of the kind
KIND_LOSSES = ("train/text_loss", "train/vision_loss")


def present(metrics: dict) -> dict:
    """The metrics without a kind's loss the step has none of (nan): its cell stays empty."""
    return {k: v for k, v in metrics.items() if not (k in KIND_LOSSES and math.isnan(float(v)))}


class MetricsCSV(CSVLogger):
    """metrics.csv, a row every trainer.log_every steps; a kind's loss only where the step had it."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics(present(metrics), step)


class MetricsTensorBoard(TensorBoardLogger):
    """TensorBoard's scalars; a kind's loss only where the step had it."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics(present(metrics), step)


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x parameters (matmuls, forward + backward) plus causal attention."""
    params = config.num_params() - config.vocab_size * config.dim  # the embedding lookup is not a matmul
    attention = 6 * config.n_layers * config.dim * seq_len  # 12 L d S / 2 for the causal half
    return 6 * params + attention


class Throughput(L.Callback):
    """Logs perf/tokens_per_s over all ranks, perf/tflops_per_device and perf/mfu (when a peak is
    given) for each step, timed from its batch start to its batch end.

    Lightning's ThroughputMonitor does not serve: it logs other names (train/device/items_per_sec,
    train/device/flops_per_sec, train/device/mfu), and a rate only once `window_size` batches
    (default 100) are in, as a rolling mean, so a stage's first 99 steps log none; it times from the
    start of training, data loading included; and it takes the MFU peak from its own table of CUDA
    and TPU chips (none on CPU), not from trainer.peak_tflops."""

    def __init__(self, model_config: ModelConfig, seq_len: int, global_batch: int, peak_tflops: float = 0.0):
        self.tokens_per_step = seq_len * global_batch
        self.flops_per_step = flops_per_token(model_config, seq_len) * self.tokens_per_step
        self.peak_tflops = peak_tflops
        self._start = None

    @staticmethod
    def _now(pl_module) -> float:
        if pl_module.device.type == "cuda":  # the step's kernels, not just their launches
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        dt = self._now(pl_module) - self._start
        world = max(1, trainer.world_size)
        tflops = self.flops_per_step / dt / 1e12 / world  # per device
        metrics = {"perf/tokens_per_s": self.tokens_per_step / dt, "perf/tflops_per_device": tflops}
        if self.peak_tflops > 0:
            metrics["perf/mfu"] = tflops / self.peak_tflops
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)


class PeakMemory(L.Callback):
    """Logs this rank's peak memory: CUDA allocator peak on GPU, peak RSS on CPU (MiB)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        pl_module.log("perf/peak_mem_mib", peak, on_step=True, on_epoch=False)


class StageProgress(TQDMProgressBar):
    """One bar per stage that counts optimizer steps out of the stage's steps, so a resumed stage
    shows where it really is (the data stream is endless: Lightning alone shows no total)."""

    def __init__(self, stage: str, steps: int):
        super().__init__(leave=True)
        self.stage, self.steps = stage, steps

    @property
    def total_train_batches(self) -> int:
        return self.steps

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            desc=self.stage,
            total=self.steps,
            initial=self.trainer.global_step,
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    def on_train_epoch_start(self, trainer, *_) -> None:
        pass  # the stream is one endless epoch: the bar made in on_train_start runs to the stage's end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        if bar is not None and self._should_update(trainer.global_step, bar.total):
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # redraws the bar

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's version name, not a metric
        return metrics


class MetricHistory(L.Callback):
    """Puts a stopped stage's metric rows back into its CSV log on resume (Lightning's CSV logger
    starts the file anew). Rows from steps after the checkpoint are dropped: they are run again.

    A checkpoint written at a step's end comes before that step's row: Lightning logs it once the
    batch's hooks (the checkpoint's among them) are done, so a kill between the two would lose the row.
    The checkpoint carries the row it is about to be followed by (this callback's state), and a resume
    puts it back with the others."""

    def __init__(self, rows: list[dict[str, str]]):
        self.rows = rows
        self._trainer = None
        self._in_batch_end = False  # between this step's on_train_batch_end and the next batch

    def setup(self, trainer, pl_module, stage=None) -> None:
        self._trainer = trainer

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._in_batch_end = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._in_batch_end = True  # checkpoint callbacks run after the others: a save now precedes the row
        if trainer.global_step >= trainer.max_steps:  # Lightning logs a row when it stops: the last step has one
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self._in_batch_end = False  # the stop's checkpoint comes after every row

    def pending_row(self) -> dict[str, str] | None:
        """The row Lightning logs after the hooks of the step that just ended, if it logs one (its
        logger connector has no public API for it)."""
        trainer = self._trainer
        if trainer is None or not self._in_batch_end:
            return None
        connector = trainer._logger_connector
        if not connector.should_update_logs:
            return None
        values = {k: float(v) for k, v in present(connector.metrics["log"]).items()}
        if not values:
            return None
        step = trainer.fit_loop.epoch_loop._batches_that_stepped  # the step Lightning will log the row at
        return {"step": str(step), "epoch": str(trainer.current_epoch), **{k: repr(v) for k, v in values.items()}}

    def state_dict(self) -> dict:
        row = self.pending_row()
        return {"pending_row": row} if row else {}

    def load_state_dict(self, state_dict: dict) -> None:
        row = state_dict.get("pending_row")
        if not isinstance(row, dict) or not all(isinstance(v, str) and _is_number(v) for v in row.values()):
            return
        keys = {(r["step"], *sorted(k for k, v in r.items() if v != "")) for r in self.rows}
        if (row["step"], *sorted(row)) not in keys:  # metrics.csv has it when the run lived to write it
            self.rows = sorted([*self.rows, row], key=lambda r: int(r["step"]))

    @staticmethod
    def read(path) -> list[dict[str, str]]:
        """The rows of a metrics.csv; a last row without its newline (a killed writer's) is dropped."""
        if not path.is_file():
            return []
        text = path.read_text(errors="replace")
        if text and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        for number, row in enumerate(rows, start=2):
            bad = [k for k, v in row.items() if k is None or v is None or (v != "" and not _is_number(v))]
            if "step" not in row or bad:
                raise ValueError(
                    f"{path}, line {number}: not a metrics row (fields {bad or ['step']}); "
                    "the file is corrupted: delete it (the stage's logs restart) or restore it"
                )
        return rows

    @classmethod
    def resumed(cls, log_dir: Path, keep: bool) -> MetricHistory:
        """The rows a resumed stage has logged: metrics.csv's and those of the copy the previous
        resume kept (a run that fails before its first step, on a refused checkpoint, leaves
        metrics.csv rewritten without them). keep: write that copy (rank 0)."""
        current, kept = log_dir / "metrics.csv", log_dir / KEPT_METRICS
        rows: dict[tuple, dict[str, str]] = {}
        for row in cls.read(kept) + cls.read(current):  # metrics.csv's own rows win
            rows[(int(row["step"]), *sorted(k for k, v in row.items() if v != ""))] = row
        ordered = [rows[key] for key in sorted(rows, key=lambda key: key[0])]
        if keep and ordered:
            names = list(dict.fromkeys(k for row in ordered for k in row))
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, names, restval="")
            writer.writeheader()
            writer.writerows(ordered)
            write_atomic(kept, text.getvalue())
        return cls(ordered)

    def on_train_start(self, trainer, pl_module) -> None:
        csv_logger = next((lg for lg in trainer.loggers if isinstance(lg, CSVLogger)), None)
        if not self.rows or csv_logger is None or not is_rank0():
            return
        for row in self.rows:
            step = int(row["step"])
            if step < trainer.global_step:
                csv_logger.experiment.log_metrics(
                    {k: float(v) for k, v in row.items() if v != "" and k != "step"}, step
                )
        csv_logger.save()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def loss_summary(out: Path, stages: list[str]) -> list[str]:
    """The run's summary lines of each stage's last logged losses (its metrics.csv), the text and
    the vision loss apart where the step had them."""
    lines = []
    for stage in stages:
        rows = [r for r in MetricHistory.read(Path(out) / stage / "logs" / "metrics.csv") if r.get("train/loss")]
        if rows:
            row = rows[-1]
            kinds = [
                f"{kind} {float(row[f'train/{kind}_loss']):.4f}"
                for kind in ("text", "vision")
                if row.get(f"train/{kind}_loss")
            ]
            lines.append(
                f"  {'loss ' + stage:13s} step {row['step']}: {float(row['train/loss']):.4f}"
                + (f" ({', '.join(kinds)})" if kinds else "")
            )
    return lines

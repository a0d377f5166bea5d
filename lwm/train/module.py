"""The LightningModule: a thin wrapper around the plain Transformer.

It builds the model (on the meta device when a device mesh exists, then sharded and filled from
`init_state` or initialized) and AdamW with the stage's learning-rate schedule. Its training step is
lwm.core.step.train_step, the one the planner runs under fake tensors: Lightning's manual
optimization hands it the optimizer, the schedule and its manual_backward, and logs what it returns
(train/loss, train/text_loss and train/vision_loss, train/grad_norm before clipping, train/lr).
Lightning's checkpoints hold the optimizer and the schedule as they would under automatic optimization.

Every step is guarded: a loss or gradient norm that is not finite on any rank skips the step's update
(optim.max_nonfinite_steps of them) or stops the stage with NonFiniteStep on every rank at once,
before the optimizer step; weights that are not finite are never checkpointed nor kept as final.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import lightning as L
import torch
import torch.distributed as dist

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import (
    NonFiniteStep,
    activation_offload,
    batch_loss,
    build_optimizer,
    kind_losses,
    optimizer_on_host,
    train_step,
)
from lwm.model import ModelConfig, Transformer
from lwm.parallel import (
    ParallelDims,
    apply_activation_checkpointing,
    apply_activation_offload,
    apply_compile,
    build_meshes,
    build_parallel_model,
    compute_settings,
    peers,
    state_offload,
)
from lwm.ranks import is_rank0, say
from lwm.train import rng
from lwm.train.callbacks import KIND_LOSSES

Weights = dict[str, torch.Tensor]

_LOOP = "epoch_loop.automatic_optimization.optim_progress", "epoch_loop.manual_optimization.optim_step_progress"


def steps_from_automatic_optimization(checkpoint: dict) -> None:
    """A checkpoint written while LWMModule ran under Lightning's automatic optimization counts its
    optimizer steps (the trainer's global_step) in the automatic loop's progress; the manual loop
    counts them now. Carried over before Lightning restores its loops, so such a run resumes at its
    step instead of starting the stage's count again."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    automatic, manual = loop.get(_LOOP[0]), loop.get(_LOOP[1])
    if automatic is None or manual is None or manual["total"]["completed"]:
        return
    loop[_LOOP[1]] = copy.deepcopy(automatic["optimizer"]["step"])


class LWMModule(L.LightningModule):
    """init_state: the starting weights, or a function that reads them (called on global rank 0
    only: the other ranks receive rank 0's by broadcast); None: fresh weights from `seed`. dims: the
    stage's ParallelDims as the run made them (lwm.core.config.resolve_stage); None: from `parallel` and
    the device mesh's size."""

    def __init__(
        self,
        model_config: ModelConfig,
        stage: StageConfig,
        optim: OptimConfig,
        parallel: ParallelConfig,
        init_state: Weights | Callable[[], Weights] | None = None,
        seed: int = 0,
        dims: ParallelDims | None = None,
    ):
        super().__init__()
        self.automatic_optimization = False  # the step is lwm.core.step.train_step, as the planner runs it
        self.model_config = model_config  # with the stage's RoPE theta (lwm.core.config.stage_model_config)
        self.stage, self.optim, self.parallel = stage, optim, parallel
        self.init_state = init_state
        self.seed = seed  # of the initial weights when there is no init_state (trainer.seed)
        self.dims = dims
        self.model: Transformer | None = None
        self.cp_group = None
        self.nonfinite_steps = 0  # the stage's steps skipped so far (kept in its checkpoints)
        self._kinds: torch.Tensor | None = None  # the step's Losses.kinds summed over the ranks (the guard's)
        self._step_metrics = None  # train_step's of the step, logged in on_train_batch_end where a row is written

    def configure_model(self) -> None:
        if self.model is not None:
            return
        mesh = getattr(self, "_device_mesh", None)
        offload = activation_offload(self.parallel, self.device)  # from the accelerator, once
        if mesh is None:  # one process: a plain model
            self.model = self._fresh_model()
            state = self._read_init_state()
            if state is not None:
                self.model.load_state_dict(state)
            if self.parallel.activation_checkpointing:
                apply_activation_checkpointing(self.model, self.parallel.kept_blocks(self.model_config.n_layers))
            if offload is not None:
                apply_activation_offload(self.model, offload)
            if self.parallel.compile_blocks:
                apply_compile(self.model)
            return

        # Lightning's mesh only says how many ranks there are; lwm.parallel builds the run's own.
        dims = self.dims or self.parallel.dims(mesh.size(), self.stage.cp)
        if dims.world != mesh.size():
            raise ValueError(f"the stage's {dims.describe()} is for {dims.world} ranks, and the run has {mesh.size()}")
        peers.register()  # who the other ranks are, for the error of a rank that loses one
        meshes = build_meshes(dims, self.device.type, dist.get_rank())
        # from the accelerator, once; cuDNN's attention where the run names it
        settings = compute_settings(self.device, self.model_config.head_dim, self.parallel.attention_kernel)
        init = {}  # the other ranks receive rank 0's weights
        if is_rank0():  # the given weights, or those one process would start from
            init = self._read_init_state()
            init = init if init is not None else self._fresh_model().state_dict()
        self.cp_group = meshes.cp_group
        self.model = build_parallel_model(
            self.model_config,
            meshes,
            settings,
            self.device,
            init,
            self.parallel.layout,
            self.parallel.activation_checkpointing,
            offload,
            state_offload(self.parallel.param_offload, self.device),
            compile_blocks=self.parallel.compile_blocks,
            keep_attention=self.parallel.kept_blocks(self.model_config.n_layers),
        )

    def _read_init_state(self) -> Weights | None:
        return self.init_state() if callable(self.init_state) else self.init_state

    def _fresh_model(self) -> Transformer:
        torch.manual_seed(self.seed)
        return Transformer(self.model_config)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # Trainer(gradient_clip_val) and accumulate_grad_batches are refused by Lightning under manual
        # optimization: optim.grad_clip is the one clipping knob.
        metrics = train_step(
            self.model,
            batch,
            self.optimizers(),
            self.optim,
            self.cp_group,
            self.parallel.document_mask,
            scheduler=self.lr_schedulers(),
            backward=self.manual_backward,
            guard=self._guard,
        )
        self.log("train/loss", metrics.loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)  # the bar's
        self._step_metrics = metrics
        return metrics.loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """The step's other metrics, logged only where Lightning writes a row: each self.log costs most of a
        millisecond (the debug model's 300 steps at seq_len 64 took 10.9 s with them every step, 9.3 s so). Here, after every
        callback's on_train_batch_end (one may stop the stage: a row then too) and before Lightning writes,
        its own test says exactly whether this step's row is written. trainer.callback_metrics hold them as
        of the last such step."""
        connector = getattr(self.trainer, "_logger_connector", None)
        if not getattr(connector, "should_update_logs", True):
            return
        metrics = self._step_metrics
        # the same on every rank; every key in every row, since a key a step does not log keeps its last value
        # in Lightning's rows: nan for a kind without targets, a cell the loggers leave empty (callbacks.present)
        for key, value in zip(KIND_LOSSES, kind_losses(self._kinds)):
            self.log(key, math.nan if value is None else value)
        self.log("train/lr", metrics.lr)
        self.log("train/grad_norm", metrics.grad_norm)
        if self.optim.max_nonfinite_steps:
            self.log("train/nonfinite_steps", float(self.nonfinite_steps))

    def _guard(self, loss: torch.Tensor, norm: torch.Tensor, kinds: torch.Tensor) -> bool:
        """train_step's guard: whether the step's update is made. One all-reduce over the ranks
        carries each kind's loss sums and whether any rank saw a non-finite loss or gradient norm, so
        every rank decides alike. Under a GradScaler (16-mixed) non-finite gradients are the scaler's
        to skip; the loss is still watched."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        watched = [loss] if scaler is not None else [loss, norm]
        # judged on the device: the decision below is the step's one host sync
        bad = torch.stack([(~torch.isfinite(t)).any().to(kinds.device) for t in watched]).any()
        agreed = self.trainer.strategy.reduce(torch.cat([kinds.float(), bad.float().reshape(1)]), reduce_op="sum")
        self._kinds = agreed[:4]
        if not agreed[4].item():
            return True
        self.nonfinite_steps += 1
        step, tolerated = self.trainer.global_step, self.optim.max_nonfinite_steps
        what = f"stage {self.stage.name!r} step {step}: loss {loss.item():g}, gradient norm {norm.item():g}"
        if not bad:
            what += " here, not finite on another rank"
        if self.nonfinite_steps > tolerated:
            raise NonFiniteStep(
                self.stage.name,
                f"{what}: not finite; the stage stops before the step's update "
                f"({self.nonfinite_steps} such step(s), optim.max_nonfinite_steps={tolerated} skipped at most)",
            )
        say(
            f"warning: {what}: not finite, its update skipped ({self.nonfinite_steps} of optim.max_nonfinite_steps={tolerated})"
        )
        return scaler is not None  # the scaler skips a non-finite gradient's step itself

    def check_weights(self, when: str) -> None:
        """Raise NonFiniteStep on every rank if any rank's weights (its shards) hold a value that is
        not finite: such weights are never saved (an update that overflowed, though its loss and
        gradient norm were finite)."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.model.parameters()]
        finite = all(bool(torch.isfinite(p).all()) for p in local)
        if not self.trainer.strategy.reduce_boolean_decision(finite, all=True):
            raise NonFiniteStep(
                self.stage.name,
                f"stage {self.stage.name!r} step {self.trainer.global_step}: the weights hold values that are not "
                f"finite; {when} is not written",
            )

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # held-out sequences (data.holdout): mean over batches and ranks
        _, loss = batch_loss(self.model, batch, self.optim, self.cp_group, self.parallel.document_mask)
        batch_size = batch["tokens"].shape[0]  # not guessed from the batch, whose tensors differ in their first dim
        self.log(
            "val/loss", loss, on_step=False, on_epoch=True, sync_dist=self.trainer.world_size > 1, batch_size=batch_size
        )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.check_weights("the checkpoint")  # before anything is written: the last good one stays
        checkpoint["rng_states"] = rng.gather_states()
        checkpoint["nonfinite_steps"] = self.nonfinite_steps

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:  # the random state at the step it was saved
            rng.restore_own(checkpoint["rng_states"])
        self.nonfinite_steps = checkpoint.get("nonfinite_steps", 0)
        steps_from_automatic_optimization(checkpoint)

    def on_train_end(self) -> None:
        if self.trainer.global_step >= self.stage.steps:  # the stage's final weights come next (lwm.train.run)
            self.check_weights("final.safetensors")

    def configure_optimizers(self):
        on_host = optimizer_on_host(self.device, self.parallel.param_offload)
        optimizer, scheduler = build_optimizer(self.model, self.stage, self.optim, fused=on_host)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

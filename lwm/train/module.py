"""The LightningModule: a thin wrapper around the plain Transformer.

It builds the model (on the meta device when a device mesh exists, then sharded and filled from
`init_state` or initialized) and AdamW with the stage's learning-rate schedule. Its training step is
lwm.train.step.train_step, the one the planner runs under fake tensors: Lightning's manual
optimization hands it the optimizer, the schedule and its manual_backward, and logs what it returns
(train/loss, train/grad_norm before clipping, train/lr). Lightning's checkpoints hold the optimizer
and the schedule as they would under automatic optimization.
"""

from __future__ import annotations

import copy
from typing import Callable

import lightning as L
import torch
import torch.distributed as dist

from lwm.model import ModelConfig, Transformer
from lwm.parallel import (
    ActivationOffload,
    CudaCopyEngine,
    ParallelDims,
    SyncCopyEngine,
    apply_activation_checkpointing,
    apply_activation_offload,
    build_meshes,
    build_parallel_model,
    compute_settings,
    peers,
    state_offload,
)
from lwm.ranks import is_rank0
from lwm.train import rng
from lwm.train.config import OptimConfig, ParallelConfig, StageConfig
from lwm.train.step import batch_loss, build_optimizer, train_step

Weights = dict[str, torch.Tensor]

_LOOP = "epoch_loop.automatic_optimization.optim_progress", "epoch_loop.manual_optimization.optim_step_progress"


def activation_offload(parallel: ParallelConfig, device: torch.device) -> ActivationOffload | None:
    """The offload the run's device asks for (None: parallel.activation_offload is off): pinned host
    memory on a side stream on a GPU, plain copies into CPU tensors on a CPU."""
    if not parallel.activation_offload:
        return None
    engine = CudaCopyEngine(device) if device.type == "cuda" else SyncCopyEngine("cpu")
    return ActivationOffload(engine)


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
    stage's ParallelDims as the run made them (lwm.train.config.stage_dims); None: from `parallel` and
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
        self.automatic_optimization = False  # the step is lwm.train.step.train_step, as the planner runs it
        self.model_config = model_config  # with the stage's RoPE theta (lwm.train.config.stage_model_config)
        self.stage, self.optim, self.parallel = stage, optim, parallel
        self.init_state = init_state
        self.seed = seed  # of the initial weights when there is no init_state (trainer.seed)
        self.dims = dims
        self.model: Transformer | None = None
        self.cp_group = None

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
                apply_activation_checkpointing(self.model)
            if offload is not None:
                apply_activation_offload(self.model, offload)
            return

        # Lightning's mesh only says how many ranks there are; lwm.parallel builds the run's own.
        dims = self.dims or self.parallel.dims(mesh.size(), self.stage.cp)
        if dims.world != mesh.size():
            raise ValueError(f"the stage's {dims.describe()} is for {dims.world} ranks, and the run has {mesh.size()}")
        peers.register()  # who the other ranks are, for the error of a rank that loses one
        meshes = build_meshes(dims, self.device.type, dist.get_rank())
        settings = compute_settings(self.device, self.model_config.head_dim)  # from the accelerator, once
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
        )
        self.log("train/loss", metrics.loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)
        self.log("train/lr", metrics.lr)
        self.log("train/grad_norm", metrics.grad_norm)
        return metrics.loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # held-out sequences (data.holdout): mean over batches and ranks
        _, loss = batch_loss(self.model, batch, self.optim, self.cp_group, self.parallel.document_mask)
        self.log("val/loss", loss, on_step=False, on_epoch=True, sync_dist=self.trainer.world_size > 1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = rng.gather_states()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:  # the random state at the step it was saved
            rng.restore_own(checkpoint["rng_states"])
        steps_from_automatic_optimization(checkpoint)

    def configure_optimizers(self):
        optimizer, scheduler = build_optimizer(self.model, self.stage, self.optim)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

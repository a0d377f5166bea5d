"""The LightningModule: a thin wrapper around the plain Transformer.

It builds the model (on the meta device when a device mesh exists, then sharded and filled from
`init_state` or initialized), computes the weighted text/vision loss with the chunked loss path
(packed examples kept apart by their segment ids unless parallel.document_mask is off),
builds AdamW with the stage's learning-rate schedule, and clips the total gradient norm to
`optim.grad_clip` before each optimizer step (logged before clipping as train/grad_norm). Under
context parallelism every rank of a group holds a slice of the same sequence: counts are summed
over the group so that the ranks' losses add up to the loss of the whole sequence.

The loss, what backward runs on and the optimizer are plain functions (batch_loss,
training_objective, build_optimizer, clip_grad_norm): lwm/train/fake_step.py runs the same step
outside Lightning.
"""

from __future__ import annotations

from typing import Callable

import lightning as L
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.experimental import implicit_replication

from lwm.model import ModelConfig, Transformer, token_coefficients
from lwm.parallel import (
    apply_activation_checkpointing,
    build_meshes,
    build_parallel_model,
    compute_settings,
    global_group_counts,
    peers,
)
from lwm.ranks import is_rank0
from lwm.train import rng
from lwm.train.config import OptimConfig, ParallelConfig, StageConfig
from lwm.train.lr import lr_factor


def clip_grad_norm(parameters, max_norm: float | None) -> torch.Tensor:
    """Scale the gradients so that their total 2-norm is at most `max_norm` (None or <= 0: leave
    them); returns the norm before clipping, a plain tensor. Under FSDP2 the gradients are DTensor
    shards, on two meshes under tensor parallelism (the split weights' 2-D, the rest's 1-D): each
    mesh's norm is reduced over its ranks, so every rank has the whole model's norm and clips by the
    same factor."""
    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict = {}
    for p in params:
        by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    norms = [mesh_norm([p.grad for p in group], mesh) for mesh, group in by_mesh.items()]
    norm = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else (norms or [torch.tensor(0.0)])[0]
    if max_norm is not None and max_norm > 0:
        with implicit_replication():  # the plain norm scales the DTensor gradients
            for group in by_mesh.values():
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


def mesh_norm(grads: list, mesh) -> torch.Tensor:
    """The 2-norm of gradients on one mesh (None: plain tensors), whole on every rank of it: the
    local shards' squares summed, then all-reduced one mesh dimension at a time (torch's own norm
    of 2-D DTensors makes the same all-reduces at once and warns that it cannot fuse them)."""
    if mesh is None:
        return torch.nn.utils.get_total_norm(grads)
    local = torch.stack([torch.linalg.vector_norm(g.to_local(), dtype=torch.float32) for g in grads])
    squares = DTensor.from_local(local.square().sum(), mesh, [Partial()] * mesh.ndim, run_check=False)
    for dim in range(mesh.ndim):
        squares = squares.redistribute(placements=[Replicate() if i <= dim else Partial() for i in range(mesh.ndim)])
    return squares.to_local().sqrt()


def group_size(group) -> int:
    """Ranks in a context-parallel group; None (no group) is one."""
    return dist.get_world_size(group) if group is not None else 1


def batch_loss(model: Transformer, batch: dict, optim: OptimConfig, cp_group, document_mask: bool):
    """(this rank's share of the loss, differentiable; the whole sequence's loss, detached).
    Under context parallelism the text/vision counts are summed over the group first, so the
    ranks' shares add up to the loss of the whole sequence."""
    cp = group_size(cp_group)
    counts = global_group_counts(batch["loss_weight"], batch["vision_mask"], group=cp_group) if cp > 1 else None
    coeff = token_coefficients(
        batch["loss_weight"], batch["vision_mask"], optim.text_weight, optim.vision_weight, counts=counts
    )
    segments = batch.get("documents", batch["segment_ids"]) if document_mask else None  # host-read once per batch
    out = model(batch["tokens"], batch["positions"], targets=batch["targets"], loss_coeff=coeff, segment_ids=segments)
    loss = out.loss.detach().clone()
    if cp > 1:
        dist.all_reduce(loss, group=cp_group)  # the whole sequence's loss
    return out.loss, loss


def training_objective(model: Transformer, batch: dict, optim: OptimConfig, cp_group, document_mask: bool):
    """(what backward runs on, the whole sequence's loss). FSDP averages gradients over all
    dp x cp ranks; the cp ranks' losses are parts of one sum, so the share is scaled by cp: the
    result is the mean over data-parallel ranks of whole losses."""
    share, loss = batch_loss(model, batch, optim, cp_group, document_mask)
    return share * group_size(cp_group), loss


def build_optimizer(model: Transformer, stage: StageConfig, optim: OptimConfig):
    """AdamW (weight decay on matrices only) and its per-step LambdaLR schedule."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=stage.lr, betas=tuple(optim.betas))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(stage))


def lr_lambda(stage: StageConfig):
    """LambdaLR's factor for a stage: the cosine runs over the steps after warm-up."""

    def factor(step: int) -> float:
        decay = max(1, stage.steps - stage.warmup_steps)
        progress = min(1.0, max(0.0, (step - stage.warmup_steps) / decay))
        return lr_factor(
            step,
            warmup_steps=stage.warmup_steps,
            schedule=stage.schedule,
            min_lr_ratio=stage.min_lr_ratio,
            progress=progress,
        )

    return factor


Weights = dict[str, torch.Tensor]


class LWMModule(L.LightningModule):
    """init_state: the starting weights, or a function that reads them (called on global rank 0
    only: the other ranks receive rank 0's by broadcast); None: fresh weights from `seed`."""

    def __init__(
        self,
        model_config: ModelConfig,
        stage: StageConfig,
        optim: OptimConfig,
        parallel: ParallelConfig,
        init_state: Weights | Callable[[], Weights] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.model_config = model_config  # with the stage's RoPE theta (lwm.train.run.stage_model_config)
        self.stage, self.optim, self.parallel = stage, optim, parallel
        self.init_state = init_state
        self.seed = seed  # of the initial weights when there is no init_state (trainer.seed)
        self.model: Transformer | None = None
        self.cp_group = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        mesh = getattr(self, "_device_mesh", None)
        if mesh is None:  # one process: a plain model
            self.model = self._fresh_model()
            state = self._read_init_state()
            if state is not None:
                self.model.load_state_dict(state)
            if self.parallel.activation_checkpointing:
                apply_activation_checkpointing(self.model)
            return

        # Lightning's mesh only says how many ranks there are; lwm.parallel builds the run's own.
        dims = self.parallel.dims(mesh.size(), self.stage.cp)
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
        )

    def _read_init_state(self) -> Weights | None:
        return self.init_state() if callable(self.init_state) else self.init_state

    def _fresh_model(self) -> Transformer:
        torch.manual_seed(self.seed)
        return Transformer(self.model_config)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        objective, loss = training_objective(self.model, batch, self.optim, self.cp_group, self.parallel.document_mask)
        self.log("train/loss", loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0])
        return objective

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # held-out sequences (data.holdout): mean over batches and ranks
        _, loss = batch_loss(self.model, batch, self.optim, self.cp_group, self.parallel.document_mask)
        self.log("val/loss", loss, on_step=False, on_epoch=True, sync_dist=self.trainer.world_size > 1)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # Lightning calls this before every optimizer step, on every strategy; optim.grad_clip is
        # the one clipping knob, so Lightning's own Trainer(gradient_clip_val) is refused.
        if gradient_clip_val:
            raise ValueError(f"Trainer(gradient_clip_val={gradient_clip_val}) is not used: set optim.grad_clip")
        norm = clip_grad_norm(self.model.parameters(), self.optim.grad_clip)
        self.log("train/grad_norm", norm)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = rng.gather_states()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:  # the random state at the step it was saved
            rng.restore_own(checkpoint["rng_states"])

    def configure_optimizers(self):
        optimizer, scheduler = build_optimizer(self.model, self.stage, self.optim)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

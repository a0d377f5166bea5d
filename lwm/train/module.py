"""The LightningModule: a thin wrapper around the plain Transformer.

It builds the model (on the meta device when a device mesh exists, then sharded and filled from
`init_state` or initialized), computes the weighted text/vision loss with the chunked loss path
(packed examples kept apart by their segment ids unless parallel.document_mask is off),
builds AdamW with the stage's learning-rate schedule, and clips the total gradient norm to
`optim.grad_clip` before each optimizer step (logged before clipping as train/grad_norm). Under
context parallelism every rank of a group holds a slice of the same sequence: counts are summed
over the group so that the ranks' losses add up to the loss of the whole sequence.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lwm.model import ModelConfig, Transformer, token_coefficients
from lwm.parallel import global_group_counts
from lwm.train import rng
from lwm.train.config import OptimConfig, ParallelConfig, StageConfig
from lwm.train.lr import lr_factor
from lwm.train.sharding import apply_activation_checkpointing, shard_model


def clip_grad_norm(parameters, max_norm: float | None) -> torch.Tensor:
    """Scale the gradients so that their total 2-norm is at most `max_norm` (None or <= 0: leave
    them); returns the norm before clipping, a plain tensor. Under FSDP2 the gradients are DTensor
    shards: the norm comes out as a DTensor over the whole model, so every rank clips by the same
    factor, and full_tensor() gives its value."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if max_norm is not None and max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


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


class LWMModule(L.LightningModule):
    def __init__(
        self,
        model_config: ModelConfig,
        stage: StageConfig,
        optim: OptimConfig,
        parallel: ParallelConfig,
        init_state: dict[str, torch.Tensor] | None = None,
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
            if self.init_state is not None:
                self.model.load_state_dict(self.init_state)
            if self.parallel.activation_checkpointing:
                apply_activation_checkpointing(self.model)
            return

        init = self.init_state
        if init is None and dist.get_rank() == 0:  # rank 0 broadcasts the same weights one process starts from
            init = self._fresh_model().state_dict()
        self.model, self.cp_group = shard_model(self.model_config, mesh, self.parallel, init, self.device)

    def _fresh_model(self) -> Transformer:
        torch.manual_seed(self.seed)
        return Transformer(self.model_config)

    @property
    def cp_size(self) -> int:
        return dist.get_world_size(self.cp_group) if self.cp_group is not None else 1

    def _loss(self, batch: dict):
        """(this rank's share of the loss, differentiable; the whole sequence's loss, detached)."""
        counts = (
            global_group_counts(batch["loss_weight"], batch["vision_mask"], group=self.cp_group)
            if self.cp_size > 1
            else None
        )
        coeff = token_coefficients(
            batch["loss_weight"], batch["vision_mask"], self.optim.text_weight, self.optim.vision_weight, counts=counts
        )
        segments = batch["segment_ids"] if self.parallel.document_mask else None
        out = self.model(
            batch["tokens"], batch["positions"], targets=batch["targets"], loss_coeff=coeff, segment_ids=segments
        )
        loss = out.loss.detach().clone()
        if self.cp_size > 1:
            dist.all_reduce(loss, group=self.cp_group)  # the whole sequence's loss
        return out.loss, loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        share, loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0])
        # FSDP averages gradients over all dp x cp ranks; the cp ranks' losses are parts of one
        # sum, so scale by cp: the result is the mean over data-parallel ranks of whole losses.
        return share * self.cp_size

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        _, loss = self._loss(batch)  # held-out sequences (data.holdout): mean over batches and ranks
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
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=self.stage.lr, betas=tuple(self.optim.betas))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(self.stage))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

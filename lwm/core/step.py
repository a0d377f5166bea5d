"""The training step: one function, one home. Lightning's LWMModule.training_step, lwm-plan (under
fake tensors, lwm/plan/memory.py), the preflight, the fake step (lwm/plan/fake_step.py), the
planner's accuracy check and bench/train.py all run `train_step`, so what changes the step changes
what the plan measures.

    metrics = train_step(model, batch, optimizer, optim, cp_group, document_mask, scheduler)

One step: zero the gradients (set to None, before the forward: the previous step's gradients are not
held through it), the weighted text/vision loss with the chunked loss path (packed examples kept
apart by their segment ids when document_mask is on), backward, clipping of the total gradient norm
to `optim.grad_clip` (the norm before clipping is returned), the AdamW step, then the per-step
learning-rate schedule. Under context parallelism every rank of a group holds a slice of the same
sequence: counts are summed over the group so that the ranks' losses add up to the loss of the
whole sequence.

This module imports no Lightning: the planner runs the step without it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.experimental import implicit_replication

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.lr import lr_factor
from lwm.data.batches import LOSS_ROWS
from lwm.model import Transformer, token_coefficients
from lwm.parallel import ActivationOffload, CudaCopyEngine, SyncCopyEngine, global_group_counts


class StepMetrics(NamedTuple):
    loss: torch.Tensor  # the whole sequence's loss (the cp group's shares summed), detached
    grad_norm: torch.Tensor  # the total gradient norm before clipping
    lr: float  # the learning rate the optimizer step used (the first parameter group's)


class Losses(NamedTuple):
    loss: torch.Tensor  # the whole sequence's loss (the cp group's shares summed), detached
    # this rank's cross entropy summed over its text and vision targets, and their loss-mask weights:
    # (text sum, text weight, vision sum, vision weight), detached; summed over ranks they give each
    # kind's mean (kind_losses)
    kinds: torch.Tensor


class NonFiniteStep(RuntimeError):
    """A step whose loss or gradient norm is not finite, or weights that are not, past what
    optim.max_nonfinite_steps tolerates: the stage stops without saving them."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


def train_step(
    model,
    batch: dict,
    optimizer,
    optim: OptimConfig,
    cp_group,
    document_mask: bool,
    scheduler=None,
    backward: Callable[[torch.Tensor], None] | None = None,
    guard: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], bool] | None = None,
) -> StepMetrics:
    """One optimizer step: zero_grad, the objective, backward, clipping, AdamW, the schedule.
    `backward` runs backward on the objective (None: Tensor.backward; LWMModule passes Lightning's
    manual_backward, which adds the precision plugin's and the hooks' part); `scheduler`, when given,
    steps once after the optimizer. `guard`, when given, is called with the loss, the gradient norm
    and Losses.kinds before the optimizer step (it may raise NonFiniteStep); False skips the step's
    update: the gradients are dropped, so AdamW changes no weight and no state, and the step counts.
    The planner passes none (fake tensors have no values to judge)."""
    optimizer.zero_grad(set_to_none=True)
    objective, losses = training_objective(model, batch, optim, cp_group, document_mask)
    (backward or torch.Tensor.backward)(objective)
    norm = clip_grad_norm(model.parameters(), optim.grad_clip)
    lr = optimizer.param_groups[0]["lr"]
    if guard is not None and not guard(losses.loss, norm, losses.kinds):
        optimizer.zero_grad(set_to_none=True)  # AdamW leaves a parameter without a gradient as it is
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return StepMetrics(losses.loss, norm, lr)


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
    """(this rank's share of the loss, differentiable; the whole sequence's loss, detached)."""
    share, losses = batch_losses(model, batch, optim, cp_group, document_mask)
    return share, losses.loss


def batch_losses(model: Transformer, batch: dict, optim: OptimConfig, cp_group, document_mask: bool):
    """(this rank's share of the loss, differentiable; Losses). Under context parallelism the
    text/vision counts are summed over the group first, so the ranks' shares add up to the loss of
    the whole sequence."""
    cp = group_size(cp_group)
    counts = global_group_counts(batch["loss_weight"], batch["vision_mask"], group=cp_group) if cp > 1 else None
    coeff = token_coefficients(
        batch["loss_weight"], batch["vision_mask"], optim.text_weight, optim.vision_weight, counts=counts
    )
    segments = batch.get("documents", batch["segment_ids"]) if document_mask else None  # host-read once per batch
    out = model(
        batch["tokens"],
        batch["positions"],
        targets=batch["targets"],
        loss_coeff=coeff,
        segment_ids=segments,
        loss_rows=batch.get(LOSS_ROWS),  # the positions that carry loss weight, read on the host (None: all)
    )
    loss = out.loss.detach().clone()
    if cp > 1:
        dist.all_reduce(loss, group=cp_group)  # the whole sequence's loss
    weight, vision = batch["loss_weight"].float(), batch["vision_mask"].bool()
    text_w, vision_w = weight * ~vision, weight * vision  # (B, S) each
    ce = out.token_loss
    kinds = torch.stack([(text_w * ce).sum(), text_w.sum(), (vision_w * ce).sum(), vision_w.sum()])
    return out.loss, Losses(loss, kinds)


def kind_losses(kinds: torch.Tensor) -> tuple[float | None, float | None]:
    """The text and the vision cross entropy, each averaged over its targets, from Losses.kinds
    summed over the ranks; None for a kind the step has no target of."""
    text_sum, text, vision_sum, vision = kinds.tolist()
    return (text_sum / text if text > 0 else None), (vision_sum / vision if vision > 0 else None)


def training_objective(model: Transformer, batch: dict, optim: OptimConfig, cp_group, document_mask: bool):
    """(what backward runs on, Losses). FSDP averages gradients over all dp x cp ranks; the cp
    ranks' losses are parts of one sum, so the share is scaled by cp: the result is the mean over
    data-parallel ranks of whole losses."""
    share, losses = batch_losses(model, batch, optim, cp_group, document_mask)
    return share * group_size(cp_group), losses


def build_optimizer(model: Transformer, stage: StageConfig, optim: OptimConfig, fused: bool = False):
    """AdamW (weight decay on matrices only) and its per-step LambdaLR schedule. fused: torch's fused kernel,
    for parameters in host memory (optimizer_on_host), where torch's default is its per-parameter loop;
    otherwise torch's default (its multi-tensor kernel on a GPU)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=stage.lr, betas=tuple(optim.betas), fused=True if fused else None)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(stage))


def optimizer_on_host(device: torch.device, param_offload: bool) -> bool:
    """Whether AdamW updates tensors in host memory: a CPU run's, or a GPU run's under parameter offload (FSDP2
    keeps the shards and AdamW's state on the host). There the fused kernel is about 6x faster than torch's
    per-parameter loop (21M fp32 parameters, one thread: 0.021 s a step against 0.136 s)."""
    return device.type == "cpu" or param_offload


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


def activation_offload(parallel: ParallelConfig, device: torch.device) -> ActivationOffload | None:
    """The offload the run's device asks for (None: parallel.activation_offload is off): pinned host
    memory on a side stream on a GPU, plain copies into CPU tensors on a CPU."""
    if not parallel.activation_offload:
        return None
    engine = CudaCopyEngine(device) if device.type == "cuda" else SyncCopyEngine("cpu")
    return ActivationOffload(engine)

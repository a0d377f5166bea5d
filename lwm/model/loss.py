"""Cross entropy for long sequences without the full (B, S, V) logits.

The loss is sum_t coeff[t] * CE(hidden[t] @ W^T, target[t]). The coefficients carry the averaging:
`token_coefficients` turns a loss mask and a vision mask into per-token weights so that text and
vision positions are averaged separately and combined with their weights (docs/training.md: The model in Python). Because
the coefficients are computed before the loss, a context-parallel rank can use global counts and
the global loss is the sum of the ranks' losses.

`chunked_cross_entropy` computes logits a chunk of tokens at a time and, in the same pass, the
gradients of the hidden states and the output weight, so neither forward nor backward ever holds
more than one (chunk, V) block of logits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

IGNORE_INDEX = -100


class GroupCounts(NamedTuple):
    text: torch.Tensor  # sum of loss-mask weight over text positions (0-dim)
    vision: torch.Tensor  # same over vision positions


def group_counts(loss_mask: torch.Tensor, vision_mask: torch.Tensor) -> GroupCounts:
    """Loss-mask weight per group; all-reduce these across context-parallel ranks before use."""
    w = loss_mask.float()
    vis = vision_mask.bool()
    return GroupCounts(text=(w * ~vis).sum(), vision=(w * vis).sum())


def token_coefficients(
    loss_mask: torch.Tensor,
    vision_mask: torch.Tensor,
    text_weight: float = 0.5,
    vision_weight: float = 0.5,
    counts: GroupCounts | None = None,
) -> torch.Tensor:
    """Per-token loss coefficients, shape of loss_mask, fp32.

    loss = (text_weight * mean_text + vision_weight * mean_vision) / (sum of weights of the groups
    present): a batch with no vision targets gets its plain text mean, and vice versa. loss_mask may
    hold per-token weights (packing) instead of 0/1.
    """
    if loss_mask.shape != vision_mask.shape:
        raise ValueError(
            f"loss_mask {tuple(loss_mask.shape)} and vision_mask {tuple(vision_mask.shape)} differ in shape"
        )
    if text_weight < 0 or vision_weight < 0:
        raise ValueError(f"text_weight {text_weight} and vision_weight {vision_weight} must be >= 0")
    counts = group_counts(loss_mask, vision_mask) if counts is None else counts
    present_t = (counts.text > 0).float()
    present_v = (counts.vision > 0).float()
    total = (text_weight * present_t + vision_weight * present_v).clamp_min(1e-12)
    per_text = text_weight * present_t / (counts.text.clamp_min(1e-12) * total)
    per_vision = vision_weight * present_v / (counts.vision.clamp_min(1e-12) * total)
    return loss_mask.float() * torch.where(vision_mask.bool(), per_vision, per_text)


class LossOutput(NamedTuple):
    loss: torch.Tensor  # scalar, differentiable
    token_loss: torch.Tensor  # (B, S) per-token cross entropy, fp32, detached (for logging)


def chunk_softmax_(logits: torch.Tensor, targets: torch.Tensor, coeff: torch.Tensor, grad: bool) -> torch.Tensor:
    """One chunk's cross entropy from its logits (r, V) fp32, targets (r,) (IGNORE_INDEX: none) and coefficients
    (r,) fp32 -> the per-token loss (r,) fp32 (0 where ignored); with `grad` the logits are overwritten by the
    gradient of sum(coeff * loss) with respect to them, coeff * (softmax - onehot). In place, so that one
    buffer serves every chunk (compiled by torch.compile it ran slower on a CPU: docs/benchmarks.md)."""
    valid = targets != IGNORE_INDEX
    t = targets.clamp_min(0).unsqueeze(1)
    logits.sub_(logits.amax(dim=1, keepdim=True))  # stable softmax, in place
    target_logit = logits.gather(1, t).squeeze(1)
    sum_exp = logits.exp_().sum(dim=1)
    ce = (sum_exp.log() - target_logit) * valid
    if grad:  # d loss / d logits = c * (softmax - onehot), built in place
        g = logits.div_(sum_exp.unsqueeze(1))
        g.scatter_add_(1, t, -valid.float().unsqueeze(1))
        g.mul_((coeff * valid).unsqueeze(1))
    return ce


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, coeff, chunk_size):
        # hidden (N, D), weight (V, D), targets (N,), coeff (N,) fp32
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, dev = hidden.shape[0], hidden.device
        loss = torch.zeros((), dtype=torch.float32, device=dev)
        token_loss = torch.empty(n, dtype=torch.float32, device=dev)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        # One (chunk, V) fp32 buffer reused by every chunk: fresh allocations of this size cost
        # more than the arithmetic on CPU (page faults), and the peak stays one chunk.
        rows = min(chunk_size, n)
        buf = torch.empty(rows, weight.shape[0], dtype=torch.float32, device=dev)
        low = (
            None
            if weight.dtype == torch.float32
            else torch.empty(rows, weight.shape[0], dtype=weight.dtype, device=dev)
        )
        for s in range(0, n, chunk_size):
            h, t, c = hidden[s : s + chunk_size], targets[s : s + chunk_size], coeff[s : s + chunk_size]
            r = h.shape[0]
            logits = buf[:r]
            if low is None:
                torch.mm(h, weight.t(), out=logits)  # (r, D) @ (D, V) -> (r, V)
            else:
                logits.copy_(torch.mm(h, weight.t(), out=low[:r]))
            ce = chunk_softmax_(logits, t, c, need_h or need_w)  # logits: now their gradient, where one is taken
            token_loss[s : s + chunk_size] = ce
            loss += (c * ce).sum()
            if need_h or need_w:
                g = logits
                if low is not None:
                    g = low[:r].copy_(g)
                if need_h:
                    torch.mm(g, weight, out=grad_h[s : s + chunk_size])  # (r, V) @ (V, D) -> (r, D)
                if need_w:
                    if low is None:
                        grad_w.addmm_(g.t(), h)  # (V, r) @ (r, D)
                    else:
                        grad_w += torch.mm(g.t(), h).float()  # low-precision product, fp32 accumulation
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(token_loss)
        return loss, token_loss

    @staticmethod
    def backward(ctx, grad_loss, _grad_token_loss):
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is not None:
            grad_h = grad_h * grad_loss.to(grad_h.dtype)
        if grad_w is not None:
            grad_w = (grad_w * grad_loss).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    coeff: torch.Tensor | None = None,
    chunk_size: int = 1024,
    rows: torch.Tensor | None = None,
) -> LossOutput:
    """sum_t coeff[t] * CE(hidden[t] @ weight^T, targets[t]) without materializing all logits.

    hidden (B, S, D), weight (V, D), targets (B, S) long (IGNORE_INDEX = -100 carries no loss),
    coeff (B, S) float; by default the plain mean over the targets that are not ignored.
    rows: (n,) long, the flat positions (of B * S, ascending) that carry loss, the only ones whose
    logits are computed (the others' coefficients must be 0; their token_loss is 0); None: every
    position. Data that weights only answers spends most of a small model's step in the head
    otherwise. The batch gives them, read on the host, so the step never waits to count them.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets {tuple(targets.shape)} must match hidden {tuple(hidden.shape)} without its last dim")
    if coeff is None:
        valid = (targets != IGNORE_INDEX).float()
        coeff = valid / valid.sum().clamp_min(1.0)
    elif coeff.shape != targets.shape:
        raise ValueError(f"coeff {tuple(coeff.shape)} must have the shape of targets {tuple(targets.shape)}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    B, S, D = hidden.shape
    hidden, targets, coeff = hidden.reshape(B * S, D), targets.reshape(-1), coeff.reshape(-1).float()
    if rows is None or rows.shape == (B * S,):  # every position: no copies
        loss, token_loss = _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, coeff, chunk_size)
        return LossOutput(loss, token_loss.view(B, S))
    if rows.dim() != 1 or rows.numel() > B * S:
        raise ValueError(f"rows must be (n,) with n <= {B * S} positions, got {tuple(rows.shape)}")
    # (B*S, D) -> (n, D): only the positions that carry loss, in order
    h, t, c = (x.index_select(0, rows) for x in (hidden, targets, coeff))
    loss, picked = _ChunkedLinearCrossEntropy.apply(h, weight, t, c, chunk_size)
    token_loss = torch.zeros(B * S, dtype=torch.float32, device=hidden.device).index_copy_(0, rows, picked)
    return LossOutput(loss, token_loss.view(B, S))

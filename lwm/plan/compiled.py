"""What compiled blocks (parallel.compile_blocks) save in HBM traffic, measured by inductor itself.

lwm.parallel.apply_compile compiles each block's norms, SwiGLU and RoPE. The planner's fake step runs
them eager, and charges every byte an elementwise op writes twice (written once, read once:
lwm.plan.time). Here each of those regions runs at the model's widths in bf16 (the GPU's compute
dtype) for TOKENS tokens, twice: eager, its writes counted as the fake step counts them (fake
tensors, the GPU's fused norm kernel), and compiled by torch.compile, its kernels' reads and writes
as inductor's scheduler sizes them (torch._inductor.metrics, what `TORCH_LOGS=inductor_metrics`
prints), matmuls left out as the planner times them by their arithmetic. The difference, per token
and block, forward and backward apart, is what the planner takes off a compiled run's HBM part.

The regions are what dynamo captures from the run's modules: with the fused norm kernel a norm's
graph is only its weight's multiply (aten's fused norm runs outside the graph, unchanged); the MLP's
matmuls are inductor's external kernels and its SiLU and product one fused kernel; RoPE's fp32
rotation, its concatenation and its cast one kernel. Compiling is on the CPU (inductor's C++ backend)
with its caches off, since a cached graph is not measured again, and with a concatenation of computed
halves lowered as one pointwise kernel, as inductor lowers it for a GPU (torch/_inductor/lowering.py's
cat: a CPU always writes the halves into a buffer first). Per-call constants (the norm weight's read and
gradient) are under 1% at the defaults' widths.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lwm.model import ModelConfig
from lwm.model.rope import apply_rope, rope_angles
from lwm.model.transformer import FeedForward
from lwm.plan.tracker import WorkCounter

DTYPE = torch.bfloat16  # what a GPU computes in (lwm.parallel.compute_settings)
TOKENS = 64  # per measured call: the traffic is per token; fewer tokens compile and run faster
# Scheduler nodes that are not inductor's fused elementwise kernels: matmuls (timed by their arithmetic)
# and nodes that move nothing.
_NOT_FUSED = ("ExternKernelSchedulerNode", "NopKernelSchedulerNode")


@dataclass(frozen=True)
class CompiledSaving:
    """HBM bytes per token and block that compiling a region saves: region -> (one forward, the backward)."""

    regions: dict[str, tuple[float, float]]

    def per_token(self, passes: dict[str, int]) -> float:
        """Bytes saved per token and block when each region's forward runs passes[region] times (recompute
        and the tilings run it again) and its backward once."""
        return sum(forward * passes[name] + backward for name, (forward, backward) in self.regions.items())


def compiled_saving(config: ModelConfig, tp: int = 1) -> CompiledSaving:
    """The saving for `config`'s blocks at tensor-parallel degree tp (its MLP and heads split tp ways)."""
    return _measure(config.dim, config.ffn_dim // tp, config.n_heads // tp, config.n_kv_heads // tp, config.head_dim)


@functools.lru_cache(maxsize=8)
def _measure(dim: int, ffn: int, heads: int, kv_heads: int, head_dim: int) -> CompiledSaving:
    with torch.random.fork_rng(devices=[]):  # the weights' and inputs' draws leave the caller's generator as it was
        torch.manual_seed(0)
        mlp = FeedForward(dim, ffn).to(DTYPE)
        weight = torch.ones(dim, dtype=DTYPE, requires_grad=True)
        cos, sin = rope_angles(torch.arange(TOKENS), head_dim, 10000.0)  # (S, D/2) fp32, made once a step

        def hidden() -> tuple[torch.Tensor]:
            return (torch.randn(1, TOKENS, dim, dtype=DTYPE, requires_grad=True),)  # (B, S, dim)

        def heads_of(h: int):  # (B, S, H, D) -> (B, H, S, D), as Attention's projection views it
            return lambda: (torch.randn(1, TOKENS, h, head_dim, dtype=DTYPE).transpose(1, 2).requires_grad_(),)

        def norm(y: torch.Tensor) -> tuple[torch.Tensor]:  # what dynamo keeps of RMSNorm with the fused kernel
            return (weight * y,)

        def rope(x: torch.Tensor) -> tuple[torch.Tensor]:  # one compiled call for q, one for k, as Attention's
            return (apply_rope(x, cos, sin),)

        norms = _saving(norm, hidden, 2)  # two a block
        q = _saving(rope, heads_of(heads))
        k = q if kv_heads == heads else _saving(rope, heads_of(kv_heads))
        swiglu = _saving(lambda x: (mlp(x),), hidden)
    return CompiledSaving({"norms": norms, "mlp": swiglu, "rope": (q[0] + k[0], q[1] + k[1])})


def _saving(fn, make_inputs, count: int = 1) -> tuple[float, float]:
    """(forward, backward) bytes a token that compiling fn saves, for `count` calls of it."""
    eager, compiled = eager_bytes(fn, make_inputs), compiled_bytes(fn, make_inputs)
    return tuple(count * (e - c) / TOKENS for e, c in zip(eager, compiled))


def eager_bytes(fn, make_inputs) -> tuple[float, float]:
    """(forward, backward) bytes as the fake step charges them: twice what each op writes."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = make_inputs()
        with WorkCounter() as counter:
            outs = fn(*inputs)
        forward = counter.written
        with WorkCounter() as counter:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return 2 * forward, 2 * counter.written


def compiled_bytes(fn, make_inputs) -> tuple[float, float]:
    """(forward, backward) bytes read and written by the fused kernels inductor makes of fn."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor import metrics

    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False)
    inputs = make_inputs()
    uncached = inductor_config.patch(fx_graph_cache=False, force_pointwise_cat=True)
    with _inductor_metrics(), uncached, functorch_config.patch(enable_autograd_cache=False):
        metrics.reset()
        outs = compiled(*inputs)
        forward = _fused_bytes(metrics.nodes_num_elem)
        metrics.reset()
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        backward = _fused_bytes(metrics.nodes_num_elem)
    torch._dynamo.reset()
    return forward, backward


def _fused_bytes(nodes) -> int:
    # nodes_num_elem holds (node, its bytes read and written // 4) for every kernel of the graphs compiled.
    return sum(4 * n for node, n in nodes if type(node).__name__ not in _NOT_FUSED)


@contextlib.contextmanager
def _inductor_metrics():
    """Inductor counts its kernels' bytes only when its metrics log is enabled at INFO: enabled, printing nothing."""
    log = torch._logging.getArtifactLogger("torch._inductor.compile_fx", "inductor_metrics")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.NullHandler()
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate

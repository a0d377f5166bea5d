"""parallel.compile_blocks (lwm.parallel.apply_compile): each block's norms, SwiGLU and RoPE compiled by
torch.compile (inductor on CPU), the attention eager. The reference is the same model eager: its loss and
every gradient, fp32, over the ring at one rank with packed documents and activation checkpointing.
Tolerance: inductor fuses the norms' and SwiGLU's elementwise work and may reorder their sums, so rtol
1e-5 (fp32's rounding a few times over), never bitwise."""

from __future__ import annotations

import torch
from document_refs import packings
from torch._dynamo.utils import counters

from lwm.model import ModelConfig, Transformer
from lwm.model.documents import Documents
from lwm.parallel import apply_activation_checkpointing, apply_compile, apply_context_parallel


def _model(compiled: bool) -> Transformer:
    torch.manual_seed(0)
    model = apply_context_parallel(Transformer(ModelConfig.from_preset("debug")))
    apply_activation_checkpointing(model)
    return apply_compile(model) if compiled else model


def _step(model: Transformer, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (2, 65))
    seg = Documents(packings(2, 64, seed=seed), 64)
    model.zero_grad(set_to_none=True)
    out = model(tokens[:, :-1], targets=tokens[:, 1:], loss_coeff=torch.full((2, 64), 1 / 128), segment_ids=seg)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_blocks_equal_eager_and_compile_once():
    eager, compiled = _model(False), _model(True)
    counters.clear()
    for seed in (1, 2):  # a second batch, other documents: no new graph
        loss, grads = _step(eager, seed)
        got_loss, got = _step(compiled, seed)
        torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
        graphs = counters["stats"]["unique_graphs"]
        if seed == 1:
            first = graphs
    assert first > 0 and graphs == first, (first, graphs)  # compiled the first time, reused after


def test_what_is_compiled_is_the_work_around_the_attention():
    model = _model(True)
    for layer in model.layers:
        block = layer._checkpoint_wrapped_module
        assert all(m._compiled_call_impl is not None for m in (block.attn_norm, block.mlp_norm, block.mlp))
        assert (
            block.attn._compiled_call_impl is None
            and block.attn.rope is model.layers[0]._checkpoint_wrapped_module.attn.rope
        )


def test_the_runs_setting_compiles_the_modules_blocks():
    """parallel.compile_blocks reaches the model train.py's module builds (one process here)."""
    from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
    from lwm.train.module import LWMModule

    stage = StageConfig("a", 64, rope_theta=1e4, steps=1, lr=1e-3)
    built = {}
    for on in (False, True):
        module = LWMModule(ModelConfig.from_preset("debug"), stage, OptimConfig(), ParallelConfig(compile_blocks=on))
        module.configure_model()
        built[on] = [block.mlp._compiled_call_impl is not None for block in module.model.layers]
    assert built == {False: [False, False], True: [True, True]}

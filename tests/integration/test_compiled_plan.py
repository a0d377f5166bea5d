"""lwm-plan with parallel.compile_blocks: the HBM part less what inductor's fused kernels save in each
block's norms, SwiGLU and RoPE (lwm.plan.compiled), measured by compiling them on the CPU."""

from __future__ import annotations

import pytest
import torch

from lwm.model import ModelConfig
from lwm.model.rope import apply_rope, rope_angles
from lwm.plan import command
from lwm.plan.compiled import TOKENS, compiled_bytes, compiled_saving, eager_bytes
from lwm.plan.config import PlanConfig
from lwm.plan.time import region_passes

HEADS, HEAD_DIM = 4, 16


def _rope_inputs():
    cos, sin = rope_angles(torch.arange(TOKENS), HEAD_DIM, 10000.0)  # (S, D/2) fp32
    q = torch.randn(1, TOKENS, HEADS, HEAD_DIM, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    return (q, cos, sin)


def _rope(q, cos, sin):
    return (apply_rope(q, cos, sin),)


def test_compiled_rope_moves_its_input_its_output_and_the_angles_once():
    """Inductor makes RoPE one kernel: it reads q (bf16) and cos and sin (fp32, (S, D/2) each) and writes the
    rotated q (bf16), what a fused kernel must move and no more; its backward (a rotation by -angle) the same.
    Eager, each op's fp32 result is written and read: q's float copy, six half-width products and sums, the
    concatenation and the cast, 22 bytes a bf16 element, charged twice."""
    elements = TOKENS * HEADS * HEAD_DIM
    angles = 2 * TOKENS * HEAD_DIM // 2 * 4
    forward, backward = compiled_bytes(_rope, _rope_inputs)
    assert forward == 2 * elements + 2 * elements + angles
    assert backward == forward
    eager_forward, _ = eager_bytes(_rope, _rope_inputs)
    assert eager_forward == 2 * 22 * elements


def _plan(tmp_path, *overrides: str) -> dict:
    config = PlanConfig(
        overrides=["model=debug", "parallel.activation_checkpointing=true", *overrides], seq_len=4096, cp=2, dp=1,
        out=str(tmp_path),
    )  # fmt: skip
    return command.run(config)["stages"][0]


def test_the_plan_takes_the_fused_kernels_saving_off_hbm_only(tmp_path):
    """Under head groups RoPE runs a third time (the group's recompute), the norms and the MLP twice."""
    tiling = ["model.attn_head_groups=2"]
    eager = _plan(tmp_path / "eager", *tiling)
    compiled = _plan(tmp_path / "compiled", "parallel.compile_blocks=true", *tiling)
    config = ModelConfig.from_preset("debug")
    config.attn_head_groups = 2
    saving = compiled_saving(config)
    assert all(f > 0 and b > 0 for name, (f, b) in saving.regions.items() if name != "norms"), saving
    passes = region_passes(config, 4096 // 2, checkpointing=True)
    assert passes == {"norms": 2, "mlp": 2, "rope": 3}
    saved = saving.per_token(passes) * (4096 // 2) * config.n_layers
    assert compiled["work"]["compiled_saved_bytes"] == pytest.approx(saved)
    assert compiled["work"]["hbm_bytes"] == pytest.approx(eager["work"]["hbm_bytes"] - saved)
    for key in ("matmul_flops", "attention_flops", "ring_bytes", "fsdp_bytes"):
        assert compiled["work"][key] == eager["work"][key]
    assert compiled["time"]["parts"]["hbm"] < eager["time"]["parts"]["hbm"]
    assert compiled["time"]["seconds"] < eager["time"]["seconds"]

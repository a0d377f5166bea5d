"""lwm-plan with parallel.keep_attention: the step's time has no attention forward in the recompute (7
attention products a layer, not 9), and its memory holds each block's kept output, measured on the real
step under fake tensors (the ring records them as it does on a device)."""

from __future__ import annotations

import pytest

from lwm.plan import command
from lwm.plan.config import PlanConfig


def _plan(tmp_path, *overrides: str) -> dict:
    config = PlanConfig(
        overrides=["model=debug", "parallel.activation_checkpointing=true", *overrides],
        seq_len=4096,
        cp=2,
        dp=1,
        out=str(tmp_path),
    )
    return command.run(config)["stages"][0]


def test_the_plan_charges_kept_attention_once_and_holds_its_outputs(tmp_path):
    full, kept = _plan(tmp_path / "full"), _plan(tmp_path / "kept", "parallel.keep_attention=true")
    assert kept["work"]["attention_flops"] == pytest.approx(full["work"]["attention_flops"] * 7 / 9)
    assert kept["work"]["matmul_flops"] == full["work"]["matmul_flops"]  # projections and MLP still recomputed
    assert kept["time"]["seconds"] < full["time"]["seconds"]
    # a block's kept output is (1, S / cp, dim) fp32 and its logsumexp (1, heads, S / cp) fp32: at the peak (in
    # the backward) at least one block's, at most all 2 blocks'
    block = (4096 // 2) * 64 * 4 + 4 * (4096 // 2) * 4
    assert block <= kept["peak_bytes"] - full["peak_bytes"] <= 2 * block, (kept["peak_bytes"], full["peak_bytes"])

"""lwm-plan with parallel.keep_attention: the step's time has no attention forward in the recompute (7
attention products a layer, not 9), and its memory holds each block's kept output, measured on the real
step under fake tensors (the ring records them as it does on a device)."""

from __future__ import annotations

import dataclasses

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


@pytest.mark.parametrize(
    "overrides, ratio",
    [
        (["parallel.keep_attention_blocks=1"], 8 / 9),  # one of the 2 blocks: 7 products, the other 9
        (["model.attn_head_groups=2"], 7 / 11),  # head groups: their own recompute is spared too
        (["model.attn_head_groups=2", "parallel.keep_attention_blocks=1"], 9 / 11),
    ],
)
def test_the_plan_charges_the_blocks_that_keep(tmp_path, overrides, ratio):
    groups = [o for o in overrides if o.startswith("model.")]
    full = _plan(tmp_path / "full", *groups)
    kept = _plan(tmp_path / "kept", "parallel.keep_attention=true", *overrides)
    assert kept["work"]["attention_flops"] == pytest.approx(full["work"]["attention_flops"] * ratio)


def test_where_kept_outputs_overfill_the_host_the_plan_names_the_blocks_that_fit(tmp_path, monkeypatch, capsys):
    """A node whose host memory holds one block's kept output and not two: the plan says the host does not
    fit and names parallel.keep_attention_blocks=1, planned (the host peak of that plan itself)."""
    offload = ["parallel.activation_offload=true", "parallel.keep_attention=true"]
    both, one = (
        _plan(tmp_path / "both", *offload),
        _plan(tmp_path / "one", *offload, "parallel.keep_attention_blocks=1"),
    )
    assert both["host_peak_bytes"] > one["host_peak_bytes"]
    between = (both["host_peak_bytes"] + one["host_peak_bytes"]) / 2
    real = command.parse_device

    def small_host(text):  # 2 ranks offloading `between` bytes each fill it, margins left out
        return dataclasses.replace(real(text), host_reserved_gib=0.0, fragmentation=0.0, host_gib=2 * between / 2**30)

    monkeypatch.setattr(command, "parse_device", small_host)
    capsys.readouterr()
    row = _plan(tmp_path / "small", *offload)
    assert row["verdict"] == "host memory does not fit"
    advice = row["advice"]
    assert advice["overrides"] == ["parallel.keep_attention_blocks=1"], advice
    assert advice["host_peak_bytes"] == one["host_peak_bytes"]
    assert advice["time"]["seconds"] == pytest.approx(one["time"]["seconds"])
    assert "fits with parallel.keep_attention_blocks=1" in capsys.readouterr().out

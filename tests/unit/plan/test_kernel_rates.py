"""The planner charges the attention at the rate of the kernel the run asks for (parallel.attention_kernel),
as published (lwm/plan/devices.py; sources in docs/planning.md), and refuses one the GPU cannot run."""

from __future__ import annotations

import json

import pytest

from lwm.plan import command
from lwm.plan.config import PlanConfig
from lwm.plan.devices import DEVICES, parse_device
from lwm.plan.memory import Mesh
from lwm.plan.time import Work, step_time

H100, A100, B200 = DEVICES["h100-80g"], DEVICES["a100-80g"], DEVICES["b200-192g"]


def weighted(forward: float, backward: float, peak: float) -> float:
    """A flash kernel's share of the peak over a training step: 2 products forward, 5 backward."""
    return (2 * forward + 5 * backward) / 7 / peak


def test_the_rates_are_the_published_figures_weighted():
    # FlashAttention-3's paper, H100 SXM5, causal, head dim 128, 16K tokens: FA2 335 / 322, FA3 616 / 561
    assert H100.kernel_rates["fa2"] == pytest.approx(weighted(335, 322, 989), abs=0.005)
    assert H100.kernel_rates["fa3"] == pytest.approx(weighted(616, 561, 989), abs=0.005)
    # the same figures' cuDNN bars: 539 / 516
    assert H100.kernel_rates["cudnn"] == pytest.approx(weighted(539, 516, 989), abs=0.005)
    # FlashAttention-4's paper, B200: 1613 forward; its backward unpublished, charged at FA2's rate there
    assert B200.kernel_rates["fa4"] == pytest.approx(weighted(1613, 0.33 * 2250, 2250), abs=0.005)


@pytest.mark.parametrize(
    ("device", "setting", "kernel", "rate"),
    [
        (H100, "auto", "fa2", 0.33),  # what every install has; a run's auto may find a faster one
        (H100, "fa3", "fa3", 0.583),
        (H100, "fa4", "fa4", 0.583),
        (DEVICES["h200-141g"], "fa3", "fa3", 0.583),
        (A100, "fa2", "fa2", 0.5),
        (B200, "fa4", "fa4", 0.44),
        (H100, "cudnn", "cudnn", 0.528),
    ],
)
def test_each_kernel_is_planned_at_its_rate(device, setting, kernel, rate):
    planned = device.with_kernel(setting)
    assert (planned.kernel, planned.attention_efficiency) == (kernel, rate)


@pytest.mark.parametrize(
    ("device", "setting", "message"),
    [
        (A100, "fa3", r"FlashAttention-3 needs compute capability 9.0; this GPU's is 8.0"),
        (A100, "fa4", r"FlashAttention-4 needs compute capability 9.0 or 10.0; this GPU's is 8.0"),
        (B200, "fa3", r"FlashAttention-3 needs compute capability 9.0; this GPU's is 10.0"),
        (parse_device("custom:80,989,450,50"), "fa3", r"a custom device has no compute capability; plan fa2"),
        (H100, "fa5", r"parallel.attention_kernel must be one of"),
        (A100, "cudnn", r"no published cuDNN attention rate on a100-80g"),  # it runs there; no figure to plan
    ],
)
def test_a_kernel_the_gpu_cannot_run_is_refused(device, setting, message):
    with pytest.raises(ValueError, match=message):
        device.with_kernel(setting)


def test_only_the_attention_time_changes_with_the_kernel():
    work = Work(
        matmul_flops=4e15, attention_flops=6e15, model_flops=9e15, hbm_bytes=1e12, ring_bytes=1e9, fsdp_bytes=1e9
    )
    mesh = Mesh(1048576, 8, 1)
    fa2, fa3 = (step_time(work, mesh, H100.with_kernel(k), 8) for k in ("fa2", "fa3"))
    assert fa3.parts["attention"] == pytest.approx(fa2.parts["attention"] * 0.33 / 0.583)
    assert {k: v for k, v in fa3.parts.items() if k != "attention"} == {
        k: v for k, v in fa2.parts.items() if k != "attention"
    }
    assert fa3.seconds < fa2.seconds and fa3.mfu > fa2.mfu


def test_lwm_plan_names_the_kernel_it_planned(tmp_path, capsys):
    config = PlanConfig(
        overrides=["model=debug", "parallel.attention_kernel=fa3"], seq_len=2048, cp=1, dp=1, out=str(tmp_path)
    )
    plan = command.run(config)
    assert plan["device"]["kernel"] == "fa3" and plan["device"]["attention_efficiency"] == 0.583
    assert json.loads((tmp_path / "plan.json").read_text())["device"]["kernel"] == "fa3"
    assert "h100-80g: attention by FlashAttention-3 at 58% of the peak" in capsys.readouterr().out

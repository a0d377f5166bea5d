"""lwm-plan's bounds (lwm/plan/bounds.py): a size the planner cannot plan in this machine's time
and memory is refused with exit 2 naming the limit and the option, before any fake work; GPU specs are
finite and positive; the documented largest plans stay within the bounds; --longest stops at them."""

from __future__ import annotations

import dataclasses

import pytest

from lwm.plan import bounds, command
from lwm.plan.config import PlanConfig, compose_run
from lwm.plan.devices import parse_device
from lwm.plan.fake_step import FakeStepConfig
from lwm.plan.memory import StepMemory

SMALL = ["model=debug", "schedule=debug"]


@pytest.mark.parametrize(
    "args, named",
    [
        (["--seq-len", "100000000", "--cp", "1", "--dp", "1"], "more than the 33554432"),
        (["--seq-len", str(10**12)], "more than the 33554432"),
        (["--infer", str(10**15)], "--infer 1000000000000000"),
        (["--batch", str(10**12)], "--batch"),
        (["--dp", str(10**12)], "more than the 16384"),
        (["--seq-len", "1048576", "--cp", "4096", "--dp", "1"], "ring steps"),
        (["--seq-len", "4194304", "--cp", "1", "--dp", "1"], "model.loss_chunk_size 256"),
        (["model.mlp_chunk_size=8", "--seq-len", "1048576", "--cp", "4", "--dp", "1"], "model.mlp_chunk_size 8"),
        (["--infer", "1048576", "--prefill-chunk", "1", "--cp", "1", "--dp", "1"], "--prefill-chunk"),
    ],
)
def test_sizes_beyond_the_planners_bounds_are_refused_before_fake_work(monkeypatch, capsys, tmp_path, args, named):
    monkeypatch.setattr(command, "plan_step", lambda *a, **k: pytest.fail("planned a step beyond the bounds"))
    monkeypatch.setattr(command, "plan_inference", lambda *a, **k: pytest.fail("planned a prefill beyond the bounds"))
    out = tmp_path / "plan"
    assert command.main([*SMALL, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert named in err and "the planner" in err
    assert not out.exists()


@pytest.mark.parametrize("spec", ["nan,10,100,10", "inf,10,100,10", "80,nan,100,10", "80,10,100,10,inf", "80,0,1,1"])
def test_gpu_specs_must_be_finite_and_positive(spec):
    with pytest.raises(ValueError, match="finite positive numbers"):
        parse_device(f"custom:{spec}")
    assert parse_device("custom:80,10,100,10,2").memory_gib == 80.0


F = ["parallel.activation_offload=true", "model.attn_head_groups=4", "model.mlp_chunk_size=16384"]
F += ["model.norm_chunk_size=16384"]


@pytest.mark.parametrize(
    "overrides, seq_len, cp",
    [
        (["model=qwen3_8b", *F], 16777216, 32),  # the most ring steps documented
        (["model=7b", *F, "model.attn_head_groups=8"], 7340032, 8),  # the most chunks
        (["model=llama3_8b", *F, "parallel.param_offload=true"], 1147904, 1),  # the most loss chunks
    ],
)
def test_the_documented_largest_plans_are_within_the_bounds(overrides, seq_len, cp):
    config = PlanConfig(["parallel=7b", *overrides], seq_len=seq_len, cp=cp, dp=1)
    run = compose_run(config.overrides)
    world, _ = command.planned_world(config, run)
    ((stage, mesh),) = command.planned_stages(config, run, world)  # raises beyond the bounds
    assert (mesh.seq_len, mesh.cp) == (seq_len, cp)
    # ... and one step further in each direction is past them
    model = command.stage_model_config(run.model, stage)
    assert not bounds.plannable(dataclasses.replace(mesh, seq_len=bounds.MAX_SEQ_LEN + cp), model)
    assert not bounds.plannable(dataclasses.replace(mesh, cp=mesh.cp * 4), model) or cp < 32


def test_longest_stops_at_the_planners_bound(monkeypatch, tmp_path, capsys):
    """A device that would hold any length (a stub step of 1 KiB a token): the search plans nothing past
    the longest length the planner plans, and says that length fits up to the planner's bound."""
    seen = []

    def plan_step(config, stage, mesh, parallel, optim, settings):
        seen.append(mesh)
        return StepMemory(mesh.batch * mesh.seq_len // mesh.cp * 1024, {"activations": 1}, {"p2p": 1}, 1)

    monkeypatch.setattr(command, "plan_step", plan_step)
    plan = command.run(PlanConfig(SMALL, seq_len=1024, longest=True, gpu="custom:1000000,10,100,10", out=str(tmp_path)))
    (found,) = plan["longest"]
    assert max(m.seq_len for m in seen) == found["longest"] and found["next_up"] is None
    debug = compose_run(SMALL).model  # 2 layers, loss chunks of 256: the loss chunks bind first
    assert found["longest"] == bounds.MAX_LOSS_CHUNKS * debug.loss_chunk_size
    assert "the planner's bound" in capsys.readouterr().out


def test_the_fake_step_command_has_the_same_bounds():
    with pytest.raises(ValueError, match="more than the 33554432"):
        FakeStepConfig(preset="debug", seq_len=2**26, cp=1, dp=1, documents=1)
    with pytest.raises(ValueError, match="ring steps"):
        FakeStepConfig(preset="debug", seq_len=2**20, cp=4096, dp=1, documents=1)
    FakeStepConfig()  # its defaults: the 7b preset at 1M over cp 8

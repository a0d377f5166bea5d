"""lwm-plan (lwm/plan): the command end to end at a small shape, its memory against the same
step run for real, its refusals before any fake work, the --longest boundary, and every option.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

from lwm.core.config import OptimConfig
from lwm.model import ModelConfig
from lwm.parallel import compute_settings
from lwm.parallel.launch import run_distributed
from lwm.paths import REPO
from lwm.plan import command
from lwm.plan.accuracy import PARALLEL, _setup, real_step
from lwm.plan.config import compose_run
from lwm.plan.devices import DEVICES, GIB, parse_device
from lwm.plan.fake import GPU_SETTINGS, PlanFakeMode
from lwm.plan.memory import Mesh, StepMemory, plan_step
from lwm.plan.search import longest_sequence
from lwm.plan.time import block_params, step_time, step_work
from lwm.plan.tracker import PlanTracker

SMALL = ["model=debug", "schedule=debug", "parallel=7b"]  # activation checkpointing on, as at 7b


DEVICE = "custom:0.04,10,100,10"  # the --longest boundary at 5-6K tokens: 5 planned steps in all


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One real run of the command: debug model, 512 tokens, one GPU (one --longest mesh), --infer."""
    out = tmp_path_factory.mktemp("plan")
    args = [*SMALL, "--seq-len", "512", "--cp", "1", "--dp", "1", "--gpu", DEVICE]
    code = command.main(args + ["--longest", "--infer", "1024", "--out", str(out)])
    assert code == 0
    return out, json.loads((out / "plan.json").read_text())


def test_the_command_writes_plan_json_and_the_plot(planned):
    out, plan = planned
    assert (out / "memory.png").stat().st_size > 10_000
    (row,) = plan["stages"]
    assert (row["seq_len"], row["cp"], row["dp"]) == (512, 1, 1)
    assert row["time"]["seconds"] > 0 and 0 < row["time"]["mfu"] < 1 and row["written"] > 0
    assert plan["infer"]["parts"]["kv_cache"] > 0 and plan["infer"]["decode_tokens_per_s"] > 0


def test_the_parts_add_up_to_the_peak(planned):
    _, plan = planned
    row = plan["stages"][0]
    assert sum(row["parts"].values()) == row["peak_bytes"]
    assert row["parts"]["parameters"] > 0 and row["parts"]["activations"] > 0
    infer = plan["infer"]
    assert sum(infer["parts"].values()) == infer["peak_bytes"] and infer["parts"]["temporaries"] >= 0


def test_longest_is_a_boundary(planned):
    """The longest length fits, the next one searched does not, by the plan's own measurements."""
    _, plan = planned
    device = parse_device(DEVICE)
    for found in plan["longest"]:
        points = {int(k): v for k, v in found["points"].items()}
        assert found["next_up"] == found["longest"] + 1024 * found["cp"]
        assert device.fits(points[found["longest"]]) and not device.fits(points[found["next_up"]])


def test_the_search_walks_to_the_boundary_from_a_wrong_guess():
    device = parse_device("custom:1,10,100,10")

    def peak(mesh):  # not linear: the two-probe guess overshoots
        return int(0.1 * GIB + (mesh.seq_len / 65536) ** 2 * GIB)

    found = longest_sequence(1, 1, peak, device, granule=1024)
    assert device.fits(peak(Mesh(found.longest, 1, 1))) and not device.fits(peak(Mesh(found.longest + 1024, 1, 1)))


def _real_step(cp: int, tp: int = 1) -> dict:
    """accuracy.real_step over gloo: cp x tp processes; for one, this one, in a group of its own (no spawn)."""
    if cp * tp > 1:
        return run_distributed(real_step, cp * tp, "debug", 512, cp, tp)[0]
    with torch.random.fork_rng():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            return real_step(0, 1, "debug", 512, 1)
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("cp, tp", [(1, 1), (2, 1), (1, 2)])
def test_the_planned_peak_equals_the_real_runs(cp, tp):
    """Fake tensors on the CPU settings against the same step for real over gloo: the tracker's
    peak byte for byte, with tensor parallelism too, and where it is: the live tensors grouped by
    what made them, equal group for group, adding up to the peak."""
    config, stage = _setup("debug", 512, cp)
    settings = compute_settings(torch.device("cpu"), config.head_dim)
    plan = plan_step(config, stage, Mesh(512, cp, 1, 1, tp), PARALLEL, OptimConfig(), settings)
    real = _real_step(cp, tp)
    assert plan.peak == real["peak"]
    assert plan.breakdown == real["breakdown"] and sum(b["bytes"] for b in plan.breakdown) == plan.peak
    assert {b["phase"] for b in plan.breakdown} >= {"held", "forward"}


@pytest.mark.parametrize(
    "args, named",
    [
        (["--seq-len", "1000", "--cp", "3", "--dp", "1"], "1000"),
        (["--cp", "3"], "world size 1 is not divisible by cp 3"),
        (["--tp", "3", "--seq-len", "512", "--cp", "1", "--dp", "1"], "tp 3"),
        (["parallel.tp=4", "--seq-len", "512", "--cp", "1", "--dp", "1"], "tp 4"),
        (["--tp", "-1"], "--tp must be >= 0"),
        (["--stage", "nope"], "'nope'"),
        (["--gpu", "h100"], "h100"),
        (["--gpu", "custom:80,1000"], "custom:80,1000"),
        (["--infer", "1001", "--cp", "2", "--dp", "1"], "--infer 1001"),
        (
            ["parallel.mode=ulysses", "--seq-len", "512", "--cp", "8", "--dp", "1"],
            "not divisible by the Ulysses size 8",
        ),
    ],
)
def test_impossible_meshes_are_refused_before_fake_work(monkeypatch, capsys, args, named):
    monkeypatch.setattr(command, "plan_step", lambda *a, **k: pytest.fail("planned an impossible mesh"))
    assert command.main([*SMALL, *args]) == 2
    assert named in capsys.readouterr().err


def _stub(monkeypatch, calls):
    """plan_step without fake work: 1 KiB per token on a rank."""

    def plan_step(config, stage, mesh, parallel, optim, settings):
        calls.append((config, stage, mesh, parallel))
        return StepMemory(mesh.batch * mesh.seq_len // mesh.cp * 1024, {"activations": 1}, {"p2p": 1}, 1)

    monkeypatch.setattr(command, "plan_step", plan_step)


def test_every_option_takes_effect(monkeypatch, tmp_path):
    calls = []
    _stub(monkeypatch, calls)
    plan = command.run(command.PlanConfig(SMALL + ["trainer.devices=4"], out=str(tmp_path / "a")))
    assert [r["stage"] for r in plan["stages"]] == ["a", "b"] and (tmp_path / "a" / "plan.json").is_file()
    assert [(r["cp"], r["dp"], r["batch"]) for r in plan["stages"]] == [(1, 4, 2), (1, 4, 1)]
    assert calls[0][0].n_layers == ModelConfig.from_preset("debug").n_layers
    assert calls[0][3].activation_checkpointing and not calls[0][3].document_mask

    plan = command.run(command.PlanConfig(SMALL + ["model=tiny"], stage="b", gpu="h200-141g", out=str(tmp_path)))
    assert [r["stage"] for r in plan["stages"]] == ["b"] and plan["device"]["name"] == "h200-141g"
    assert calls[-1][0].dim == ModelConfig.from_preset("tiny").dim

    plan = command.run(command.PlanConfig(SMALL, seq_len=4096, cp=4, dp=2, gpu="a100-80g", out=str(tmp_path)))
    row = plan["stages"][0]
    assert (row["seq_len"], row["cp"], row["dp"]) == (4096, 4, 2) and plan["device"]["tflops"] == DEVICES[
        "a100-80g"
    ].tflops

    big = command.run(
        command.PlanConfig(SMALL, seq_len=2**20, cp=1, dp=4, gpu="custom:0.5,10,100,10", out=str(tmp_path))
    )
    assert big["stages"][0]["verdict"] == "needs cp 4 x dp 1"  # 1 GiB at cp 1, 256 MiB at cp 4

    plan = command.run(
        command.PlanConfig(SMALL, seq_len=4096, longest=True, gpu="custom:0.5,10,100,10", out=str(tmp_path))
    )
    assert plan["longest"][0]["longest"] == int(0.5 * GIB / 1.05 / 2**20) * 1024  # 1 MiB per 1024 tokens

    monkeypatch.setattr(
        command,
        "plan_inference",
        lambda model, n, cp, device, node, chunk: {"seq_len": n, "cp": cp, "chunk": chunk, "parts": {}},
    )
    monkeypatch.setattr(command.report, "infer_lines", lambda infer: [])
    plan = command.run(command.PlanConfig(SMALL + ["trainer.devices=2"], infer=2048, out=str(tmp_path)))
    assert (plan["infer"]["seq_len"], plan["infer"]["cp"], plan["infer"]["chunk"]) == (2048, 2, 8192)
    plan = command.run(command.PlanConfig(SMALL, infer=2048, prefill_chunk=512, out=str(tmp_path)))
    assert plan["infer"]["chunk"] == 512


def test_a_stage_that_does_not_fit_is_searched_and_timed_at_the_cp_that_does(monkeypatch, tmp_path):
    calls = []
    _stub(monkeypatch, calls)
    plan = command.run(
        command.PlanConfig(SMALL, seq_len=2**20, cp=1, dp=8, gpu="custom:0.2,10,100,10", out=str(tmp_path))
    )
    row = plan["stages"][0]
    # 1 KiB per token: cp 8 (128 MiB) fits, then the bisection: cp 2 (512 MiB) does not, cp 4 (256 MiB) does not
    assert [c[2].cp for c in calls] == [1, 8, 2, 4] and row["verdict"] == "needs cp 8 x dp 1"
    assert set(row["searched"]) == {"2", "4", "8"} and row["fits_with"]["peak_bytes"] == 2**27
    assert row["fits_with"]["time"]["tokens_per_s_per_gpu"] > 0 and "smallest cp that fits is 8" in row["why"]

    calls.clear()  # a global batch puts the same tokens on a rank at every cp: nothing to search
    plan = command.run(command.PlanConfig(SMALL + ["trainer.devices=4", "+schedule.stages.1.global_batch=4"],
                                          stage="b", gpu="custom:0.0001,10,100,10", out=str(tmp_path)))  # fmt: skip
    assert "puts 128 tokens on each rank" in plan["stages"][0]["why"]
    # then the memory features, one more at a time (the stub's peak does not move: none fits)
    advice = plan["stages"][0]["advice"]
    assert [c[3].activation_offload for c in calls] == [False, True, True, True]
    assert [c[3].param_offload for c in calls] == [False, False, True, True] and calls[3][0].attn_head_groups == 2
    assert advice["overrides"] is None and list(advice["tried"]) == [
        "parallel.activation_offload=true",
        "parallel.activation_offload=true parallel.param_offload=true",
        "parallel.activation_offload=true parallel.param_offload=true model.attn_head_groups=2",
    ]


def test_a_stage_no_cp_fits_is_told_the_cheapest_memory_feature_that_does(monkeypatch, tmp_path, capsys):
    """Where no cp fits, the ladder (checkpointing, tiled norms, blockwise MLP, activation offload,
    parameter offload, head groups: lwm/plan/advice.py) is planned one more feature at a time
    and the first that fits is named, with its peak and time; the preflight says the same."""
    calls = []

    def plan_step(config, stage, mesh, parallel, optim, settings):
        calls.append((config, parallel))
        tokens = mesh.batch * mesh.seq_len // mesh.cp
        per_token = 256 if parallel.activation_offload else 1024  # offload: a quarter stays on the device
        host = tokens * 768 if parallel.activation_offload else 0
        return StepMemory(tokens * per_token, {"activations": 1}, {"p2p": 1}, 1, host_peak=host)

    monkeypatch.setattr(command, "plan_step", plan_step)
    overrides = ["model=debug", "schedule=debug"]  # checkpointing off
    plan = command.run(
        command.PlanConfig(overrides, seq_len=2**14, cp=1, dp=1, gpu="custom:0.01,10,100,10", out=str(tmp_path))
    )
    advice = plan["stages"][0]["advice"]
    assert advice["overrides"] == ["parallel.activation_checkpointing=true", "parallel.activation_offload=true"]
    assert advice["peak_bytes"] == 2**14 * 256 and advice["host_peak_bytes"] == 2**14 * 768
    assert [p.activation_checkpointing for _, p in calls] == [False, True, True]
    assert (
        "fits with parallel.activation_checkpointing=true parallel.activation_offload=true" in capsys.readouterr().out
    )


def test_batch_and_a_world_from_the_schedule(monkeypatch, tmp_path, capsys):
    calls = []
    _stub(monkeypatch, calls)
    plan = command.run(command.PlanConfig(SMALL + ["trainer.devices=4"], batch=3, out=str(tmp_path)))
    assert [r["batch"] for r in plan["stages"]] == [3, 3]
    # No world named: the lcm of the stages' cps (lwm_text's 1, 4, 8, 16 and 32), 8 GPUs a node
    plan = command.run(command.PlanConfig(["model=debug", "schedule=lwm_text", "parallel=7b"], out=str(tmp_path)))
    assert [(r["cp"], r["dp"]) for r in plan["stages"]] == [(1, 32), (4, 8), (8, 4), (16, 2), (32, 1)]
    assert "planned on 32 GPUs" in capsys.readouterr().out


def test_the_plan_keeps_the_model_groups_vocabulary_unless_the_data_is_named(monkeypatch, tmp_path, spm_model):
    """train.py sizes the embedding to data/sample/tokenizer.model when the working folder has it;
    the plan does not depend on the folder it is run from."""
    (tmp_path / "data" / "sample").mkdir(parents=True)
    shutil.copy(spm_model, tmp_path / "data" / "sample" / "tokenizer.model")
    monkeypatch.chdir(tmp_path)
    tiny = [*SMALL, "model=tiny"]  # 12352 rows (4096 text ids); the folder's tokenizer has 256: 8512 rows
    assert compose_run(tiny).model.vocab_size == ModelConfig.from_preset("tiny").vocab_size == 12352
    assert compose_run([*tiny, f"data.tokenizer={spm_model}"]).model.vocab_size == 8512


def test_tensor_parallel_plans_its_mesh_searches_cp_at_that_tp_and_times_its_all_reduces(monkeypatch, tmp_path):
    calls = []
    _stub(monkeypatch, calls)
    plan = command.run(command.PlanConfig(SMALL, seq_len=4096, cp=2, dp=2, tp=2, out=str(tmp_path)))
    row = plan["stages"][0]
    assert (calls[-1][2].tp, calls[-1][2].world, row["tp"]) == (2, 8, 2)
    plan = command.run(command.PlanConfig(SMALL + ["parallel.tp=2", "trainer.devices=4"], out=str(tmp_path)))
    assert [(r["cp"], r["dp"], r["tp"]) for r in plan["stages"]] == [(1, 2, 2), (1, 2, 2)]  # the run's own tp
    calls.clear()  # 1 KiB per token: cp 4 (256 MiB) fits on 8 GPUs at tp 2, cp 2 does not
    plan = command.run(
        command.PlanConfig(SMALL, seq_len=2**20, cp=1, dp=4, tp=2, gpu="custom:0.3,10,100,10", out=str(tmp_path))
    )
    assert [(c[2].cp, c[2].dp, c[2].tp) for c in calls] == [(1, 4, 2), (4, 1, 2), (2, 2, 2)]
    assert plan["stages"][0]["verdict"] == "needs cp 4 x dp 1"


def test_tensor_parallel_all_reduces_are_counted_and_timed():
    """Rank 0's fake step at tp 2 sends, over its tp group, each block's two row-parallel outputs
    (wo, w2) in forward and the five column-parallel inputs' gradients (wq, wk, wv, w1, w3) in
    backward: 7 all-reduces of (tokens, dim) bf16 activations per block (beside the clipping norms'
    scalars). The time model charges
    them at a ring all-reduce's 2 (tp - 1) / tp, gives each tp rank half the blocks' matmuls and
    the whole output head, and counts a tp group's tokens once per GPU of it."""
    config, stage = _setup("debug", 1024, 2)
    parallel = dataclasses.replace(PARALLEL, activation_checkpointing=False)
    steps = {
        tp: plan_step(config, stage, Mesh(1024, 2, 1, 1, tp), parallel, OptimConfig(), GPU_SETTINGS) for tp in (1, 2)
    }
    tokens = 1024 // 2
    activations = steps[2].sent["all_reduce"] - 7 * config.n_layers * tokens * config.dim * 2
    assert 0 < activations - steps[1].sent["all_reduce"] < 64  # and the clipping norms' few bytes, on each mesh
    work = {tp: step_work(config, Mesh(1024, 2, 1, 1, tp), steps[tp], "striped", "ring", False) for tp in (1, 2)}
    assert work[2].tp_bytes == steps[2].sent["all_reduce"] and work[1].tp_bytes == 0  # 2 (2 - 1) / 2 = 1
    head = config.vocab_size * config.dim
    assert work[2].matmul_flops == 6 * (block_params(config) // 2 + head) * tokens
    assert work[2].attention_flops * 2 == work[1].attention_flops
    device = parse_device("h100-80g")
    times = {tp: step_time(work[tp], Mesh(1024, 2, 1, 1, tp), device, 8) for tp in (1, 2)}
    assert "tp (NVLink)" in times[2].parts and "tp (NVLink)" not in times[1].parts
    assert times[2].parts["tp (NVLink)"] == work[2].tp_bytes / (device.nvlink_gbps * 1e9)
    assert times[2].tokens_per_s_per_gpu == tokens / 2 / times[2].seconds


def test_ulysses_all_to_alls_are_counted_and_timed():
    """Ulysses sends each block's q, k, v and output through an all-to-all in forward and their
    gradients in backward: 2 x (2 q-sized + 2 kv-sized) tensors of this rank's tokens, bf16; the
    time model charges (cp - 1) / cp of them to the cp group's link, in series with compute."""
    config, stage = _setup("debug", 1024, 2)
    parallel = dataclasses.replace(PARALLEL, activation_checkpointing=False, mode="ulysses")
    mesh = Mesh(1024, 2, 1)
    step = plan_step(config, stage, mesh, parallel, OptimConfig(), GPU_SETTINGS)
    heads = 2 * config.n_heads + 2 * config.n_kv_heads
    assert step.sent["all_to_all"] == 2 * heads * 512 * config.head_dim * 2 * config.n_layers
    work = step_work(config, mesh, step, "striped", "ulysses", False)
    assert work.a2a_bytes == step.sent["all_to_all"] / 2
    device = parse_device("h100-80g")
    time = step_time(work, mesh, device, 8)
    assert time.parts["all-to-all (NVLink)"] == work.a2a_bytes / (device.nvlink_gbps * 1e9)
    assert time.seconds >= sum(time.parts[k] for k in ("matmul", "attention", "hbm", "all-to-all (NVLink)"))


def test_the_llama3_8b_preset_is_planned(tmp_path):
    """model=llama3_8b (GQA, Llama 3.1's RoPE scaling, 136512 rows) through the real step under
    fake tensors, 2 of its 32 layers to keep it quick (docs/planning.md has the whole model's line)."""
    plan = command.run(
        command.PlanConfig(
            ["model=llama3_8b", "model.n_layers=2"], seq_len=4096, cp=2, dp=1, gpu="h100-80g", out=str(tmp_path)
        )
    )
    model = plan["model"]
    assert (model["n_kv_heads"], model["vocab_size"], model["rope_scaling"]["factor"]) == (8, 136512, 8.0)
    row = plan["stages"][0]
    assert (row["seq_len"], row["cp"]) == (4096, 2) and row["verdict"].startswith("fits") and row["peak_bytes"] > 0


@pytest.mark.parametrize("schedule", sorted(p.stem for p in (REPO / "conf" / "schedule").glob("*.yaml")))
def test_every_shipped_schedule_is_planned(monkeypatch, tmp_path, schedule):
    """Each schedule in conf/schedule, every stage, on the world its stages' cps need (the steps
    stubbed: what is checked is the composition, the meshes and the table)."""
    calls = []
    _stub(monkeypatch, calls)
    plan = command.run(command.PlanConfig(["model=debug", f"schedule={schedule}"], out=str(tmp_path)))
    stages = compose_run([f"schedule={schedule}"]).schedule.stages
    assert [r["stage"] for r in plan["stages"]] == [s.name for s in stages]
    assert [r["cp"] for r in plan["stages"]] == [s.cp for s in stages] and all(
        r["time"]["seconds"] > 0 for r in plan["stages"]
    )


def test_a_cp_1_stage_of_a_hybrid_run_is_planned_as_train_py_runs_it(monkeypatch, tmp_path):
    """train.py runs a stage of cp 1 without context parallelism under any mode (ParallelConfig.dims);
    the plan builds its meshes the same way instead of refusing hybrid's all-to-all size there."""
    calls = []
    _stub(monkeypatch, calls)
    hybrid = SMALL + ["parallel.mode=hybrid", "parallel.ulysses=2"]
    plan = command.run(command.PlanConfig(hybrid, seq_len=512, cp=1, dp=2, out=str(tmp_path)))
    assert [(r["cp"], r["dp"]) for r in plan["stages"]] == [(1, 2)]
    plan = command.run(command.PlanConfig(hybrid, seq_len=512, cp=4, dp=1, out=str(tmp_path)))
    assert [(r["cp"], r["dp"]) for r in plan["stages"]] == [(4, 1)]


def test_each_tiling_lowers_the_planned_peak_and_is_charged_its_recompute():
    """Head groups and sequence-tiled norms, planned by running them: each lowers the peak of the
    debug model's checkpointed step at 2048 tokens over cp 2 (one group's q/k/v and ring sums, one
    chunk's fp32 norm work), and the time model charges the head groups' second recompute: the
    attention projections' matmuls and 2 more attention products."""
    config, stage = _setup("debug", 2048, 2)
    mesh = Mesh(2048, 2, 1)
    configs = {
        "plain": config,
        "heads": config.replace(attn_head_groups=2),
        "norms": config.replace(norm_chunk_size=128),
    }
    steps = {k: plan_step(c, stage, mesh, PARALLEL, OptimConfig(), GPU_SETTINGS) for k, c in configs.items()}
    assert steps["heads"].peak < steps["plain"].peak and steps["norms"].peak < steps["plain"].peak
    work = {k: step_work(configs[k], mesh, steps[k], "striped", "ring", True) for k in ("plain", "heads")}
    tokens = 1024
    attn_params = config.n_layers * config.dim * config.head_dim * (2 * config.n_heads + 2 * config.n_kv_heads)
    assert work["heads"].matmul_flops - work["plain"].matmul_flops == 2 * attn_params * tokens
    assert work["heads"].attention_flops * 9 == work["plain"].attention_flops * 11  # 2 + 5 + 2 -> + 2


def test_the_prefills_cache_pass_holds_half_the_cache_slice():
    """The chunked ring prefill passes the earlier segments' cache around the ring in two halves
    (lwm.parallel.cached.PAST_PASSES), so its send copies and two sets of receive buffers grow with
    the cache at half the rate: from 512 to 2048 prompt tokens (64-token segments a rank) the
    planned temporaries grow by 0.78x the cache's growth (1.56x when the whole slice travelled at
    once: 5.5 GiB at an hour of video over 8 GPUs, which missed 8 H100-80G by half a GiB)."""
    from lwm.plan.memory import plan_prefill

    config = ModelConfig.from_preset("debug", max_seq_len=8192)
    short, long = (plan_prefill(config, n, 2, 64, GPU_SETTINGS) for n in (512, 2048))
    cache = long.parts["kv_cache"] - short.parts["kv_cache"]
    assert cache == 3 * short.parts["kv_cache"]
    assert long.parts["temporaries"] - short.parts["temporaries"] <= 0.8 * cache


def test_longest_stops_where_the_nodes_host_memory_is_full(monkeypatch, tmp_path):
    """--longest with offload on: the device would hold far more, the host does not. A stub step puts
    1 MiB a token a rank on the host; a custom device's node has 2 TiB of host memory (1 rank here:
    16 GiB for the process, 5% margin), so the longest is where 1 MiB x tokens x 1.05 + 16 GiB reaches
    2 TiB, to the search's 1024-token granule."""

    def plan_step(config, stage, mesh, parallel, optim, settings):
        tokens = mesh.batch * mesh.seq_len // mesh.cp
        return StepMemory(2**20, {"activations": 1}, {"p2p": 1}, 1, host_peak=tokens * 2**20)

    monkeypatch.setattr(command, "plan_step", plan_step)
    overrides = SMALL + ["parallel.activation_offload=true"]
    plan = command.run(
        command.PlanConfig(overrides, seq_len=1024, longest=True, gpu="custom:40,10,100,10", out=str(tmp_path))
    )
    limit = (2048 - 16) / 1.05 * 1024  # tokens: GiB of host a rank / 1 MiB a token
    (found,) = plan["longest"]
    assert found["longest"] == int(limit) // 1024 * 1024 and found["next_up"] == found["longest"] + 1024


def test_the_optimizers_writes_are_this_ranks_shards():
    """AdamW and clipping run on FSDP2's DTensor shards: the bytes the time model charges them are
    the rank's shard, not the global shape (they were counted whole: as much at dp 2 as at dp 1)."""
    config, stage = _setup("debug", 1024, 1)
    written = {
        dp: plan_step(config, stage, Mesh(1024, 1, dp), PARALLEL, OptimConfig(), GPU_SETTINGS).optimizer_written
        for dp in (1, 2)
    }
    assert written[1] > 0 and written[2] == pytest.approx(written[1] / 2, rel=0.01)


def test_the_breakdown_names_the_module_entered_last_when_two_are_entered_between_the_same_ops(monkeypatch):
    """A module's backward that begins right after its parent's, with nothing counted between (a
    Linear inside the MLP), made the two stamps equal once both names were known: the breakdown then
    named either, by the order of a set of strings (it changed with Python's hash seed)."""
    monkeypatch.setattr(FSDPMemTracker, "__init__", lambda self, mod, optm=None: None)
    tracker = PlanTracker(None, None, "cpu")
    fqn = {"mlp": "Transformer.layers.1.mlp", "w2": "Transformer.layers.1.mlp.w2"}
    parents = ["Global", "Transformer", fqn["mlp"], fqn["w2"]]  # the parent first: what max() keeps on a tie
    tracker._mod_tracker = SimpleNamespace(get_known_fqn=fqn.get, is_bw=True, parents=parents)
    tracker._in_opt, tracker._stepping, tracker._dtype = False, True, torch.bfloat16
    for _ in range(2):  # the second time both names are known
        tracker._on_backward("mlp", None)
        tracker._on_backward("w2", None)
    assert tracker._origin()[:2] == ("layers.1.mlp.w2", "backward")


def test_the_planners_fake_mode_asks_whether_cuda_exists_once(monkeypatch):
    """torch's FakeTensorMode asks at every op its cache does not serve; with Lightning imported each
    asking loads NVML's library (5-8% of a plan's time). The planner's mode asks when it is made."""
    asked = []
    available = torch.cuda.is_available
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or available())
    with PlanFakeMode():
        made = len(asked)
        x = torch.empty(8, 4)
        rows = [x[i : i + 1] * 2 for i in range(4)]  # a new offset each: not served by the cache
    assert made == 1 and len(asked) == made and rows[0].shape == (1, 4)

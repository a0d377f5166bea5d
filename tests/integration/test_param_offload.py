"""Parameter offload (parallel.param_offload: FSDP2's CPUOffloadPolicy): bit-exact training on gloo
cp 2 (ring and Ulysses, document masks on), Lightning's setup leaving host parameters where they
are, the planner's host and device memory, and the config field. A train.py run stopped and resumed
with it on ends bit-identical to an uninterrupted one: tests/integration/test_train_parallel.py (tp 2 x cp 2);
the CUDA path (pinned host memory through Lightning's setup and the steps): tests/integration/test_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import build_optimizer, train_step
from lwm.model import ModelConfig, Transformer
from lwm.parallel import ParallelDims, build_meshes, build_parallel_model, compute_settings, state_offload
from lwm.parallel.launch import run_distributed
from lwm.plan.devices import parse_device
from lwm.plan.fake import GPU_SETTINGS, make_batch
from lwm.plan.memory import Mesh, StepMemory, plan_step
from lwm.plan.time import step_time, step_work

CFG = ModelConfig.from_preset("debug").replace(n_layers=3)
SEQ, STEPS = 64, 5
STAGE = StageConfig("a", seq_len=SEQ, rope_theta=1e4, steps=STEPS, lr=1e-2, cp=2)
OPTIM = OptimConfig(weight_decay=0.1)


def _cp_worker(rank, world):
    """5 steps per mode on a cp-2 FSDP2 mesh with document masks, the states on the device and in
    host memory: (losses, parameter shards, where FSDP2 keeps them)."""
    settings = compute_settings(torch.device("cpu"), CFG.head_dim)
    results = {}
    for mode in ("ring", "ulysses"):
        where = build_meshes(ParallelDims(1, world, 1, mode), "cpu", rank)
        batch = make_batch(CFG, SEQ, where, 2, "striped", "cpu")  # 2 documents, masked
        for on in (False, True):
            torch.manual_seed(0)
            init = Transformer(CFG).state_dict() if rank == 0 else {}
            states = state_offload(on, torch.device("cpu"))
            model = build_parallel_model(CFG, where, settings, "cpu", init, "striped", True, None, states)
            optimizer, scheduler = build_optimizer(model, STAGE, OPTIM)
            losses = [train_step(model, batch, optimizer, OPTIM, where.cp_group, True, scheduler) for _ in range(STEPS)]
            params = [p.to_local().detach().clone() for p in model.parameters()]
            group = model.layers[0]._get_fsdp_state()._fsdp_param_group
            offloaded = [p.offload_to_cpu for p in group.fsdp_params]
            results[mode, on] = [m.loss for m in losses], [m.grad_norm for m in losses], params, offloaded
    return results


def test_context_parallel_with_param_offload_equals_the_plain_run_bitwise():
    """fp32, 5 AdamW steps with clipping: the losses, gradient norms and parameter shards are the
    plain run's bit for bit (on a CPU FSDP2's copies in and out are plain copies, and AdamW runs
    where it would anyway); FSDP2 keeps every parameter of the offloaded run in host memory."""
    for results in run_distributed(_cp_worker, 2):
        for mode in ("ring", "ulysses"):
            (losses, norms, params, plain), (got_losses, got_norms, got_params, offloaded) = (
                results[mode, False],
                results[mode, True],
            )
            assert not any(plain) and offloaded and all(offloaded), mode
            assert all(torch.equal(a, b) for a, b in zip(got_losses, losses)), (mode, got_losses, losses)
            assert all(torch.equal(a, b) for a, b in zip(got_norms, norms)), mode
            assert len(got_params) == len(params) and all(torch.equal(a, b) for a, b in zip(got_params, params))


def test_lightning_leaves_host_parameters_in_host_memory():
    """Lightning's ModelParallelStrategy moves the whole model to its device in setup; with the
    parameters offloaded it must not (FSDP2 refuses device parameters under CPU offload)."""
    from lwm.train.checkpointing import AtomicModelParallelStrategy

    for on_host, expected in ((False, "meta"), (True, "cpu")):
        strategy = AtomicModelParallelStrategy(params_on_host=on_host)
        strategy.parallel_devices = [torch.device("meta")]
        strategy.model = torch.nn.Linear(2, 2)
        strategy.model_to_device()
        assert strategy.model.weight.device.type == expected


def test_the_config_field_takes_effect(monkeypatch):
    """parallel.param_offload reaches FSDP2 as its CPU offload policy (pinned on a GPU), the
    parameters are allocated in host memory, and the trainer's strategy keeps them there."""
    from lwm.core.config import TrainerConfig
    from lwm.train import module as module_file
    from lwm.train.module import LWMModule
    from lwm.train.trainer import strategy

    assert isinstance(state_offload(False, torch.device("cuda")), OffloadPolicy)
    assert not isinstance(state_offload(False, torch.device("cuda")), CPUOffloadPolicy)
    assert (
        state_offload(True, torch.device("cuda")).pin_memory and not state_offload(True, torch.device("cpu")).pin_memory
    )
    gpu = TrainerConfig(accelerator="gpu", devices=1)
    assert strategy(ParallelDims(1, 1, 1), gpu, True).params_on_host
    assert not strategy(ParallelDims(1, 1, 1), gpu, False).params_on_host
    # LWMModule on a mesh hands the policy and the host device to the model's build
    calls = {}
    monkeypatch.setattr(module_file, "build_parallel_model", lambda *a, **k: calls.setdefault("args", a))
    monkeypatch.setattr(module_file, "build_meshes", lambda *a: type("M", (), {"cp_group": None})())
    monkeypatch.setattr(module_file.peers, "register", lambda: None)
    monkeypatch.setattr(module_file.dist, "get_rank", lambda: 0)
    stage = dataclasses.replace(STAGE, cp=1)
    module = LWMModule(CFG, stage, OPTIM, ParallelConfig(param_offload=True), dims=ParallelDims(1, 1, 1))
    module._device_mesh = type("Mesh", (), {"size": lambda self: 1})()
    module.configure_model()
    assert isinstance(calls["args"][-1], CPUOffloadPolicy)


# ------------------------------------------------------------------------- the planner


def _plan(world: int, on: bool, seq_len: int = 1024):
    parallel = ParallelConfig(activation_checkpointing=True, param_offload=on, document_mask=False)
    stage = dataclasses.replace(STAGE, seq_len=seq_len, cp=1)
    return plan_step(CFG, stage, Mesh(seq_len, 1, world), parallel, OptimConfig(), GPU_SETTINGS)


@pytest.mark.parametrize("world", [1, 2])
def test_the_planner_keeps_the_states_in_host_memory(world, monkeypatch):
    """lwm-plan's step (GPU settings, FSDP2 over `world` data-parallel ranks): with param offload
    the device holds no fp32 parameter shard, gradient or AdamW moment, the host holds them (and
    AdamW's temporaries), the peak's breakdown adds up, and the bytes FSDP2 copies in are those of
    the parameter shards it gathers (counted where FSDP2 takes each gather's input)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    gathered = []
    inputs = FSDPParam.all_gather_inputs

    def counted(self):
        gathered.append(self._sharded_param_data.nbytes)
        return inputs.fget(self)

    plain = _plan(world, False)
    monkeypatch.setattr(FSDPParam, "all_gather_inputs", property(counted))
    offloaded = _plan(world, True)
    shards = sum(-(-p.numel() // world) * 4 for p in Transformer(CFG).parameters())  # rank 0's padded shards
    assert plain.host_peak == 0 and plain.parts["optimizer"] > 0
    assert offloaded.parts["optimizer"] == offloaded.parts["gradients"] == 0
    assert offloaded.parts["parameters"] == plain.parts["parameters"] - shards  # the gathered bf16 stay
    assert offloaded.host_peak >= 4 * shards  # parameters, gradients, two moments
    assert offloaded.peak < plain.peak and sum(r["bytes"] for r in offloaded.breakdown) == offloaded.peak
    assert offloaded.sent["host"] == sum(gathered) + shards  # shards in at each gather; gradients out once
    assert offloaded.optimizer_written == plain.optimizer_written > 0


def test_a_short_steps_device_peak_holds_no_fp32_state_under_param_offload():
    """At 32 tokens the states are most of the step: none is held on the device under offload. The
    previous step's gradients, alive until zero_grad, are the host's (they were counted as device
    activations, and were the peak of a short step)."""
    plain, offloaded = _plan(1, False, 32), _plan(1, True, 32)
    held = [r for r in offloaded.breakdown if r["phase"] == "held" and r["category"] != "inputs"]
    assert not held, held
    shards = sum(p.numel() * 4 for p in Transformer(CFG).parameters())
    assert plain.peak - offloaded.peak >= 3 * shards  # the parameters and both moments left the device


def test_the_time_model_runs_the_optimizer_on_the_host():
    """With the states offloaded, AdamW's writes leave the HBM part and are timed at the rank's
    share of the node's host memory rate, in series with compute; the copies are the host part."""
    plan = _plan(2, True)
    mesh, device = Mesh(1024, 1, 2), parse_device("h100-80g")
    on, off = (step_work(CFG, mesh, plan, "striped", "ring", True, states_on_host=s) for s in (True, False))
    assert off.hbm_bytes - on.hbm_bytes == on.host_optimizer_bytes == 2 * plan.optimizer_written
    assert off.host_optimizer_bytes == 0 and on.host_bytes == plan.sent["host"]
    time = step_time(on, mesh, device, 8)
    assert time.parts["optimizer (host)"] == on.host_optimizer_bytes / (device.host_mem_gbps * 1e9 / 2)
    assert time.seconds >= time.parts["matmul"] + time.parts["attention"] + time.parts["optimizer (host)"]
    assert "optimizer (host)" not in step_time(off, mesh, device, 8).parts


def test_the_ladder_offers_param_offload_before_head_groups():
    from lwm.plan.advice import steps

    parallel = ParallelConfig(activation_checkpointing=True)
    found = [override for override, _, _ in steps(CFG, parallel, Mesh(4096, 2, 1))]
    assert found == ["parallel.activation_offload=true", "parallel.param_offload=true", "model.attn_head_groups=2"]
    on = dataclasses.replace(parallel, param_offload=True)
    assert "parallel.param_offload=true" not in [override for override, _, _ in steps(CFG, on, Mesh(4096, 2, 1))]


def test_the_advice_keeps_only_the_features_the_fit_needs(monkeypatch, tmp_path):
    """At a length where the states are what does not fit, the ladder reaches parameter offload
    through checkpointing and activation offload; the advice then drops each of them that the run
    fits without (each dropped set planned), and names parameter offload alone."""
    from lwm.plan import command

    calls = []

    def plan_step(config, stage, mesh, parallel, optim, settings):
        calls.append(parallel)
        peak = 2**20 if parallel.param_offload else 2**30  # only the states' offload makes it fit
        return StepMemory(peak, {"optimizer": 1}, {"p2p": 1}, 1, host_peak=2**20)

    monkeypatch.setattr(command, "plan_step", plan_step)
    overrides = ["model=debug", "schedule=debug"]  # checkpointing off
    plan = command.run(
        command.PlanConfig(overrides, seq_len=2**10, cp=1, dp=1, gpu="custom:0.01,10,100,10", out=str(tmp_path))
    )
    advice = plan["stages"][0]["advice"]
    assert advice["overrides"] == ["parallel.param_offload=true"]
    assert list(advice["tried"]) == [
        "parallel.activation_checkpointing=true",
        "parallel.activation_checkpointing=true parallel.activation_offload=true",
        "parallel.activation_checkpointing=true parallel.activation_offload=true parallel.param_offload=true",
        "parallel.activation_checkpointing=true parallel.param_offload=true",
        "parallel.param_offload=true",
    ]

"""Every config field takes effect, and a test shows it. This file holds the tests no
other file has; fields already shown elsewhere are listed here with the test that shows them.

Shown elsewhere (tests/integration/test_train.py and tests/integration/test_train_parallel.py unless named):
  stage_only             test_bad_input_is_refused_before_the_run (unknown stage), every run with stage_only=a
  resume, stop_at_step   test_resume_gives_the_same_losses; tests/integration/test_run_folder.py (stop_at_step exits 4)
  trainer.overwrite      tests/integration/test_run_folder.py::test_another_run_is_refused_and_a_finished_one_kept
  export=false           test_output_one_line_per_stage_and_one_checkpoint (stage hand-over: no hf/ folder)
  data.tokenizer         test_default_run_config_is_valid (the embedding has the tokenizer's rows)
  data.codes             test_bad_input_is_refused_before_the_run (no manifest); tests/unit/data/test_data.py
  data.sources.*.fields  tests/unit/data/test_data.py (a text source without per-example fields)
  parallel.layout        test_context_parallel_losses_equal_one_process (zigzag), test_bad_input_... (zigzag divisibility)
  parallel.mode=hybrid, parallel.ulysses
                         test_context_parallel_losses_equal_one_process (cp 4 = Ulysses 2 x ring 2);
                         tests/integration/test_tensor_parallel.py (refused where they do not divide)
  trainer.preflight      test_output_one_line_per_stage_and_one_checkpoint (planned, fits),
                         test_preflight_stops_a_stage_that_will_not_fit; tests/integration/test_preflight.py
  parallel.tp            test_tensor_parallel_runs_exports_and_resumes; tests/integration/test_tensor_parallel.py
                         (tp 2, tp 2 x cp 2, tp 2 x dp 2 train as one process; heads per rank)
  schedule.init_hf       test_first_stage_from_hugging_face
  stage name, seq_len,
    rope_theta, steps    test_output_one_line_per_stage_and_one_checkpoint (stage hand-over), test_context_parallel_losses_equal_one_process
  stage.cp, trainer.devices  test_context_parallel_losses_equal_one_process, test_tensor_parallel_runs_exports_and_resumes
  trainer.timeout_s      test_a_dead_rank_stops_the_others
  trainer.out_dir        every run
  model.*                test_model_fields_and_schedule_name, test_conf_models_are_the_presets
  model.attn_head_groups, model.norm_chunk_size
                         tests/unit/model/test_model.py (the plain model's logits and gradients; the attention sees one
                         group's heads per call), tests/integration/test_parallel_dist.py (cp 2, ring and Ulysses, packed
                         documents), tests/integration/test_plan.py (each lowers the planned peak; recompute charged)
  model.rope_scaling.*   tests/unit/model/test_model.py::test_rope_scaling_and_each_of_its_fields_take_effect (the angles
                         and logits), tests/unit/interop/test_hf.py (equal to transformers' "llama3" RoPE, import and
                         export); here: from conf/model and the command line, and kept by each stage
  probe.path, probe.examples  tests/integration/test_learning.py (200 held-out answers scored at the stage's start and end)
  evaluate.*             tests/integration/test_learning.py (lwm/eval/needle.py after the run, every field in its needle.json);
                         evaluate.lengths=null in every other test run (no needle/ folder); here: every
                         field of the NeedleGrid reaches the needle command's run(config)
  data.holdout           tests/unit/data/test_data.py (held-out examples never trained on), tests/integration/test_learning.py
  data.strict, data.max_line_bytes, data.max_skipped_fraction
                         tests/integration/test_train.py test_skipped_examples_reach_the_metrics_and_the_summary (a line over
                         max_line_bytes skipped, in data/skipped and the summary; strict=true: exit 2 at the first
                         bad line), test_mostly_bad_data_stops_the_run_with_exit_2 (0.5: 4 of 6 bad stops);
                         tests/unit/data/test_data.py (a long line skipped unread, strict raises; 0.5 stops, 0.7 and 1 do not;
                         judged on the whole epoch before its first batch); tests/unit/test_io.py (read in pieces, never held);
                         here: they reach the stream from conf/data without a '+'
  data.num_workers, data.index_dir, data.index_workers
                         tests/integration/test_data_index.py (resume with workers equals an uninterrupted run; an index
                         kept in index_dir; a large source indexed by several processes); here: from conf/data
                         each reaches the loader, the index's folder and the indexer
  parallel.activation_offload
                         tests/integration/test_offload.py (bit-exact in one process, on gloo cp 2 and across a resume;
                         the planner's host memory; LWMModule offloads; refused without checkpointing, there
                         and from train.py: tests/integration/test_train.py::test_bad_input_is_refused_before_the_run)
  parallel.param_offload tests/integration/test_param_offload.py (bit-exact on gloo cp 2; FSDP2 keeps the states in host
                         memory; Lightning leaves them there; the planner's host memory, copies and CPU
                         optimizer time), tests/integration/test_train_parallel.py (a tp 2 x cp 2 resume with it on is
                         bit-identical), tests/integration/test_gpu.py (pinned host memory on a GPU)
  trainer.flush_denormal tests/unit/core/test_numerics.py (denormals computed as zero, and a product on them 44 ms
                         against 0.35 ms); here: in force when the stage's training starts, or not;
                         tests/unit/vqgan_training/test_vqgan_train.py (train_vqgan.py's summary)
  optim.max_nonfinite_steps
                         tests/integration/test_guard.py (0: exit 5 at the first non-finite step; 2: two steps skipped
                         with weights and AdamW's state unchanged, the third stops the stage)
  data.on_changed_source tests/unit/data/test_data_changed.py (refuse: a changed source refused on resume naming it;
                         restart_epoch: the epoch's plan from its first batch), tests/integration/test_run_identity.py
  parallel.attention_kernel
                         tests/unit/parallel/test_flash_impl.py (the kernel each device gets, the refusals, activation
                         through torch's registry; cudnn: the blocks' backend, handed over by the run's module),
                         tests/unit/core/test_step.py (a run's setting reaches the registry),
                         test_bad_input_is_refused_before_the_run (FlashAttention-4 and cuDNN on a CPU run),
                         tests/integration/test_cuda_paths.py (cuDNN's blocks through its stand-in)
  parallel.compile_blocks tests/integration/test_compile_blocks.py (compiled equals eager, fp32 rtol 1e-5, with
                         documents and checkpointing; no recompile for a new batch's documents; the run's module
                         compiles its blocks)
  parallel.keep_attention tests/unit/parallel/test_keep_attention.py (bitwise equal to recompute, half the ring
                         forwards; refused without checkpointing), tests/integration/test_keep_attention_ranks.py
                         (cp 2 over gloo), tests/unit/plan/test_keep_attention_plan.py (planned time and memory)
  parallel.keep_attention_blocks
                         tests/unit/parallel/test_keep_attention.py (the first block alone keeps: its forwards spared
                         and its output offloaded, exact), tests/unit/plan/test_keep_attention_plan.py (charged per
                         block), test_keep_attention_blocks_reach_the_model, tests/integration/test_train.py
                         (more blocks than the model's refused before the run)
  parallel.document_mask, data.positions
                         tests/unit/core/test_documents.py (the packed batch equals its examples one by one;
                         off, it does not; positions restart per example; their default follows the mask)

Shown here: grad_clip (one process and FSDP2 + cp=2), weight_decay, betas, text/vision_weight,
lr, warmup_steps, schedule, min_lr_ratio, batch_size, global_batch, stage sources, data.seed,
weighting, max_frames, fps, sample, vqgan_checkpoint, the sources' overflow and repeat,
model.overrides, parallel.mode / layout / activation_checkpointing on the sharded path,
activation_checkpointing in one process, trainer.seed, accelerator, devices, num_nodes,
precision, log_every, checkpoint_every, keep_checkpoints, peak_tflops, export=true, stage_only
(the other stages do not run), schedule name, data.holdout with trainer.val_every.

Longer than most test files: it is the one catalogue of the config's fields.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from train_runs import DEBUG, composed  # noqa: E402 (the tests' debug overrides: tests/train_runs.py)

from lwm.arg_types import from_args
from lwm.configs import from_dict
from lwm.core.config import (
    OptimConfig,
    ParallelConfig,
    StageConfig,
    TrainerConfig,
    resolve_stage,
    stage_model_config,
    validate,
)
from lwm.core.step import clip_grad_norm, lr_lambda, training_objective
from lwm.data import SkippedTooMany, TooLittleData, Vocab
from lwm.eval import needle
from lwm.eval.needle import NeedleConfig, NeedleGrid
from lwm.infer.runtime import ModelOptions
from lwm.model import ModelConfig, Transformer, token_coefficients
from lwm.paths import REPO
from lwm.train import evaluate
from lwm.train.datamodule import LWMDataModule
from lwm.train.entry import ensure_sample_data
from lwm.train.module import LWMModule
from lwm.train.run import run_schedule

ROOT = REPO
CONF = ROOT / "conf"


def run_config(out, *overrides):
    return composed(f"trainer.out_dir={out}", *DEBUG, *overrides)


def metrics(out: Path, stage: str = "a", key: str = "train/loss") -> dict[int, float]:
    rows = csv.DictReader(open(out / stage / "logs" / "metrics.csv"))
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The bundled sample data (made on first use, as train.py does); tests run in the repo root."""
    with contextlib.chdir(ROOT):
        ensure_sample_data(run_config(tmp_path_factory.mktemp("x")).data)
    return ROOT / "data" / "sample"


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # conf/data paths are relative to the repository


@pytest.fixture(scope="module")
def initial(sample, tmp_path_factory):
    """Stage a's first 10 batches through its initial weights, no training: per step the loss and
    the gradient norm (fp64)."""
    run = run_config(tmp_path_factory.mktemp("x"))
    stage = run.schedule.stages[0]
    with contextlib.chdir(ROOT):
        module = LWMModule(stage_model_config(run.model, stage), stage, run.optim, run.parallel)
        module.configure_model()
        dm = LWMDataModule(run.data.for_stage(stage, stage.per_rank_batch(1)), seq_len=stage.seq_len)
        it = iter(dm.train_dataloader())
        result = {}
        for step in range(stage.steps):
            b = dm.on_before_batch_transfer(next(it))
            coeff = token_coefficients(
                b["loss_weight"], b["vision_mask"], run.optim.text_weight, run.optim.vision_weight
            )
            module.model.zero_grad()
            loss = module.model(b["tokens"], b["positions"], targets=b["targets"], loss_coeff=coeff).loss
            loss.backward()
            norm = sum(p.grad.double().pow(2).sum() for p in module.model.parameters()).sqrt()
            result[step] = (loss.item(), norm.item())
    return result


def assert_frozen_with_true_norms(out: Path, initial: dict):
    """A clip of 1e-9 leaves AdamW (eps 1e-8) almost no step: every loss is the initial weights'
    loss on that batch, and every logged norm is the unclipped norm of those weights' gradient."""
    loss, norm = metrics(out), metrics(out, key="train/grad_norm")
    assert sorted(loss) == sorted(norm) == list(range(10))
    for step, (ref_loss, ref_norm) in initial.items():
        assert loss[step] == pytest.approx(ref_loss, abs=1e-3), step  # learning moves it by > 0.05
        assert norm[step] == pytest.approx(ref_norm, rel=1e-3), step  # fp32 sums of ~1M squares; clipped: 1e-9
        assert ref_norm > 1.0  # so the default clip (1.0) is active too


# ----------------------------------------------------------------------------------- grad_clip


@pytest.fixture(scope="module")
def frozen_run(sample, tmp_path_factory):
    """One process in this process, clip 1e-9; also peak_tflops (MFU logged) and export=true."""
    out = tmp_path_factory.mktemp("frozen")
    run_schedule(run_config(out, "stage_only=a", "optim.grad_clip=1e-9", "trainer.peak_tflops=1.0", "export=true"))
    return out


@pytest.fixture(scope="module")
def learning_run(sample, tmp_path_factory):
    """One process, the default clip; also log_every, checkpoint_every and keep_checkpoints."""
    import lightning as L

    out = tmp_path_factory.mktemp("learning")
    saved, save = [], L.Trainer.save_checkpoint

    def recording(trainer, *args, **kwargs):  # the steps at which checkpoints are written
        saved.append(trainer.global_step)
        return save(trainer, *args, **kwargs)

    L.Trainer.save_checkpoint = recording
    try:
        run_schedule(
            run_config(
                out,
                "stage_only=a",
                "trainer.log_every=3",
                "trainer.checkpoint_every=4",
                "trainer.keep_checkpoints=true",
            )
        )
    finally:
        L.Trainer.save_checkpoint = save
    (out / "saved_steps.json").write_text(json.dumps(saved))
    return out


def test_tiny_clip_freezes_the_loss_and_logs_the_true_norm(frozen_run, initial):
    assert_frozen_with_true_norms(frozen_run, initial)


def test_default_clip_learns(learning_run, initial):
    loss = metrics(learning_run)
    assert OptimConfig().grad_clip == 1.0
    assert loss[8] < initial[8][0] - 0.05, (loss, initial)
    norms = metrics(learning_run, key="train/grad_norm")
    assert norms[2] > 0 and norms[2] != pytest.approx(initial[2][1], rel=1e-3)  # the weights moved


def test_clip_grad_norm_semantics():
    torch.manual_seed(0)
    params = [
        torch.nn.Parameter(torch.zeros(3, 4)),
        torch.nn.Parameter(torch.zeros(5)),
        torch.nn.Parameter(torch.zeros(2)),
    ]
    grads = [torch.randn_like(p) for p in params]
    full = torch.cat([g.flatten() for g in grads]).norm()
    for max_norm in (None, 0.0, 1e9):  # no clipping
        for p, g in zip(params, grads):
            p.grad = g.clone()
        assert clip_grad_norm(params, max_norm) == pytest.approx(full.item())
        assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
    params[2].grad = None  # a parameter without a gradient is left out
    for p, g in zip(params[:2], grads):
        p.grad = g.clone()
    before = torch.cat([g.flatten() for g in grads[:2]]).norm()
    assert clip_grad_norm(params, 0.5) == pytest.approx(before.item())
    after = torch.cat([p.grad.flatten() for p in params[:2]]).norm()
    assert after == pytest.approx(0.5, rel=1e-5)
    with pytest.raises(ValueError, match="optim.grad_clip must be >= 0 .* got -1.0"):
        OptimConfig(grad_clip=-1.0)


# ------------------------------------------------------------------------- the sharded path


def _sharded_worker(rank, world):
    """parallel.* and trainer.seed on the FSDP2 + context-parallel path, and clipping of DTensor
    gradients against one process."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.device_mesh import init_device_mesh

    from lwm.parallel import global_group_counts, positions, shard
    from lwm.train.run import full_state

    cfg = ModelConfig.from_preset("debug")
    stage = StageConfig("a", seq_len=32, rope_theta=1e4, steps=1, lr=1e-3, cp=world)
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("data_parallel", "tensor_parallel"))
    out = {}
    for mode, layout, ac in (("ring", "striped", False), ("ulysses", "zigzag", True)):
        module = LWMModule(
            cfg, stage, OptimConfig(), ParallelConfig(layout=layout, mode=mode, activation_checkpointing=ac), seed=1
        )
        module._device_mesh = mesh  # what Lightning's ModelParallelStrategy sets
        module.configure_model()
        fn = module.model.layers[0].attn.attn_fn
        checkpointed = isinstance(module.model.layers[0], CheckpointWrapper)
        out[mode] = (fn.func.__name__, fn.keywords["layout"], checkpointed)
    torch.manual_seed(1)
    ref = Transformer(cfg)  # one process, seed 1
    state = full_state(module)
    if rank == 0:
        out["same_init"] = all(torch.equal(state[k], v) for k, v in ref.state_dict().items())
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, cfg.vocab_size, (2, 33), generator=g)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (2, 32)
    lw, vm = torch.ones(2, 32), torch.rand(2, 32, generator=g) > 0.5
    ref(inputs, targets=targets, loss_coeff=token_coefficients(lw, vm)).loss.backward()
    ref_norm = sum(p.grad.double().pow(2).sum() for p in ref.parameters()).sqrt().item()
    sh = lambda t: shard(t, 1, rank, world, "zigzag")  # noqa: E731  (B, 32) -> (B, 32 / world)
    coeff = token_coefficients(sh(lw), sh(vm), counts=global_group_counts(sh(lw), sh(vm)))
    loss = module.model(sh(inputs), positions(32, rank, world, "zigzag"), targets=sh(targets), loss_coeff=coeff).loss
    (loss * world).backward()  # as training_step: FSDP averages over the ranks
    norm = clip_grad_norm(module.model.parameters(), ref_norm / 2)
    after = sum(p.grad.full_tensor().double().pow(2).sum() for p in module.model.parameters()).sqrt().item()
    out.update(ref_norm=ref_norm, norm=norm.item(), after=after)
    return out


def test_parallel_fields_and_clipping_on_the_sharded_path():
    from lwm.parallel.launch import run_distributed

    for rank, res in enumerate(run_distributed(_sharded_worker, 2)):
        assert res["ring"] == ("ring_attention", "striped", False)
        assert res["ulysses"] == ("ulysses_attention", "zigzag", True)  # checkpointed blocks
        assert res.get("same_init", True)  # trainer.seed: rank 0 broadcasts one process's seed-1 weights
        assert res["norm"] == pytest.approx(res["ref_norm"], rel=1e-4), rank
        assert res["after"] == pytest.approx(res["ref_norm"] / 2, rel=1e-4), rank


# ------------------------------------------------------------------------- module-level fields


def debug_module(stage=None, optim=None, parallel=None, seed=0) -> LWMModule:
    stage = stage or StageConfig("a", seq_len=32, rope_theta=1e4, steps=10, lr=1e-2)
    module = LWMModule(
        ModelConfig.from_preset("debug"), stage, optim or OptimConfig(), parallel or ParallelConfig(), seed=seed
    )
    module.configure_model()
    return module


def test_weight_decay_betas_and_lr_reach_adamw():
    module = debug_module(optim=OptimConfig(weight_decay=0.1, betas=(0.5, 0.6)))
    optimizer = module.configure_optimizers()["optimizer"]
    for p in module.model.parameters():
        p.grad = torch.zeros_like(p)
    before = [p.detach().clone() for p in module.model.parameters()]
    optimizer.step()  # zero gradients: only weight decay moves a weight
    for p, b in zip(module.model.parameters(), before):
        expected = b * (1 - 1e-2 * 0.1) if p.dim() >= 2 else b  # norms' weights are not decayed
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7)
    module = debug_module(optim=OptimConfig(betas=(0.5, 0.6)))
    optimizer = module.configure_optimizers()["optimizer"]
    p = next(module.model.parameters())
    p.grad = torch.ones_like(p)
    optimizer.step()
    state = optimizer.state[p]  # moments after one step: (1 - beta1) * grad, (1 - beta2) * grad^2
    assert torch.allclose(state["exp_avg"], torch.full_like(p, 0.5))
    assert torch.allclose(state["exp_avg_sq"], torch.full_like(p, 0.4))


def test_lr_schedule_fields():
    def factors(**kw):
        stage = StageConfig("a", seq_len=8, rope_theta=1e4, steps=10, lr=2e-3, **kw)
        module = debug_module(stage=stage)
        opt = module.configure_optimizers()
        sched = opt["lr_scheduler"]["scheduler"]
        assert sched.base_lrs == [2e-3, 2e-3]  # stage.lr
        return [lr_lambda(stage)(s) for s in range(11)]

    assert factors() == [1.0] * 11
    assert factors(warmup_steps=4)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cos = factors(schedule="cosine", min_lr_ratio=0.2, warmup_steps=2)
    assert cos[2] == pytest.approx(1.0) and cos[10] == pytest.approx(0.2)
    assert cos[6] == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factors(schedule="cosine", min_lr_ratio=0.0)[10] == pytest.approx(0.0)


def test_text_and_vision_weights_reach_the_loss():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 512, (1, 33), generator=g)
    batch = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "positions": torch.arange(32),
        "loss_weight": torch.ones(1, 32),
        "vision_mask": torch.arange(32).view(1, 32) % 2 == 0,
        "segment_ids": torch.ones(1, 32, dtype=torch.int32),
    }

    def step_loss(tw, vw):
        module = debug_module(optim=OptimConfig(text_weight=tw, vision_weight=vw))
        with torch.no_grad():  # what the training step (lwm.core.step.train_step) runs backward on
            got, _ = training_objective(module.model, batch, module.optim, None, module.parallel.document_mask)
            expected = module.model(
                batch["tokens"],
                batch["positions"],
                targets=batch["targets"],
                loss_coeff=token_coefficients(batch["loss_weight"], batch["vision_mask"], tw, vw),
            ).loss
        return got.item(), expected.item()

    text_only, vision_only = step_loss(1.0, 0.0), step_loss(0.0, 1.0)
    assert text_only[0] == pytest.approx(text_only[1]) and vision_only[0] == pytest.approx(vision_only[1])
    assert text_only[0] != pytest.approx(vision_only[0])


def test_activation_checkpointing_recomputes_blocks_in_one_process():
    tokens = torch.randint(0, 512, (1, 17))
    calls = []
    for ac in (False, True):
        module = debug_module(parallel=ParallelConfig(activation_checkpointing=ac))
        n = []
        module.model.layers[0].attn.register_forward_hook(lambda *_: n.append(1))
        module.model(tokens[:, :-1], targets=tokens[:, 1:]).loss.backward()
        calls.append(len(n))
    assert calls == [1, 2]  # once in forward; again in backward when checkpointed


def test_keep_attention_blocks_reach_the_model():
    """The run's module hands parallel.keep_attention_blocks to the checkpointing: only the first block (of the
    debug model's 2) keeps its attention, its head groups' recompute included."""
    from lwm.parallel import kept

    for blocks, expected in ((None, [True, True]), (1, [True, False])):
        parallel = ParallelConfig(activation_checkpointing=True, keep_attention=True, keep_attention_blocks=blocks)
        module = debug_module(parallel=parallel)
        groups = [layer.attn.group_context_fn is kept.group_contexts for layer in module.model.layers]
        assert groups == expected, (blocks, groups)


def test_seed_sets_the_initial_weights():
    a, b, a2 = debug_module(seed=0), debug_module(seed=1), debug_module(seed=0)
    w = lambda m: m.model.layers[0].attn.wq.weight  # noqa: E731
    assert torch.equal(w(a), w(a2)) and not torch.equal(w(a), w(b))


# --------------------------------------------------------------------------- run wiring


class _Stop(Exception):
    pass


class _FakeTrainer:
    """Stands in for L.Trainer in run_stage: records what it was built with and given."""

    seen: dict = {}

    def __init__(self, **kwargs):
        _FakeTrainer.seen = dict(kwargs)

    def fit(self, module, datamodule=None, ckpt_path=None):
        flushed = (torch.tensor([1e-40]) * 1.0).item() == 0.0  # a denormal float computed as zero
        _FakeTrainer.seen.update(module=module, datamodule=datamodule, flushed=flushed)
        raise _Stop


def test_run_stage_hands_every_field_to_its_component(sample, tmp_path, monkeypatch):
    import lightning

    from lwm.train.run import run_stage

    monkeypatch.setattr(lightning, "Trainer", _FakeTrainer)
    run = run_config(
        tmp_path,
        "trainer.devices=2",
        "trainer.num_nodes=2",
        "+schedule.stages.0.cp=2",
        "+schedule.stages.0.global_batch=6",
        "trainer.precision=bf16-mixed",
        "trainer.accelerator=cpu",
        "trainer.log_every=7",
        "trainer.timeout_s=123",
        "trainer.peak_tflops=5.0",
        "trainer.seed=4",
        "stop_at_step=3",
        "parallel.layout=zigzag",
        "trainer.checkpoint_every=2",
    )
    stage = run.schedule.stages[0]
    resolved = []
    monkeypatch.setattr("lwm.train.run.resolve_stage", lambda *a: resolved.append(resolve_stage(*a)) or resolved[-1])
    with pytest.raises(_Stop):
        run_stage(run, stage, None)
    # the stage resolved once, and what the components got is what it resolved
    (setup,) = resolved
    assert setup.stage is stage and (setup.dims.dp, setup.dims.cp, setup.per_rank_batch, setup.global_batch) == (
        2, 2, 3, 6,
    )  # fmt: skip
    assert setup.model == stage_model_config(run.model, stage) and setup.model.rope_theta == stage.rope_theta
    assert setup.data.batch_size == 3 and [s.path for s in setup.data.sources] == [
        run.data.sources[n].path for n in stage.sources or run.data.sources
    ]
    seen = _FakeTrainer.seen
    assert seen["module"].model_config is setup.model and seen["datamodule"].config is setup.data
    assert (seen["accelerator"], seen["devices"], seen["num_nodes"], seen["precision"]) == ("cpu", 2, 2, "bf16-mixed")
    assert (seen["max_steps"], seen["log_every_n_steps"]) == (3, 7)
    strategy = seen["strategy"]  # world 4 = dp 2 x cp 2
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size, strategy._timeout.total_seconds()) == (
        2,
        2,
        123,
    )
    dm = seen["datamodule"]
    assert (dm.config.batch_size, dm.sharding.cp_size, dm.sharding.layout) == (3, 2, "zigzag")  # global_batch 6 / dp 2
    throughput = next(c for c in seen["callbacks"] if type(c).__name__ == "Throughput")
    assert throughput.peak_tflops == 5.0 and throughput.tokens_per_step == 6 * 64
    checkpoint = next(c for c in seen["callbacks"] if hasattr(c, "_every_n_train_steps"))
    assert checkpoint._every_n_train_steps == 2
    module = seen["module"]
    assert module.optim is run.optim and module.parallel is run.parallel
    assert module.seed == 4, "run_stage must pass seed=cfg.trainer.seed to LWMModule"


@pytest.mark.parametrize("on", [True, False])
def test_flush_denormal_is_in_force_when_training_starts(sample, tmp_path, monkeypatch, on):
    import lightning

    from lwm.train.run import run_schedule

    if on and not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormal floats")
    monkeypatch.setattr(lightning, "Trainer", _FakeTrainer)
    try:
        with pytest.raises(_Stop):
            run_schedule(run_config(tmp_path, "stage_only=a", f"trainer.flush_denormal={str(on).lower()}"))
    finally:
        torch.set_flush_denormal(False)
    assert _FakeTrainer.seen["flushed"] is on
    assert (torch.tensor([1e-40]) * 1.0).item() != 0.0  # and as it was once training returns


def test_world_size_counts_nodes_and_global_batch_is_split():
    assert TrainerConfig(devices=2, num_nodes=3).world_size == 6
    stage = StageConfig("s", seq_len=8, rope_theta=1e4, steps=1, lr=1e-3, cp=2, batch_size=5, global_batch=8)
    assert stage.check_world(8) == 4 and stage.per_rank_batch(4) == 2  # batch_size is ignored
    assert StageConfig("s", seq_len=8, rope_theta=1e4, steps=1, lr=1e-3, batch_size=5).per_rank_batch(4) == 5
    with pytest.raises(ValueError, match="global_batch 8 is not divisible by dp 3"):
        stage.per_rank_batch(3)


def test_trainer_fields_in_a_run(frozen_run, learning_run):
    assert metrics(frozen_run, key="perf/mfu")  # peak_tflops > 0
    assert not metrics(learning_run, key="perf/mfu")  # peak_tflops 0: not logged
    assert sorted(metrics(learning_run)) == [2, 5, 8, 9]  # log_every 3, and the stage's last step
    ckpt = torch.load(learning_run / "a" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 10  # kept (keep_checkpoints): saved again at the end of the stage
    assert json.loads((learning_run / "saved_steps.json").read_text()) == [4, 8, 10]  # checkpoint_every 4
    assert not (frozen_run / "a" / "checkpoints").exists()  # keep_checkpoints false
    assert (frozen_run / "hf" / "config.json").is_file() and not (learning_run / "hf").exists()  # export
    assert not (frozen_run / "b").exists()  # stage_only=a


# ------------------------------------------------------------------------------- data fields


def test_strict_max_line_bytes_and_max_skipped_fraction_reach_the_stream(tmp_path):
    """conf/data has the three (no '+'); each reaches the stage's PackedStream, which applies them."""
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"text": "red circle"}) + "\n")
    custom = [
        "data=custom",
        "data.tokenizer=data/sample/tokenizer.model",
        f"data.sources={{text: {{path: {src}, fields: text}}}}",
    ]
    default = run_config(tmp_path, *custom).data
    assert (default.strict, default.max_line_bytes, default.max_skipped_fraction) == (False, 64 * 2**20, 0.5)
    spec = run_config(
        tmp_path, *custom, "data.strict=true", "data.max_line_bytes=100", "data.max_skipped_fraction=0.25"
    ).data
    stage = StageConfig("s", seq_len=8, rope_theta=1e4, steps=1, lr=1e-3)
    dm = LWMDataModule(spec.for_stage(stage, 1), seq_len=8)
    dm.setup()
    stream = dm.stream
    assert (stream.strict, stream.max_line_bytes, stream.max_skipped_fraction) == (True, 100, 0.25)
    assert stream.indexes[0].reader.max_line_bytes == 100  # the source's reader has the limit


def test_num_workers_index_dir_and_index_workers_reach_the_loader_and_the_index(tmp_path, monkeypatch):
    """conf/data has the three; num_workers is the training loader's, index_dir holds the sources' indexes,
    index_workers processes index a large source."""
    import lwm.data.index as index

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"red circle {i}"}) + "\n" for i in range(40)))
    custom = [
        "data=custom",
        "data.tokenizer=data/sample/tokenizer.model",
        f"data.sources={{text: {{path: {src}, fields: text}}}}",
    ]
    from omegaconf import OmegaConf

    for group in ("sample", "custom"):  # run_config's DEBUG sets num_workers 0
        default = OmegaConf.load(CONF / "data" / f"{group}.yaml")
        assert (default.num_workers, default.index_dir, default.index_workers) == (2, None, 8)
    spec = run_config(
        tmp_path, *custom, "data.num_workers=1", f"data.index_dir={tmp_path / 'idx'}", "data.index_workers=2"
    ).data
    monkeypatch.setattr(index, "PARALLEL_FROM", 30)
    pools, gather = [], index._gather

    def spy(results, *rest):
        pools.append(type(results).__name__)
        gather(results, *rest)

    monkeypatch.setattr(index, "_gather", spy)
    stage = StageConfig("s", seq_len=8, rope_theta=1e4, steps=1, lr=1e-3)
    dm = LWMDataModule(spec.for_stage(stage, 1), seq_len=8)
    dm.setup()
    assert dm.stream.indexes[0].file.parent == tmp_path / "idx"
    assert pools == ["IMapIterator"]  # the pool's results: indexed by index_workers processes
    assert dm.train_dataloader().num_workers == 1
    with pytest.raises(ValueError, match="data.num_workers must be >= 0, got -1"):
        run_config(tmp_path, *custom, "data.num_workers=-1")


def first_sequences(spec, seq_len=64, sources=("text",), n=2):
    stage = StageConfig("s", seq_len=seq_len, rope_theta=1e4, steps=1, lr=1e-3, sources=list(sources))
    dm = LWMDataModule(spec.for_stage(stage, 1), seq_len=seq_len)
    dm.setup()
    return dm, list(dm.stream.sequences(0))[:n] if n else list(dm.stream.sequences(0))


def test_data_seed_weighting_and_stage_sources(sample, tmp_path):
    run = run_config(tmp_path)
    spec = run.data
    stage = run.schedule.stages[0]
    assert [s.path for s in spec.for_stage(stage, 1).sources] == ["data/sample/text.jsonl"]  # sources: [text]
    all_sources = StageConfig("s", seq_len=8, rope_theta=1e4, steps=1, lr=1e-3)
    assert len(spec.for_stage(all_sources, 1).sources) == len(spec.sources) == 6  # no stage sources: all of conf/data
    _, a = first_sequences(spec)
    spec.seed = 1
    _, b = first_sequences(spec)
    assert not all((x.tokens == y.tokens).all() for x, y in zip(a, b))  # another order
    spec.seed, spec.weighting = 0, "token"
    _, t = first_sequences(spec)
    assert set(a[0].loss_weight.tolist()) - {0.0, 1.0} and set(t[0].loss_weight.tolist()) <= {0.0, 1.0}


def test_source_overflow_and_repeat(sample, tmp_path):
    spec = run_config(tmp_path).data
    _, once = first_sequences(spec, n=None)
    spec.sources["text"] = dataclasses.replace(spec.sources["text"], repeat=2)
    _, twice = first_sequences(spec, n=None)
    assert abs(len(twice) - 2 * len(once)) <= 1
    spec.sources["text"] = dataclasses.replace(spec.sources["text"], repeat=1, overflow="drop")
    assert len(once) > 0
    with pytest.raises(TooLittleData, match=r"text\.jsonl\) yield fewer than one global batch"):
        first_sequences(spec, n=None)  # every document is longer than 64 tokens: all dropped


def test_max_frames_and_fps(sample, tmp_path):
    spec = run_config(tmp_path).data
    eof, eov = Vocab(4096).eof, Vocab(4096).eov

    def frame_ends(**kw):
        for k, v in kw.items():
            setattr(spec, k, v)
        dm, seqs = first_sequences(spec, seq_len=2048, sources=["captions"], n=1)
        assert dm.vocab.eof == eof
        tokens = seqs[0].tokens
        return int((tokens == eof).sum()), int((tokens == eov).sum())

    four = frame_ends(max_frames=4, fps=None)
    one = frame_ends(max_frames=1, fps=None)
    assert four[0] == 3 * four[1] > 0  # 4 frames a video: 3 <eof> and an <eov>
    assert one[0] == 0 < one[1]
    # fps takes effect too: the sample's codes were tokenized by count, so a rate is refused for every
    # caption (lwm.data.sampling: the frames on screen at the ticks are not in such a cache)
    spec.max_frames, spec.fps = None, 0.01
    with pytest.raises(SkippedTooMany, match=r"(\d+) of the \1 examples of an epoch are skipped \(100%\)"):
        first_sequences(spec, seq_len=2048, sources=["captions"], n=1)  # data.max_skipped_fraction 0.5
    spec.max_skipped_fraction = 1.0  # never stop: and nothing to train on
    with pytest.raises(TooLittleData, match=r"48 of 48 examples skipped"):
        first_sequences(spec, seq_len=2048, sources=["captions"], n=1)


def test_sample_and_vqgan_checkpoint(tmp_path, monkeypatch):
    import lwm.train.entry as entry

    run = run_config(tmp_path, "data.tokenizer=/no/tokenizer.model")
    validate(run)  # data.sample: made (and then checked) on first use
    run.data.sample = False
    with pytest.raises(FileNotFoundError, match="data.tokenizer /no/tokenizer.model does not exist"):
        validate(run)
    calls = []  # lwm-tokenize's run, given its config
    monkeypatch.setattr(entry.tokenize, "run", lambda config: calls.append(config) or 0)
    data = run.data
    vqgan = "data/checkpoints/vqgan_tiny.safetensors"
    data.codes, data.vqgan_checkpoint, data.max_frames, data.fps = str(tmp_path), vqgan, 3, None
    ensure_sample_data(data)
    data.fps = 0.5
    ensure_sample_data(data)
    assert (calls[0].max_frames, calls[0].fps, calls[0].checkpoint) == (3, None, Path(vqgan))
    assert (calls[1].max_frames, calls[1].fps) == (None, 0.5)
    assert (calls[0].out, calls[0].vqgan, calls[0].ids) == (tmp_path, "tiny", "stem")


def test_runs_started_together_tokenize_the_sample_once(tmp_path, monkeypatch):
    """Two runs on a fresh clone at once: the second waits while the first tokenizes the sample's
    videos, then finds the codes made (lwm-tokenize would refuse a folder another run is writing)."""
    import threading
    import time

    import lwm.train.entry as entry

    calls = []

    def tokenize_slowly(config):
        calls.append(config)
        time.sleep(1)
        (config.out / "manifest.jsonl").write_text("{}\n")
        (config.out / "failures.jsonl").write_text("")
        return 0

    monkeypatch.setattr(entry.tokenize, "run", tokenize_slowly)
    data = run_config(tmp_path).data
    data.codes = str(tmp_path)
    runs = [threading.Thread(target=ensure_sample_data, args=(data,)) for _ in "ab"]
    for t in runs:
        t.start()
    for t in runs:
        t.join(60)
    assert len(calls) == 1


# --------------------------------------------------------------------------- model and names


def test_conf_models_are_the_presets():
    """conf/model/<name>.yaml writes out every field of lwm.model.config's preset <name> (7b with
    2048-token loss chunks), so the YAML shows the model it builds and the two cannot drift."""
    from omegaconf import OmegaConf

    from lwm.model.config import PRESETS

    names = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
    assert names == sorted(PRESETS)
    for name in names:
        fields = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml"))
        expected = PRESETS[name].replace(**({"loss_chunk_size": 2048} if name == "7b" else {}))
        assert fields == dataclasses.asdict(expected), name


def test_model_fields_and_schedule_name(tmp_path):
    run = run_config(tmp_path, "model.n_layers=3")
    assert run.model.n_layers == 3 and ModelConfig.from_preset("debug").n_layers == 2
    big = composed(f"trainer.out_dir={tmp_path}", "model=7b")
    assert big.model.loss_chunk_size == 2048 != ModelConfig.from_preset("7b").loss_chunk_size
    run = run_config(tmp_path, "stage_only=zz", "schedule.name=mine")
    with pytest.raises(ValueError, match="stage_only 'zz' is not a stage of schedule 'mine'"):
        validate(run)


def test_rope_scaling_from_the_model_group_and_kept_by_the_stages(tmp_path):
    """model.rope_scaling (conf/model/llama3_8b.yaml; null elsewhere) reaches the run's ModelConfig
    as a RopeScaling, each of its fields can be set from the command line, and a stage replaces only
    the base theta (tests/unit/model/test_model.py: each field changes the angles; tests/unit/interop/test_hf.py: the
    logits equal transformers' "llama3" RoPE)."""
    from lwm.model import RopeScaling

    run = run_config(
        tmp_path, "model=llama3_8b", "model.rope_scaling.factor=4", "model.rope_scaling.original_max_seq_len=64"
    )
    assert run.model.rope_scaling == RopeScaling(factor=4.0, original_max_seq_len=64)
    assert run.model.n_kv_heads == 8 and run.model.rope_theta == 5e5
    assert run_config(tmp_path).model.rope_scaling is None
    debug = run_config(tmp_path, "model.rope_scaling={low_freq_factor:2.0,high_freq_factor:3.0}").model.rope_scaling
    assert debug == RopeScaling(low_freq_factor=2.0, high_freq_factor=3.0)
    stage = StageConfig("long", seq_len=200_000, rope_theta=5e7, steps=1, lr=1e-5)
    staged = stage_model_config(run.model, stage)
    assert (staged.rope_theta, staged.rope_scaling, staged.max_seq_len) == (5e7, run.model.rope_scaling, 200_000)
    saved = json.loads(json.dumps(dataclasses.asdict(staged)))  # a stage folder's model_config.json
    assert from_dict(ModelConfig, saved) == staged


def test_holdout_and_val_every_give_validation_losses(sample, tmp_path):
    """data.holdout=1 (a held-out example of every source) and trainer.val_every=5: val/loss every
    5 steps of the 10-step stage (tests/integration/test_learning.py: val_every=0 gives one, at the end)."""
    run_schedule(run_config(tmp_path, "stage_only=a", "data.holdout=1", "trainer.val_every=5"))
    rows = list(csv.DictReader(open(tmp_path / "a" / "logs" / "metrics.csv")))
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and all(math.isfinite(v) for v in val), val


def test_evaluate_is_the_needle_commands_grid(tmp_path, monkeypatch, capsys):
    """evaluate.* is lwm/eval/needle.py's NeedleGrid: every field set in the run's config reaches the
    command's run(config), in a process of its own without the launcher's variables, on the last
    stage's weights, the run's tokenizer and <out_dir>/needle; the printed command line gives that
    config. The default run keeps its own grid (the README's: 128/512/2K, depths 0/50/100, 4 trials)."""
    default = composed(f"trainer.out_dir={tmp_path}").evaluate
    assert default == NeedleGrid(
        lengths=[128, 512, 2048],
        depths=[0, 50, 100],
        trials=4,
        haystack="data/sample/needles/128/haystack.txt",
        max_new_tokens=4,
        digits=1,
        instruction=False,
    )
    fields = ["lengths=[100,200]", "depths=[5,95]", "trials=3", "needles=2", "ask=1", "haystack=h.txt"]
    fields += ["max_new_tokens=2", "seed=7", "digits=2", "instruction=true"]
    run = run_config(tmp_path, *(f"evaluate.{f}" for f in fields))
    given = []
    monkeypatch.setattr(evaluate, "run_in_child", lambda fn, config, env: given.append((fn, config, env)) or 0)
    monkeypatch.setenv("RANK", "0")
    found = evaluate.evaluate_needles(run.evaluate, tmp_path / "b", run.data.tokenizer, tmp_path / "needle", "cpu")
    assert found == tmp_path / "needle" / "needle.json"
    ((fn, config, env),) = given
    assert fn is needle.run and "RANK" not in env
    assert config.grid == NeedleGrid(
        lengths=[100, 200],
        depths=[5, 95],
        trials=3,
        needles=2,
        ask=1,
        haystack="h.txt",
        max_new_tokens=2,
        seed=7,
        digits=2,
        instruction=True,
    )
    assert config.model == ModelOptions(model=str(tmp_path / "b"), tokenizer=run.data.tokenizer, device="cpu")
    assert config.out == str(tmp_path / "needle")
    line = capsys.readouterr().out.split("evaluating: -m lwm.eval.needle ")[1].split()
    assert from_args(NeedleConfig, needle.build_parser().parse_args(line)) == config
    with pytest.raises(
        ValueError, match=r"evaluate.depths must lie in 0..100 \(percent of the context\), got \[101.0\]"
    ):
        run_config(tmp_path, "evaluate.depths=[101]")

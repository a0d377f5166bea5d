"""Activation offload (lwm/parallel/offload.py): bit-exact training in one process and on gloo cp 2,
the CUDA engine's code path through late-completing stand-ins (tests/offload_standins.py) with the
two waits it must make, a run stopped and resumed with it, the planner's host memory, and the
config field."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from offload_standins import CopyContractError, StandInCuda
from train_runs import main_in_process

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import build_optimizer, train_step
from lwm.model import ModelConfig, Transformer
from lwm.parallel import (
    ActivationOffload,
    CudaCopyEngine,
    ParallelDims,
    SyncCopyEngine,
    apply_activation_checkpointing,
    apply_activation_offload,
    apply_context_parallel,
    build_meshes,
    build_parallel_model,
    compute_settings,
)
from lwm.parallel import offload as offload_file
from lwm.parallel.launch import run_distributed
from lwm.plan.fake import GPU_SETTINGS, make_batch
from lwm.plan.memory import Mesh, plan_step

CFG = ModelConfig.from_preset("debug").replace(n_layers=3)  # a middle block: fetched ahead, neither end
TILING = dict(attn_head_groups=2, norm_chunk_size=16, mlp_chunk_size=16)  # 32 tokens a rank: two chunks
TILED = CFG.replace(**TILING)
SEQ, STEPS = 32, 5
STAGE = StageConfig("a", seq_len=SEQ, rope_theta=1e4, steps=STEPS, lr=1e-2)
OPTIM = OptimConfig(weight_decay=0.1)


def standin_engine(cuda: StandInCuda) -> CudaCopyEngine:
    return CudaCopyEngine(
        "cpu",
        new_stream=cuda.new_stream,
        current_stream=cuda.current_stream,
        use_stream=cuda.use_stream,
        empty=cuda.empty,
    )


def _batch() -> dict:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CFG.vocab_size, (1, SEQ + 1), generator=g)
    return {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "positions": torch.arange(SEQ),
        "loss_weight": torch.ones(1, SEQ),
        "vision_mask": torch.arange(SEQ)[None] % 3 == 0,
        "segment_ids": torch.zeros(1, SEQ, dtype=torch.long),
    }


def one_process(offload: ActivationOffload | None, steps: int = STEPS, config: ModelConfig = CFG):
    """`steps` training steps of the checkpointed model in one process: (losses, parameters)."""
    torch.manual_seed(0)
    model = apply_activation_checkpointing(Transformer(config))
    if offload is not None:
        apply_activation_offload(model, offload)
    optimizer, scheduler = build_optimizer(model, STAGE, OPTIM)
    losses = [train_step(model, _batch(), optimizer, OPTIM, None, False, scheduler).loss for _ in range(steps)]
    return losses, [p.detach().clone() for p in model.parameters()]


def assert_bitwise(got, expected) -> None:
    (losses, params), (ref_losses, ref_params) = got, expected
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    assert len(params) == len(ref_params) and all(torch.equal(a, b) for a, b in zip(params, ref_params))


@pytest.fixture(scope="module")
def reference():
    return one_process(None)


def test_one_process_with_offload_equals_checkpointing_bitwise(reference, monkeypatch):
    """fp32, 5 steps: the same losses and parameters, bit for bit; only the residual stream goes to
    the host (one buffer per block, reused across the steps), RoPE's cos/sin stay."""
    copies = []
    copy = SyncCopyEngine.copy
    monkeypatch.setattr(
        SyncCopyEngine, "copy", lambda self, dst, src: copies.append(dst.device) or copy(self, dst, src)
    )
    offload = ActivationOffload(SyncCopyEngine("cpu"))
    assert_bitwise(one_process(offload), reference)
    ((key, buffers),) = offload._pool.items()
    assert key == (torch.Size([1, SEQ, CFG.dim]), torch.float32) and len(buffers) == CFG.n_layers
    assert offload.host_bytes == CFG.n_layers * SEQ * CFG.dim * 4
    # per step: each block's input out; back in for all but the last, used in place
    out, back = CFG.n_layers, CFG.n_layers - 1
    assert copies == ([torch.device("cpu")] * (out + back)) * STEPS


def test_the_cuda_engine_waits_for_its_copies(reference):
    """The CUDA engine's path with copies that end only when waited on: still bit-exact, every copy
    non_blocking between the model and pinned buffers allocated once, nothing in flight after a step."""
    cuda = StandInCuda()
    offload = ActivationOffload(standin_engine(cuda))
    assert_bitwise(one_process(offload), reference)
    assert len(cuda.pinned) == CFG.n_layers and all(cuda.non_blocking)
    assert len(cuda.copies) == (2 * CFG.n_layers - 1) * STEPS and cuda.in_flight() == []


def test_a_prefetched_input_used_before_its_copy_ends_breaks_the_step(reference, monkeypatch):
    """Without the compute stream's wait before a fetched input is used, the block recomputes from
    garbage (the stand-in's NaN until the copy's event is waited on): this test sees it."""
    monkeypatch.setattr(ActivationOffload, "_ready", lambda self, saved: None)
    cuda = StandInCuda()
    losses, params = one_process(ActivationOffload(standin_engine(cuda)), steps=1)
    assert torch.equal(losses[0], reference[0][0])  # the forward is right; backward read garbage
    assert any(p.isnan().any() for p in params)


def test_a_block_input_dropped_before_its_copy_out_ended_breaks_the_step(monkeypatch):
    """Without the compute stream's wait before a packed input's device memory is let go, the
    caching allocator could hand it out while the copy still reads it: the stand-in refuses."""

    def drop_without_waiting(self):
        if self._last is not None:
            self._last.device_tensor = None

    monkeypatch.setattr(ActivationOffload, "_drop_last", drop_without_waiting)
    with pytest.raises(CopyContractError):
        one_process(ActivationOffload(standin_engine(StandInCuda())), steps=1)


def _interleaved(offload: ActivationOffload):
    """Two forwards whose backwards interleave: the second forward packs while the first's
    prefetch is in flight (the order the pool must be safe in)."""
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(2, 8, generator=g).requires_grad_() for _ in range(3)]
    offload.new_pass()
    a0, a1 = offload.pack(x[0]), offload.pack(x[1])
    got1 = offload.unpack(a1)  # the forward's last input, used in place; starts a0's copy-in
    offload.new_pass()
    b0 = offload.pack(x[2])  # needs a host buffer of the same shape
    got = [offload.unpack(a0), got1, offload.unpack(b0)]
    return all(torch.equal(a, b) for a, b in zip(got, x))


class _EarlyRelease(ActivationOffload):
    """A defect: the host buffer goes back to the pool when its copy-in starts, not when it ended."""

    def _fetch(self, saved):
        super()._fetch(saved)
        self._give(saved)


def test_a_host_buffer_is_reused_only_after_its_copy_ends():
    assert _interleaved(ActivationOffload(standin_engine(StandInCuda())))
    with pytest.raises(CopyContractError, match="host buffer was reused while a copy on it was in flight"):
        _interleaved(_EarlyRelease(standin_engine(StandInCuda())))


def test_offload_needs_checkpointed_blocks_and_one_backward_and_leaves_small_tensors():
    with pytest.raises(ValueError, match="block 0 is not checkpointed"):
        apply_activation_offload(Transformer(CFG), ActivationOffload(SyncCopyEngine("cpu")))
    small = torch.ones(2, requires_grad=True)  # 8 bytes
    assert ActivationOffload(SyncCopyEngine("cpu"), min_bytes=9).pack(small) is small
    offload = ActivationOffload(SyncCopyEngine("cpu"))
    saved = offload.pack(small)
    offload.unpack(saved)
    with pytest.raises(RuntimeError, match="unpacked twice"):
        offload.unpack(saved)


# ------------------------------------------------------------------------- gloo, cp 2

CP_CASES = ("ring", "ulysses")


def _cp_worker(rank, world):
    """5 steps per mode on a cp-2 FSDP2 mesh with document masks, without and with offload."""
    settings = compute_settings(torch.device("cpu"), CFG.head_dim)
    parallel = ParallelConfig(activation_checkpointing=True)
    stage = dataclasses.replace(STAGE, cp=world, seq_len=64)
    results = {}
    for mode in CP_CASES:
        where = build_meshes(ParallelDims(1, world, 1, mode), "cpu", rank)
        batch = make_batch(CFG, 64, where, 2, parallel.layout, "cpu")  # 2 documents, masked
        for on in (False, True, "tiled"):  # tiled: head groups, tiled norms and MLP, no offload
            torch.manual_seed(0)
            init = Transformer(CFG).state_dict() if rank == 0 else {}
            offload = ActivationOffload(SyncCopyEngine("cpu")) if on is True else None
            config = TILED if on == "tiled" else CFG
            model = build_parallel_model(config, where, settings, "cpu", init, parallel.layout, True, offload)
            optimizer, scheduler = build_optimizer(model, stage, OPTIM)
            losses = [
                train_step(model, batch, optimizer, OPTIM, where.cp_group, True, scheduler).loss for _ in range(STEPS)
            ]
            params = [p.to_local().detach().clone() for p in model.parameters()]
            buffers = sum(len(b) for b in offload._pool.values()) if offload is not None else 0
            results[mode, on] = losses, params, buffers
    return results


def test_context_parallel_with_offload_equals_checkpointing_bitwise():
    for rank, results in enumerate(run_distributed(_cp_worker, 2)):
        for mode in CP_CASES:
            assert_bitwise(results[mode, True][:2], results[mode, False][:2])
            assert results[mode, True][2] == CFG.n_layers, (rank, mode)  # FSDP2's hooks pack nothing else
            assert_close_run(results[mode, "tiled"][:2], results[mode, False][:2])


def assert_close_run(got, expected) -> None:
    """Losses and parameters of a run whose sums are taken in another order (the head groups' output
    shares, the chunks' gradient sums), fp32, 5 AdamW steps at lr 1e-2. One step's loss and gradients
    agree to rtol 1e-6 (tests/unit/model/test_model.py, tests/integration/test_parallel_dist.py). Over 5 steps AdamW divides
    by sqrt(v): where a gradient is nearly zero its sign is the reordering's noise and the entry moves
    apart, and the losses drift (5e-7 in one process, 3.4e-6 on cp 2 alone, 6.1e-5 on cp 2 in a suite run of
    three workers: an entry moved by the noise changes the next losses). Which entries
    move, and how many, depends on the summation order, so on the threads the processes' OpenMP pool started
    with: the share within 1e-6 measured 96.6% to 99.95% alone and 76.4% in a suite run, the largest
    difference 2e-5 to 1.3e-4. So: the losses to rtol 2e-4, and every parameter to 1e-3, a tenth of one
    step's lr (a wrong gradient moves an entry by about lr each step); the share is not a property of the code."""
    (losses, params), (ref_losses, ref_params) = got, expected
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=2e-4, atol=0)
    diffs = torch.cat([(a - b).abs().flatten() for a, b in zip(params, ref_params, strict=True)])
    assert diffs.max() <= 1e-3, diffs.max()


def test_one_process_with_each_tiling_equals_the_plain_run(reference):
    """fp32, 5 steps of the checkpointed model: with head groups, tiled norms and the blockwise MLP
    (each alone and together) the losses and parameters are the plain run's."""
    for tiling in (dict(attn_head_groups=2), dict(norm_chunk_size=16), dict(mlp_chunk_size=16), TILING):
        assert_close_run(one_process(None, config=CFG.replace(**tiling)), reference)


# ------------------------------------------------------------------------- resume, planner, config


def test_a_run_stopped_and_resumed_with_offload_ends_as_an_uninterrupted_one(tmp_path, monkeypatch, capsys):
    """train.py in this process: 4 steps with checkpointing; the same stopped at step 2 and resumed
    with offload on (a run-only key: the folder takes it) ends with the same weights, bit for bit."""
    short = ["stage_only=a", "schedule.stages.0.steps=4", "parallel.activation_checkpointing=true"]
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "straight", *short)
    assert code == 0, err[-3000:]
    offload = [*short, "parallel.activation_offload=true"]
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "stopped", *offload, "stop_at_step=2")
    assert code == 4, err[-3000:]
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "stopped", *offload)
    assert code == 0 and "resuming from" in out + err, err[-3000:]
    straight = (tmp_path / "straight" / "a" / "final.safetensors").read_bytes()
    assert (tmp_path / "stopped" / "a" / "final.safetensors").read_bytes() == straight


def test_the_planner_puts_the_layer_inputs_in_host_memory():
    """lwm-plan's step under fake tensors (GPU settings: bf16): with offload the device peak falls
    and the meta device (the host) holds every block's input, (n_layers, 1, S, dim) bf16; the peak's
    breakdown is still the compute device's alone."""
    stage = dataclasses.replace(STAGE, seq_len=1024)
    plans = {}
    for on in (False, True):
        parallel = ParallelConfig(activation_checkpointing=True, activation_offload=on, document_mask=False)
        plans[on] = plan_step(CFG, stage, Mesh(1024, 1, 1), parallel, OptimConfig(), GPU_SETTINGS)
    layer_input = 1024 * CFG.dim * 2
    assert plans[False].host_peak == 0 and plans[True].host_peak == CFG.n_layers * layer_input
    # at the peak (in the head) the inputs of all blocks but the last are on the host
    assert plans[False].peak - plans[True].peak == (CFG.n_layers - 1) * layer_input
    assert sum(row["bytes"] for row in plans[True].breakdown) == plans[True].peak


def test_the_config_field_takes_effect_and_needs_checkpointing(monkeypatch):
    from lwm.core import step as step_file
    from lwm.core.step import activation_offload
    from lwm.train.module import LWMModule

    with pytest.raises(
        ValueError, match="parallel.activation_offload=true needs parallel.activation_checkpointing=true"
    ):
        ParallelConfig(activation_offload=True)
    assert activation_offload(ParallelConfig(activation_checkpointing=True), torch.device("cpu")) is None
    on = ParallelConfig(activation_checkpointing=True, activation_offload=True)
    cpu = activation_offload(on, torch.device("cpu"))
    assert isinstance(cpu.engine, SyncCopyEngine) and cpu.engine.host == torch.device("cpu")
    monkeypatch.setattr(step_file, "CudaCopyEngine", lambda device: ("cuda engine", device))
    assert activation_offload(on, torch.device("cuda", 1)).engine == ("cuda engine", torch.device("cuda", 1))
    # LWMModule's one-process model offloads: each block's input goes out, all but the last come back
    copies = []
    monkeypatch.setattr(offload_file.SyncCopyEngine, "copy", lambda self, dst, src: copies.append(dst.device))
    module = LWMModule(CFG, STAGE, OPTIM, on)
    module.configure_model()
    tokens = torch.randint(0, CFG.vocab_size, (1, SEQ + 1))
    module.model(tokens[:, :-1], targets=tokens[:, 1:]).loss.backward()
    assert copies == [torch.device("cpu")] * (2 * CFG.n_layers - 1)


@pytest.mark.parametrize(
    "family", [dict(qkv_bias=True), dict(qk_norm=True, head_dim_override=32), dict(tie_embeddings=True)]
)
def test_offload_with_each_familys_options_equals_checkpointing_bitwise(family):
    """A q/k/v bias, QK norm with wider heads, a tied head: offload changes nothing, bit for bit."""
    config = CFG.replace(**family)
    assert_bitwise(
        one_process(ActivationOffload(SyncCopyEngine("cpu")), steps=2, config=config),
        one_process(None, steps=2, config=config),
    )


def _kept(offload: ActivationOffload | None, steps: int = 2):
    """`steps` training steps through the ring at one rank, checkpointed blocks keeping their attention."""
    torch.manual_seed(0)
    model = apply_activation_checkpointing(apply_context_parallel(Transformer(CFG)), keep_attention=True)
    if offload is not None:
        apply_activation_offload(model, offload)
    optimizer, scheduler = build_optimizer(model, STAGE, OPTIM)
    losses = [train_step(model, _batch(), optimizer, OPTIM, None, False, scheduler).loss for _ in range(steps)]
    return losses, [p.detach().clone() for p in model.parameters()]


def test_kept_attention_waits_in_host_memory_through_the_cuda_engine():
    """parallel.keep_attention with offload: each block's kept output and logsumexp go to pinned buffers
    through the CUDA engine's path (copies that end only when waited on) and come back for its recompute:
    bit-exact with them kept on the device, nothing in flight after the steps."""
    cuda = StandInCuda()
    assert_bitwise(_kept(ActivationOffload(standin_engine(cuda))), _kept(None))
    assert cuda.in_flight() == [] and len(cuda.pinned) == CFG.n_layers * 3  # per block: input, output, lse


def test_a_kept_output_read_before_its_copy_in_ended_breaks_the_step(monkeypatch):
    """Without the wait in back(), the recompute reads the stand-in's NaN: the gradients show it."""

    def back_without_waiting(self):
        dst = torch.empty(self.host.shape, dtype=self.host.dtype, device=self.device)
        self.offload.engine.copy(dst, self.host)
        return dst

    monkeypatch.setattr(offload_file._KeptOnHost, "back", back_without_waiting)
    losses, params = _kept(ActivationOffload(standin_engine(StandInCuda())), steps=1)
    assert any(p.isnan().any() for p in params)

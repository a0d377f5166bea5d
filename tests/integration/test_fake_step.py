"""The training step as a GPU would run it, checked without one (lwm/plan/fake_step.py over
lwm/plan/fake.py): rank 0 of dp 2 x cp 2 under fake tensors with the GPU's settings forced,
the same step on the meta device, and its host syncs at a small real shape on gloo. Also two defects of that path: FSDP2's mixed
precision casting the blocks' RoPE angles to bf16, and every rank reading the starting weights."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from lwm.core.config import OptimConfig, ParallelConfig, StageConfig
from lwm.core.step import build_optimizer, train_step
from lwm.data.vocab import Vocab
from lwm.model import ModelConfig, Transformer
from lwm.parallel import apply_context_parallel, compute_settings
from lwm.parallel.launch import run_distributed
from lwm.plan.fake import make_batch, place, run_prefill, run_step, shard_rows, start_fake_group
from lwm.plan.fake_step import FakeStepConfig, run
from lwm.train import module as module_file
from lwm.train import run as run_module
from lwm.train.module import LWMModule

DEBUG = ModelConfig.from_preset("debug")
STAGE = StageConfig("a", seq_len=64, rope_theta=1e4, steps=1, lr=1e-3, cp=2)


@pytest.fixture(scope="module")
def fake():
    """The command at a small shape: debug preset, 256 tokens in 4 masked documents, cp 2, dp 2."""
    return run(FakeStepConfig(preset="debug", seq_len=256, cp=2, dp=2, prefill_chunk=32, documents=4))


@pytest.fixture
def fake_group():
    start_fake_group(4)
    yield
    dist.destroy_process_group()


def test_rank0_holds_its_fsdp2_shards_of_parameters_gradients_and_adamw_state(fake):
    model, optimizer = fake.step.model, fake.step.optimizer
    # dim 0 in 4 chunks of ceil(rows / 4): rank 0 holds the first
    expected = {"embed.weight": (2128, 64), "layers.0.attn.wk.weight": (8, 64), "layers.0.attn_norm.weight": (16,)}
    params = dict(model.named_parameters())
    for name, shape in expected.items():
        assert tuple(params[name].to_local().shape) == shape == shard_rows(tuple(params[name].shape), 4), name
    for name, p in params.items():
        want = shard_rows(tuple(p.shape), 4)
        state = optimizer.state[p]
        for t in (p.to_local(), p.grad.to_local(), state["exp_avg"].to_local(), state["exp_avg_sq"].to_local()):
            assert (tuple(t.shape), t.dtype) == (want, torch.float32), name  # fp32 master weights and moments
        assert state["step"].shape == ()


def test_the_step_computes_in_bf16_with_the_cuda_flash_kernel(fake):
    seen = fake.step.seen
    assert seen["attn_in"] == seen["block_out"] == ((1, 128, 64), torch.bfloat16)  # 256 tokens / cp 2
    assert fake.step.loss.dtype == torch.float32
    # 2 layers x 2 ring steps, one varlen call each way per step whatever the documents
    assert fake.step.counter.attention() == {"_flash_attention_forward": 4, "_flash_attention_backward": 4}
    assert "step" in fake.seconds and any("4 documents masked" in line for line in fake.lines)


def test_fsdp2_gathers_each_block_once_a_step_but_the_ones_backward_needs_again(fake):
    """All-gathers of a step: the root's and each block's in the forward, and in the backward each block's
    again but the last one's, whose backward follows its forward at once (it was resharded after the
    forward and gathered again straight away: 5 for 2 blocks, not 4), as FSDP2 keeps the root's itself."""
    layers = 2
    assert fake.step.counter.ops["_allgather_base_"] == (1 + layers) + (layers - 1)
    assert fake.step.counter.ops["_reduce_scatter_base_"] == 1 + layers


def test_the_step_and_prefill_run_the_fused_rms_norm_as_a_gpu_does(fake):
    """On a CUDA tensor torch runs each RMSNorm as one fused op each way; fake CPU tensors left to
    torch run its composite (pow, mean, rsqrt, mul: fp32 temporaries a GPU never makes)."""
    norms = 2 * 2 + 1  # two a layer and the final one
    ops = fake.step.counter.ops
    assert (ops["_fused_rms_norm"], ops["_fused_rms_norm_backward"], ops["rsqrt"]) == (norms, norms, 0)
    # the prefill's 4 segments and its extend step are 5 forward passes
    assert (fake.prefill.counter.ops["_fused_rms_norm"], fake.prefill.counter.ops["rsqrt"]) == (5 * norms, 0)


def test_rope_angles_stay_fp32_under_fsdp2_mixed_precision(fake):
    """Defect 7: MixedPrecisionPolicy casts a module's floating inputs by default, so each block's
    cos/sin arrived in bf16 on a GPU (fp32 on CPU and in inference). apply_rope rotates in fp32."""
    shape, cos, sin = fake.step.seen["rope"]
    assert (shape, cos, sin) == ((1, 128, 8), torch.float32, torch.float32)  # positions restart per document


def test_the_fake_step_and_prefill_make_no_host_syncs(fake):
    # AdamW reads its step counters (one per parameter, 21) with .item(): they live on the host.
    assert fake.step.device_syncs() == {} and fake.step.host_counter_reads() == 21
    # 255 of 256 tokens split over 2 ranks (254 through the ring), the last 2 as an extend step of
    # which rank 0 keeps position 254: 127 + 1 keys per layer
    assert fake.prefill.ring_tokens == 254 and fake.prefill.cache == ((1, 2, 128, 16), torch.bfloat16)
    assert fake.prefill.counter.syncs() == {}
    # prefill_chunk 32 per rank: 4 segments of 64 tokens, per layer 2 ring steps each (8), plus 2 per
    # pass over the earlier segments' cache: one pass for the second segment (32 cached tokens a rank),
    # two halves for the third and fourth (64, 96: lwm.parallel.cached.PAST_PASSES) (10), then the
    # extend's 2 (cache, own): 2 layers x 20
    assert fake.prefill.counter.attention() == {"_scaled_dot_product_flash_attention": 40}


def _real_syncs(rank, world):
    """Host syncs of the same step with real values (fp32, cpu_flash): without and with documents,
    and with documents under activation checkpointing (with its attention calls, to see the recompute)."""
    where = place(1, world)
    settings = compute_settings(torch.device("cpu"), DEBUG.head_dim)
    out = {}
    for documents, recompute in ((1, False), (4, False), (4, True)):
        batch = make_batch(DEBUG, 64, where, documents, "striped", "cpu")
        parallel = ParallelConfig(document_mask=documents > 1, activation_checkpointing=recompute)
        step = run_step(DEBUG, STAGE, where, parallel, settings, "cpu", batch)
        out[documents, recompute] = dict(step.device_syncs()), dict(step.counter.attention())
    out["prefill"] = dict(run_prefill(DEBUG, where, 64, 16, settings, "cpu").counter.syncs())
    return out


def test_host_syncs_at_a_small_real_shape():
    """Rank 0 of cp 2 on gloo, 64 tokens. The step never waits for the device, with documents too:
    they are read on the host with the batch (lwm.model.documents.Documents) and every layer's
    ring plans from them, the backward's recompute of each block under activation checkpointing
    included. (Read from the segment ids in each layer, they cost 18 syncs here and 864 per step
    at 7b / cp 8.)"""
    got = run_distributed(_real_syncs, 2)[0]
    assert got[1, False][0] == {}
    assert got[4, False][0] == {}
    (syncs, recomputed), (_, once) = got[4, True], got[4, False]
    assert syncs == {}
    forward = "_scaled_dot_product_flash_attention_for_cpu"
    assert recomputed[forward] == 2 * once[forward] > 0, (recomputed, once)  # each block's forward ran again
    assert got["prefill"] == {}  # prefill of 64 tokens, prompt check skipped


def test_the_meta_device_catches_a_tensor_made_on_the_wrong_device(fake_group):
    """The step on the meta device with the GPU's kernel: every tensor it makes must follow its
    inputs' device, or the step raises (on CPU such a tensor would pass unseen). FSDP2 refuses
    meta parameters, so this runs the step on the parallelized model in bf16 without it."""
    where = place(2, 2)
    with torch.device("meta"):
        model = Transformer(DEBUG).to(torch.bfloat16)
    apply_context_parallel(model, where.cp_group, backend="cuda_flash")
    batch = make_batch(DEBUG, 64, where, 1, "striped", "meta")
    optimizer, _ = build_optimizer(model, STAGE, OptimConfig())
    loss = train_step(model, batch, optimizer, OptimConfig(), where.cp_group, document_mask=False).loss
    assert loss.device.type == "meta" and optimizer.state[model.embed.weight]["exp_avg"].is_meta

    ring = model.layers[0].attn.attn_fn

    def stray_zeros(q, k, v, causal=True):
        return ring(q, k, v, causal=causal) + torch.zeros(q.shape, dtype=q.dtype)  # no device=

    model.layers[0].attn.attn_fn = stray_zeros
    with pytest.raises(RuntimeError, match="device"):
        train_step(model, batch, optimizer, OptimConfig(), where.cp_group, document_mask=False)


@pytest.mark.parametrize("rank", [0, 1])
def test_only_global_rank_0_reads_the_starting_weights(rank, monkeypatch):
    """Defect 10: every rank read the full fp32 weights, though only rank 0's are broadcast."""
    reads, loaded = [], {}

    def read():
        reads.append(rank)
        return {"embed.weight": torch.zeros(1)}

    def build_parallel_model(config, meshes, settings, device, init_state, *args, **kwargs):
        loaded["init"] = init_state  # what build_parallel_model broadcasts from rank 0

    monkeypatch.setattr(module_file, "build_parallel_model", build_parallel_model)
    start_fake_group(2, rank)
    try:
        module = LWMModule(DEBUG, STAGE, OptimConfig(), ParallelConfig(), init_state=read)
        module._device_mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
        module.configure_model()
    finally:
        dist.destroy_process_group()
    assert reads == ([0] if rank == 0 else [])
    assert list(loaded["init"]) == (["embed.weight"] if rank == 0 else [])


def test_run_schedule_hands_on_weights_unread(tmp_path, monkeypatch):
    """Between stages the schedule passes a reader (called on rank 0 by LWMModule), never the weights."""
    from types import SimpleNamespace

    reads, starts = [], {}

    def run_stage(cfg, stage, init):
        starts[stage.name] = init
        return tmp_path / stage.name / "final.safetensors"

    monkeypatch.setattr(run_module, "run_stage", run_stage)
    monkeypatch.setattr(run_module, "read_weights", lambda path: reads.append(path) or {})
    stages = [StageConfig(n, seq_len=64, rope_theta=1e4, steps=1, lr=1e-3) for n in "ab"]
    cfg = SimpleNamespace(
        model=DEBUG,
        schedule=SimpleNamespace(init_hf=None, stages=stages),
        stage_only=None,
        resume=False,
        export=False,
        evaluate=SimpleNamespace(lengths=None),
        trainer=SimpleNamespace(out_dir=str(tmp_path), flush_denormal=True),
    )
    run_module.run_schedule(cfg)
    assert reads == [] and starts["a"] is None
    starts["b"]()
    assert reads == [tmp_path / "a" / "final.safetensors"]


def test_a_hugging_face_start_reads_only_the_config_until_asked(tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from lwm.interop.hf import start_config

    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)  # hf_start checks the weights' headers, reads no data
    calls = []
    monkeypatch.setattr(run_module, "from_hf", lambda *a, **k: calls.append(a) or Transformer(DEBUG))
    config, _ = start_config(tmp_path)
    read = run_module.hf_start(tmp_path)
    assert calls == [] and (config.dim, config.vocab_size) == (48, Vocab(4096).size)
    read()
    assert calls == [(tmp_path,)]


def test_tensor_parallel_step_under_fake_tensors():
    """tp 2 x cp 2 x dp 2 at the small shape: the model is built and parallelized on the meta device
    outside FakeTensorMode (FSDP2 over the tp mesh makes DeviceMeshes from real rank tensors) and
    allocated fake; every shard is rank 0's tp-then-FSDP2 cut (check_shards raises otherwise)."""
    report = run(FakeStepConfig(preset="debug", seq_len=256, cp=2, dp=2, tp=2, prefill_chunk=32, documents=4))
    wq = report.step.model.layers[0].attn.wq.weight
    assert tuple(wq.shape) == (64, 64) and tuple(wq.to_local().shape) == (8, 64)  # 64 rows / tp 2 / (dp x cp) 4
    assert report.step.model.layers[0].attn.n_heads == DEBUG.n_heads // 2
    assert any("wq (64, 64) -> (8, 64)" in line for line in report.lines)
    assert dict(report.step.device_syncs()) == {}


def test_a_qkv_bias_is_expected_split_by_tp_then_fsdp():
    """Qwen2's q/k/v bias goes with its weight's rows under tp (ColwiseParallel cuts both), then FSDP2's rows:
    qwen2_5_7b at tp 2 x dp 2 x cp 2 holds 448 of wq's 3584 bias rows on rank 0 (the check expected 896 and
    refused the right shard)."""
    from lwm.plan.fake import expected_shard

    assert expected_shard("layers.0.attn.wq.bias", (3584,), 4, 2) == (448,)
    assert expected_shard("layers.0.attn.wq.weight", (3584, 3584), 4, 2) == (448, 3584)
    assert expected_shard("layers.0.attn.wo.weight", (3584, 3584), 4, 2) == (896, 1792)
    assert expected_shard("layers.0.attn.q_norm.weight", (128,), 4, 2) == (32,)  # whole on every tp rank

"""What one GPU can check past the attention kernels (skipped without a GPU): the CUDA kernels
under ring, Ulysses and hybrid attention on one device, fp32 and bf16, forward and backward, with
and without document masks; the multi-step ring schedule on CUDA through simulate_ring; one GPU's
training step (FSDP2: fp32 master weights, bf16 compute); generation with the KV cache.

What it cannot check: communication. The NCCL group here has one rank (NCCL refuses two ranks on
one device, and gloo has no CUDA all-to-all), and a group of one sends nothing: RingComm makes no
send or receive (ring_attention runs its single local step), Ulysses and hybrid return before
their all-to-all. The multi-rank contract is checked without a GPU instead: tests/comm_contract.py
holds every tensor handed to a collective or a send/receive in the multi-process gloo tests to
what NCCL requires (on the compute device, not on the host, dense, a dtype NCCL carries, matching
sizes), and tests/cuda_standins.py runs the CUDA attention kernels' code paths (ring, Ulysses,
hybrid, with the kernels' memory contracts) on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from document_refs import masked_sdpa, packed_pair, packings

from lwm.data.vocab import Vocab
from lwm.model import ModelConfig, Transformer, token_coefficients
from lwm.parallel import ParallelDims, hybrid_attention, ring_attention, simulate_ring, ulysses_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
GRAD_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


@pytest.fixture(scope="module")
def nccl():
    """A one-rank NCCL group (or the one a test before made): the code takes its group paths and
    device placements, but no collective or send/receive runs in a group of one."""
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore())
    torch.cuda.set_device(0)
    return dist.group.WORLD


def _inputs(dtype, S=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(2, h, S, 64, generator=g, dtype=torch.float64).cuda() for h in (8, 2, 2)]
    return full, [t.to(dtype).requires_grad_() for t in full]


def _check(out, low, full, seg, dtype):
    ref_in = [t.clone().requires_grad_() for t in full]
    ref = masked_sdpa(*ref_in, seg, True)
    dout = torch.randn_like(ref)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    for a, b in zip(torch.autograd.grad(out, low, dout.to(dtype)), torch.autograd.grad(ref, ref_in, dout)):
        torch.testing.assert_close(a.double(), b, **GRAD_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["ring", "ulysses", "hybrid"])
def test_attention_on_one_gpu_through_a_one_rank_group(nccl, mode, dtype):
    """Ring and hybrid: the single local ring step on the CUDA kernels (document pieces, the
    logsumexp handed to the flash backward); Ulysses: the one-device attention it falls back to.
    With one rank nothing travels."""
    full, low = _inputs(dtype)
    seg = packings(2, 512, seed=2, lengths=(1, 7, 60, 200)).cuda()
    fn = {
        "ring": lambda *a, **kw: ring_attention(*a, group=nccl, **kw),
        "ulysses": lambda *a, **kw: ulysses_attention(*a, group=nccl, **kw),
        "hybrid": lambda *a, **kw: hybrid_attention(*a, ring_group=nccl, ulysses_group=nccl, **kw),
    }[mode]
    _check(fn(*low, causal=True, segment_ids=seg), low, full, seg, dtype)
    plain = fn(*low, causal=True)  # no documents: the causal mask alone
    ref = F.scaled_dot_product_attention(full[0], *(t.repeat_interleave(4, 1) for t in full[1:]), is_causal=True)
    torch.testing.assert_close(plain.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["striped", "zigzag"])
def test_simulated_ring_forward_and_backward(layout, dtype):
    full, low = _inputs(dtype, S=1024, seed=1)
    seg = torch.ones(2, 1024, dtype=torch.int32, device="cuda")  # one document: plain causal attention
    _check(simulate_ring(*low, 4, True, layout), low, full, seg, dtype)


def _batch(cfg, S=64):
    batch, _ = packed_pair(cfg, S)
    batch["positions"] = torch.arange(S)[None]
    return batch


@pytest.mark.parametrize("param_offload", [False, True])
def test_one_gpu_training_step_computes_in_bf16_on_fp32_weights(tmp_path, param_offload):
    """trainer.accelerator=gpu with one device: FSDP2 over one rank, fp32 parameters, bf16 matmuls;
    the first loss agrees with the fp32 model's, and a few steps lower it. With parameter offload
    the fp32 shards, gradients and AdamW's moments stay in pinned host memory through Lightning's
    setup and the steps (FSDP2's CPU offload: copies in before each gather, out after each reduce),
    and the computation is the GPU's."""
    import lightning as L

    from lwm.core.config import OptimConfig, ParallelConfig, StageConfig, TrainerConfig
    from lwm.train.module import LWMModule
    from lwm.train.trainer import strategy as _strategy

    cfg = ModelConfig.from_preset("debug")
    stage = StageConfig("a", seq_len=64, rope_theta=1e4, steps=6, lr=3e-3, warmup_steps=1)
    batch = _batch(cfg)
    torch.manual_seed(0)
    reference = Transformer(cfg)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    coeff = token_coefficients(batch["loss_weight"], batch["vision_mask"])
    ref_loss = reference(
        batch["tokens"],
        batch["positions"],
        targets=batch["targets"],
        loss_coeff=coeff,
        segment_ids=batch["segment_ids"],
    ).loss.item()

    module = LWMModule(cfg, stage, OptimConfig(), ParallelConfig(param_offload=param_offload), init_state=state)
    seen = {}
    losses = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        strategy=_strategy(ParallelDims(), TrainerConfig(accelerator="gpu"), param_offload),
        precision="32-true",
        max_steps=stage.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[Record()],
        default_root_dir=tmp_path,
    )

    class Once(torch.utils.data.IterableDataset):
        def __iter__(self):
            for _ in range(stage.steps):
                yield {k: v[0] for k, v in batch.items()}

    def hook(mod, args, out):
        seen["compute"] = out.dtype

    orig_configure = module.configure_model

    def configure():
        orig_configure()
        module.model.layers[0].attn.wq.register_forward_hook(hook)
        seen["param"] = next(module.model.parameters()).dtype

    module.configure_model = configure
    trainer.fit(module, torch.utils.data.DataLoader(Once(), batch_size=1))
    assert seen == {"param": torch.float32, "compute": torch.bfloat16}
    assert abs(losses[0] - ref_loss) < 2e-2 * ref_loss, (losses[0], ref_loss)
    assert losses[-1] < losses[0], losses
    params = list(module.model.parameters())
    states = [t for p in params for t in trainer.optimizers[0].state[p].values() if t.dim()]
    where = {t.to_local().device.type for t in params + [p.grad for p in params] + states}
    assert where == ({"cpu"} if param_offload else {"cuda"}), where
    if param_offload:
        assert all(p.to_local().is_pinned() for p in params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generation_with_the_kv_cache_on_cuda(dtype):
    """Scores from the cache equal full-forward log-probabilities (fp32 and bf16); greedy tokens
    equal the plain full-recompute loop's in fp32 (in bf16 near-ties may round either way)."""
    from lwm.infer import GenerationConfig, Generator
    from lwm.infer.sampling import allowed_ids

    vocab = Vocab(4096)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).cuda().to(dtype).eval()
    prompt = torch.randint(0, vocab.text_size, (300,), generator=torch.Generator().manual_seed(0))
    conts = [[5, 6, 7], [vocab.vision_start, vocab.vision_offset + 3]]
    with torch.no_grad():
        want = []
        for cont in conts:
            logp = torch.log_softmax(model(torch.tensor([prompt.tolist() + cont], device="cuda"))[0].float(), -1)
            want.append(sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)))
        allowed = allowed_ids(vocab, None, []).cuda()
        seq = prompt.tolist()
        for _ in range(8):
            logits = model(torch.tensor([seq], device="cuda"))[0, -1].float().masked_fill(~allowed, float("-inf"))
            seq.append(int(logits.argmax()))
    gen = Generator(model, vocab, prefill_chunk=128)  # three chunks: the cache is read while it fills
    got = gen.score(prompt, conts)
    assert got == pytest.approx(want, abs=1e-3 if dtype == torch.float32 else 0.15)
    if dtype == torch.float32:
        assert gen.generate(prompt, GenerationConfig(max_new_tokens=8)) == seq[len(prompt) :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_named_fused_norm_is_what_torch_runs_on_a_gpu(dtype):
    """The planner runs the norm as `fused` (aten's kernel and backward by name); on a GPU torch's
    own dispatch (`auto`) runs the same two kernels: equal outputs and gradients, bit for bit."""
    from lwm.model.norm import RMSNorm

    torch.manual_seed(0)
    x = torch.randn(2, 256, 512, device="cuda", dtype=dtype) * 3
    grad = torch.randn_like(x)
    got = {}
    for kernel in ("auto", "fused"):
        norm = RMSNorm(512, 1e-5).to("cuda", dtype)
        norm.kernel = kernel
        xi = x.clone().requires_grad_()
        out = norm(xi)
        out.backward(grad)
        got[kernel] = (out, xi.grad, norm.weight.grad)
    for a, b in zip(got["auto"], got["fused"]):
        assert torch.equal(a, b)

import dataclasses
import math

import pytest
import torch

from lwm.model import ModelConfig, RopeScaling, Transformer, sdpa_attention
from lwm.model.rope import rope_angles


def reference_attention(q, k, v, causal):
    """Softmax attention written out in fp64, GQA expanded by repeat_interleave."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.repeat_interleave(rep, 1).double(), v.repeat_interleave(rep, 1).double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
def test_sdpa_attention_matches_reference(causal, hq, hkv):
    q = torch.randn(2, hq, 33, 24)
    k, v = torch.randn(2, hkv, 33, 24), torch.randn(2, hkv, 33, 24)
    torch.testing.assert_close(
        sdpa_attention(q, k, v, causal).double(), reference_attention(q, k, v, causal), atol=1e-5, rtol=1e-5
    )


@pytest.fixture
def debug_model():
    return Transformer(ModelConfig.from_preset("debug")).eval()


def test_forward_shapes_and_default_positions(debug_model):
    tokens = torch.randint(0, debug_model.config.vocab_size, (2, 40))
    logits = debug_model(tokens)
    assert logits.shape == (2, 40, debug_model.config.vocab_size) and logits.dtype == torch.float32
    torch.testing.assert_close(debug_model(tokens, torch.arange(40)), logits, rtol=0, atol=0)
    torch.testing.assert_close(debug_model(tokens, torch.arange(40).expand(2, 40)), logits, rtol=0, atol=0)


def test_rope_uses_the_given_positions(debug_model):
    tokens = torch.randint(0, debug_model.config.vocab_size, (1, 32))
    base = debug_model(tokens, torch.arange(32))
    # Causal RoPE attention depends only on relative positions: a shift leaves the logits unchanged ...
    torch.testing.assert_close(debug_model(tokens, torch.arange(32) + 1000), base, atol=2e-4, rtol=1e-4)
    # ... while other gaps between tokens (a strided slice's global positions) change them.
    assert (debug_model(tokens, torch.arange(32) * 2) - base).abs().max() > 1e-3
    # Per-row positions: each row is rotated by its own positions.
    both = debug_model(tokens.expand(2, 32), torch.stack([torch.arange(32), torch.arange(32) * 2]))
    torch.testing.assert_close(both[0], base[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1], debug_model(tokens, torch.arange(32) * 2)[0], atol=1e-5, rtol=1e-5)


def test_rope_scaling_and_each_of_its_fields_take_effect(debug_model):
    """ModelConfig.rope_scaling (Llama 3.1's scaling) changes the angles and the logits, and so does
    each of its fields. head_dim 16, theta 1e4: wavelengths 6.3, 20, 63, 199, 628 ... tokens; with
    original 256, low 1 and high 4 the first three are kept, 199 is blended and the rest stretched,
    so each field below moves a band's edge past one of them. factor 1 is plain RoPE."""
    positions = torch.arange(0, 4096, 7)
    base = RopeScaling(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=256)
    cos, _ = rope_angles(positions, 16, 1e4, base)
    plain, _ = rope_angles(positions, 16, 1e4)
    assert torch.equal(cos[:, :3], plain[:, :3]) and not torch.equal(cos[:, 3:], plain[:, 3:])
    changed = dict(factor=8.0, low_freq_factor=2.0, high_freq_factor=8.0, original_max_seq_len=512)
    for field, value in changed.items():
        other, _ = rope_angles(positions, 16, 1e4, dataclasses.replace(base, **{field: value}))
        assert not torch.equal(other, cos), field
    assert torch.equal(rope_angles(positions, 16, 1e4, dataclasses.replace(base, factor=1.0))[0], plain)

    scaled = Transformer(debug_model.config.replace(rope_scaling=base)).eval()
    scaled.load_state_dict(debug_model.state_dict())
    tokens = torch.randint(0, debug_model.config.vocab_size, (1, 300))
    with torch.no_grad():
        assert (scaled(tokens) - debug_model(tokens)).abs().max() > 1e-3


def test_attention_function_is_replaceable(debug_model):
    tokens = torch.randint(0, debug_model.config.vocab_size, (1, 16))
    base = debug_model(tokens)
    calls = []

    def recording(q, k, v, causal=True):
        calls.append((q.shape, k.shape, causal))
        return reference_attention(q, k, v, causal).to(q.dtype)

    debug_model.set_attention(recording)
    torch.testing.assert_close(debug_model(tokens), base, atol=1e-5, rtol=1e-5)
    cfg = debug_model.config
    # k/v arrive un-expanded (GQA), in (B, H, S, D).
    assert calls == [((1, cfg.n_heads, 16, cfg.head_dim), (1, cfg.n_kv_heads, 16, cfg.head_dim), True)] * cfg.n_layers
    debug_model.set_attention(lambda q, k, v, causal=True: reference_attention(q, k, v, False).to(q.dtype))
    assert (debug_model(tokens) - base).abs().max() > 1e-3
    # one function per block, and back: attention_fns is what set_attention takes
    before = debug_model.attention_fns()
    per_block = [recording] + before[1:]
    debug_model.set_attention(per_block)
    assert debug_model.attention_fns() == per_block
    debug_model.set_attention(before)
    assert debug_model.attention_fns() == before
    with pytest.raises(ValueError, match=f"1 attention functions for {cfg.n_layers} blocks"):
        debug_model.set_attention([recording])


def test_meta_construction_and_init_weights():
    cfg = ModelConfig.from_preset("debug")
    with torch.device("meta"):
        model = Transformer(cfg)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.equal(model.norm.weight, torch.ones(cfg.dim))
    assert abs(model.embed.weight.std().item() - 0.02) < 2e-3
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert abs(model.layers[0].attn.wo.weight.std().item() - out_std) < 2e-3
    logits = model(torch.randint(0, cfg.vocab_size, (1, 8)))
    assert torch.isfinite(logits).all()


def test_bad_inputs_are_named(debug_model):
    with pytest.raises(ValueError, match=r"tokens must be \(batch, seq\), got shape \(5,\)"):
        debug_model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions must be \(5,\) or \(1, 5\)"):
        debug_model(torch.zeros(1, 5, dtype=torch.long), torch.arange(4))


def test_chunked_mlp_matches_plain_path():
    cfg = ModelConfig.from_preset("debug")
    plain = Transformer(cfg)
    chunked = Transformer(cfg.replace(mlp_chunk_size=7))
    chunked.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (2, 30))  # 30 is not a multiple of 7
    out_p, out_c = plain(tokens), chunked(tokens)
    torch.testing.assert_close(out_c, out_p, atol=1e-6, rtol=1e-6)
    (out_p.square().mean()).backward()
    (out_c.square().mean()).backward()
    for (name, p), c in zip(plain.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(c.grad, p.grad, atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():  # inference path (no recomputation)
        torch.testing.assert_close(chunked(tokens), out_p.detach(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "tiling", [dict(attn_head_groups=2), dict(norm_chunk_size=7), dict(attn_head_groups=2, norm_chunk_size=7)]
)
def test_tiled_attention_and_norms_match_the_plain_model(tiling):
    """Head groups (each group's projections, RoPE, attention and output share, recomputed in
    backward) and sequence-tiled norms compute the plain model's logits and gradients: fp32, the
    tolerance of summing the groups' output shares in another order."""
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("debug")
    plain = Transformer(cfg)
    tiled = Transformer(cfg.replace(**tiling))
    tiled.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (2, 30))  # 30 is not a multiple of 7
    segments = torch.tensor([[0] * 12 + [1] * 18, [0] * 30])  # packed documents on the grouped path too
    out_p, out_t = plain(tokens, segment_ids=segments), tiled(tokens, segment_ids=segments)
    torch.testing.assert_close(out_t, out_p, atol=1e-6, rtol=1e-6)
    out_p.square().mean().backward()
    out_t.square().mean().backward()
    for (name, p), t in zip(plain.named_parameters(), tiled.parameters()):
        torch.testing.assert_close(t.grad, p.grad, atol=1e-7, rtol=1e-5, msg=name)
    with torch.no_grad():  # inference: no recomputation
        torch.testing.assert_close(tiled(tokens, segment_ids=segments), out_p.detach(), atol=1e-6, rtol=1e-6)


def test_head_groups_split_the_attention_calls_and_keep_one_group_live():
    """With 2 head groups the attention function sees half the heads per call, and the grouped
    forward keeps no group's q/k/v for backward (each group is recomputed)."""
    cfg = ModelConfig.from_preset("debug", n_layers=1, attn_head_groups=2)
    model = Transformer(cfg)
    seen = []

    def attend(q, k, v, causal=True, segment_ids=None):
        seen.append((q.shape[1], k.shape[1]))
        return sdpa_attention(q, k, v, causal, segment_ids)

    model.set_attention(attend)
    model(torch.randint(0, cfg.vocab_size, (1, 16))).sum().backward()
    # forward: 2 calls of (2 q heads, 1 kv head); backward: each group's forward again
    assert seen == [(2, 1)] * 4

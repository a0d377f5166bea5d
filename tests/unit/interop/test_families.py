"""Each Hugging Face family (Llama-3 untied, Llama-3.2 tied, Qwen2 with q/k/v bias, Qwen3 with QK norm)
is configuration of the one Transformer: its logits equal transformers' own class's, an export loads
back in transformers with the same logits and keys, and greedy generation through the KV cache equals
transformers' generate (fp32; atol and rtol 1e-5)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_models import FAMILIES, VOCAB, family_model, tiny_hf
from transformers import AutoModelForCausalLM

from lwm.infer.generator import GenerationConfig, Generator
from lwm.interop.hf import from_hf, to_hf


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.no_grad()
def test_logits_equal_transformers_over_1k_tokens(name):
    hf = tiny_hf(name)
    ours = from_hf(hf).eval()
    c = ours.config
    assert (c.qkv_bias, c.qk_norm, c.tie_embeddings) == (name == "qwen2", name == "qwen3", "tied" in name)
    assert c.head_dim == (32 if name == "qwen3" else 16)
    tokens = torch.randint(0, VOCAB.size, (1, 1024), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.no_grad()
def test_export_loads_in_transformers_as_its_family(name, tmp_path):
    ours = family_model(name).eval()
    to_hf(ours, tmp_path)
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == FAMILIES[name][0] and config["tie_word_embeddings"] == ("tied" in name)
    assert type(hf).__name__ == config["architectures"][0]
    tokens = torch.randint(0, VOCAB.size, (2, 96), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(hf.eval()(tokens).logits, ours(tokens), atol=1e-5, rtol=1e-5)
    back = from_hf(tmp_path)  # and read back: the same weights, the same options
    assert back.config == ours.config.replace(loss_chunk_size=back.config.loss_chunk_size)  # a memory setting
    assert all(torch.equal(back.state_dict()[k], v) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.no_grad()
def test_greedy_generation_equals_transformers_generate(name):
    hf = tiny_hf(name)
    ours = from_hf(hf).eval()
    prompt = torch.randint(0, VOCAB.text_size, (40,), generator=torch.Generator().manual_seed(2))
    padding = list(range(VOCAB.used_size, VOCAB.size))  # rows no token has; our generator never picks them
    want = hf.generate(
        prompt[None],
        attention_mask=torch.ones(1, 40, dtype=torch.long),
        max_new_tokens=12,
        do_sample=False,
        suppress_tokens=padding,
        pad_token_id=0,
        eos_token_id=None,
    )[0, 40:].tolist()
    assert Generator(ours, VOCAB).generate(prompt.tolist(), GenerationConfig(max_new_tokens=12)) == want


def test_a_family_without_a_hugging_face_class_is_refused():
    from lwm.interop.hf import config_to_hf
    from lwm.model import ModelConfig

    with pytest.raises(ValueError, match="no Hugging Face family has both qkv_bias and qk_norm"):
        config_to_hf(ModelConfig.from_preset("debug", qkv_bias=True, qk_norm=True))


def test_qwen_sliding_window_and_o_proj_bias_are_refused():
    with pytest.raises(ValueError, match=r"unsupported qwen2 options \{'use_sliding_window': True"):
        from_hf(tiny_hf("qwen2", use_sliding_window=True, sliding_window=64))
    with pytest.raises(ValueError, match=r"unsupported qwen3 options \{'attention_bias': True\}"):
        from_hf(tiny_hf("qwen3", attention_bias=True))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiled_attention_norms_mlp_and_loss_equal_the_plain_model(name):
    """Head groups (each group's rows of the q/k/v bias, the QK norm on its heads), sequence-tiled norms,
    the blockwise MLP and a small loss chunk give the plain model's loss and gradients (fp32)."""
    from lwm.model import Transformer

    plain = family_model(name)
    tiled = Transformer(
        plain.config.replace(attn_head_groups=2, norm_chunk_size=24, mlp_chunk_size=40, loss_chunk_size=16)
    )
    tiled.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, VOCAB.size, (2, 97), generator=torch.Generator().manual_seed(3))
    losses = []
    for model in (plain, tiled):
        loss = model(tokens[:, :-1], targets=tokens[:, 1:]).loss
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-6)
    for (key, p), q in zip(plain.named_parameters(), tiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=lambda m, k=key: f"{name} {k}: {m}")

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from lwm.data import Vocab
from lwm.interop.hf import from_hf, to_hf
from lwm.model import ModelConfig, RopeScaling, Transformer

THETA = 123_456.0
# Llama 3.1's RoPE scaling at a small scale: with head_dim 16 and THETA, wavelengths 6.3 (kept, under
# 32 / 4 = 8), 27 (blended, under 32 / 1) and 117 and up (stretched 4x); a test sequence of 96
# tokens runs past original_max_position_embeddings 32.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": THETA,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny_llama(vocab_size=300, rope_parameters=None, **kw):
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": THETA},
        **kw,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def greedy(model: Transformer, prompt: torch.Tensor, n: int) -> torch.Tensor:
    tokens = prompt
    for _ in range(n):
        nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


@torch.no_grad()
def test_from_hf_logits_equal_transformers():
    hf = tiny_llama()
    ours = from_hf(hf).eval()
    assert ours.config.rope_theta == THETA and ours.config.n_kv_heads == 2 and ours.config.max_seq_len == 512
    tokens = torch.randint(0, 300, (2, 64))
    torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_from_hf_folder_sharded(tmp_path):
    hf = tiny_llama()
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = from_hf(tmp_path).eval()
    tokens = torch.randint(0, 300, (1, 20))
    torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_to_hf_loads_in_transformers_with_equal_logits_and_generates(tmp_path):
    cfg = ModelConfig.from_preset("debug", rope_theta=5e5, max_seq_len=1024)
    ours = Transformer(cfg).eval()
    to_hf(ours, tmp_path)
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 5e5}
    assert config["max_position_embeddings"] == 1024 and config["vocab_size"] == cfg.vocab_size == 8512
    tokens = torch.randint(0, cfg.vocab_size, (2, 48))
    torch.testing.assert_close(hf(tokens).logits, ours(tokens), atol=1e-5, rtol=1e-5)
    prompt = tokens[:1, :6]
    generated = hf.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generated, greedy(ours, prompt, 8))


def test_llama3_inverse_frequencies_equal_transformers():
    """lwm.model.rope's Llama 3.1 scaling gives transformers' "llama3" frequencies bit for bit, at
    the llama3_8b preset's values and at the small ones the logits tests use."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from lwm.interop.hf import config_to_hf
    from lwm.model.rope import rope_angles

    positions = torch.arange(0, 300_000, 997)
    for config in (ModelConfig.from_preset("llama3_8b"), from_hf(tiny_llama(rope_parameters=LLAMA3_ROPE)).config):
        theirs, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](config_to_hf(config), "cpu")
        assert attention_factor == 1.0  # no cos/sin scaling for this type
        freqs = positions.float().unsqueeze(-1) * theirs
        cos, sin = rope_angles(positions, config.head_dim, config.rope_theta, config.rope_scaling)
        assert torch.equal(cos, freqs.cos()) and torch.equal(sin, freqs.sin())
        plain, _ = rope_angles(positions, config.head_dim, config.rope_theta)
        assert not torch.equal(cos, plain)  # the scaling changed them


@torch.no_grad()
def test_from_hf_llama3_rope_logits_equal_transformers():
    hf = tiny_llama(rope_parameters=LLAMA3_ROPE)
    ours = from_hf(hf).eval()
    assert ours.config.rope_scaling == RopeScaling(4.0, 1.0, 4.0, original_max_seq_len=32)
    tokens = torch.randint(0, 300, (2, 96))  # 3 x original_max_position_embeddings
    logits = ours(tokens)
    torch.testing.assert_close(logits, hf(tokens).logits, atol=1e-5, rtol=1e-5)
    plain = Transformer(ours.config.replace(rope_scaling=None)).eval()
    plain.load_state_dict(ours.state_dict())
    diff = (plain(tokens) - logits).abs().amax(dim=(0, 2))  # (S,): the scaling's effect per position
    assert diff[32:].min() > 100 * 1e-5  # beyond original_max_position_embeddings, far above the tolerance


@torch.no_grad()
def test_llama3_rope_round_trips_through_to_hf_and_transformers(tmp_path):
    cfg = ModelConfig.from_preset("debug", rope_theta=5e5, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16))
    ours = Transformer(cfg).eval()
    to_hf(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_parameters"] == {
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values())
    tokens = torch.randint(0, cfg.vocab_size, (2, 80))  # 5 x original_max_position_embeddings
    torch.testing.assert_close(hf(tokens).logits, ours(tokens), atol=1e-5, rtol=1e-5)
    back = from_hf(tmp_path)
    assert back.config == cfg.replace(loss_chunk_size=ModelConfig.loss_chunk_size)  # a field HF does not hold
    assert all(torch.equal(v, ours.state_dict()[k]) for k, v in back.state_dict().items())


@torch.no_grad()
def test_llama3_folder_in_the_older_rope_scaling_format(tmp_path):
    """Llama-3.1's own config.json writes rope_theta at the top and the scaling as rope_scaling (the
    name before transformers 5); the import reads it as the same model."""
    hf = tiny_llama(rope_parameters=LLAMA3_ROPE)
    hf.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ours = from_hf(tmp_path).eval()
    assert (ours.config.rope_theta, ours.config.rope_scaling) == (THETA, RopeScaling(4.0, 1.0, 4.0, 32))
    tokens = torch.randint(0, 300, (1, 64))
    torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)


def test_tokenizer_export_places_vision_and_special_tokens(tmp_path, spm_model):
    import sentencepiece as spm

    vocab = Vocab(256)
    model = Transformer(ModelConfig.from_preset("debug"))  # vocab_size == Vocab(256).size
    to_hf(model, tmp_path, tokenizer_model=spm_model)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok.convert_tokens_to_ids(["<vision_0>", "<vision_8191>", "<eof>", "<eov>", "<vision>", "</vision>"])
    assert ids == [
        vocab.vision_offset,
        vocab.vision_offset + 8191,
        vocab.eof,
        vocab.eov,
        vocab.vision_start,
        vocab.vision_end,
    ]
    text = "the red circle moves left"
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    assert tok(text).input_ids == [sp.bos_id()] + sp.encode(text)
    assert tok("<vision><vision_7><eof></vision>", add_special_tokens=False).input_ids == [
        vocab.vision_start,
        vocab.vision_offset + 7,
        vocab.eof,
        vocab.vision_end,
    ]


def test_tokenizer_size_mismatch_is_explained(tmp_path, spm_model):
    model = Transformer(ModelConfig.from_preset("tiny", n_layers=1))  # expects 4096 text ids
    with pytest.raises(
        ValueError, match="has 256 text ids, which makes a vocabulary of 8512 rows, but the model has vocab_size 12352"
    ):
        to_hf(model, tmp_path, tokenizer_model=spm_model)


@torch.no_grad()
def test_extend_vocab_keeps_text_rows():
    hf = tiny_llama(vocab_size=256)
    ours = from_hf(hf, extend_vocab=True).eval()
    vocab = Vocab(256)
    assert ours.config.vocab_size == vocab.size == 8512
    for ours_w, hf_w in ((ours.embed.weight, hf.model.embed_tokens.weight), (ours.output.weight, hf.lm_head.weight)):
        assert torch.equal(ours_w[:256], hf_w)
        new = ours_w[256:]
        mean, std = hf_w.mean(0), hf_w.std(0)
        assert ((new - mean).abs() <= 0.1 * std + 1e-6).all()  # mean plus small noise
        assert new.std(0).min() > 0  # rows differ from each other
    tokens = torch.randint(0, 256, (1, 30))
    torch.testing.assert_close(ours(tokens)[..., :256], hf(tokens).logits, atol=1e-5, rtol=1e-5)


def test_unsupported_configs_are_refused():
    with pytest.raises(ValueError, match=r"unsupported llama options \{'attention_bias': True\}"):
        from_hf(tiny_llama(attention_bias=True))  # LLaMA's attention_bias puts one on o_proj too
    hf = tiny_llama()
    hf.config.rope_parameters = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ValueError, match="RoPE type 'linear' is not supported; expected 'default' .* or 'llama3'"):
        from_hf(hf)
    hf.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ValueError, match="RoPE type 'yarn' is not supported"):
        from_hf(hf)
    hf.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}
    with pytest.raises(ValueError, match=r"missing \['low_freq_factor', 'high_freq_factor', 'original_max_position"):
        from_hf(hf)
    hf.config.rope_parameters = LLAMA3_ROPE | {"low_freq_factor": 4.0}
    with pytest.raises(ValueError, match="low_freq_factor 4.0 and high_freq_factor 4.0"):
        from_hf(hf)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_hf("/nonexistent/folder")

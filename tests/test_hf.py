import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from lwm.data import Vocab
from lwm.interop.hf import from_hf, to_hf
from lwm.model import ModelConfig, Transformer

THETA = 123_456.0


def tiny_llama(vocab_size=300, **kw):
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
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
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        from_hf(tiny_llama(tie_word_embeddings=True))
    hf = tiny_llama()
    hf.config.rope_parameters = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ValueError, match="RoPE type 'linear' is not supported"):
        from_hf(hf)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_hf("/nonexistent/folder")

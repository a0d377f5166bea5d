import pytest
import torch

from lwm.data import Vocab
from lwm.model import PRESETS, ModelConfig, RopeScaling, Transformer


def test_presets_match_the_issue():
    debug = ModelConfig.from_preset("debug")
    assert (debug.n_layers, debug.dim) == (2, 64) and debug.n_kv_heads < debug.n_heads
    b7 = ModelConfig.from_preset("7b")
    assert (b7.dim, b7.n_layers, b7.n_heads, b7.n_kv_heads, b7.ffn_dim, b7.norm_eps) == (4096, 32, 32, 32, 11008, 1e-6)
    tiny = ModelConfig.from_preset("tiny")
    assert 1e6 < tiny.num_params() < 2e7
    l3 = ModelConfig.from_preset("llama3_8b")
    assert (l3.dim, l3.n_layers, l3.n_heads, l3.n_kv_heads, l3.ffn_dim, l3.norm_eps, l3.rope_theta) == (
        4096, 32, 32, 8, 14336, 1e-5, 500000.0,
    )  # fmt: skip
    assert l3.rope_scaling == RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192
    )


@pytest.mark.parametrize(
    "name,text_size",
    [
        ("debug", 256),
        ("tiny", 4096),
        ("7b", 32000),
        ("llama3_8b", 128256),
        ("qwen2_5_7b", 151665),
        ("qwen3_8b", 151669),
    ],
)
def test_preset_vocab_is_the_vocab_layout(name, text_size):
    assert PRESETS[name].vocab_size == Vocab(text_size).size


def test_7b_on_meta_device_without_allocating():
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_preset("7b"))
    n = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters())
    assert n == model.config.num_params()
    # LLaMA-2 7B has 6.74B parameters with 32000 rows; ours adds 8256 rows to embed and output.
    assert n == 6_738_415_616 + 2 * 8256 * 4096


def test_llama3_8b_on_meta_device_is_llama_3_1_8b_plus_the_vision_rows():
    """Parameter for parameter the shapes of transformers' Llama-3.1-8B (on the meta device), and
    the rows of the vision codes and specials in embedding and output."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = ModelConfig.from_preset("llama3_8b")
    with torch.device("meta"):
        ours = Transformer(config)
        theirs = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                tie_word_embeddings=False,
            )
        )  # fmt: skip
    n = sum(p.numel() for p in ours.parameters())
    vision_rows = config.vocab_size - 128256  # 8192 vision codes, 4 specials, padding to 64
    assert vision_rows == 8256 and n == config.num_params()
    assert n == sum(p.numel() for p in theirs.parameters()) + 2 * vision_rows * 4096 == 8_030_261_248 + 2 * 8256 * 4096


def test_preset_overrides_and_unknown_name():
    assert ModelConfig.from_preset("debug", rope_theta=1e6).rope_theta == 1e6
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        ModelConfig.from_preset("huge")


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(dim=65), "dim 65 is not divisible by n_heads 4"),
        (dict(n_kv_heads=3), "n_heads 4 is not a multiple of n_kv_heads 3"),
        (dict(dim=12, n_heads=4, n_kv_heads=2), "head_dim 3 .* must be even"),
        (dict(vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (dict(rope_theta=-1.0), "rope_theta must be > 0, got -1.0"),
        (dict(mlp_chunk_size=-2), "mlp_chunk_size must be an integer >= 0"),
        (dict(norm_chunk_size=-1), "norm_chunk_size must be an integer >= 0"),
        (dict(attn_head_groups=3), "attn_head_groups 3 does not divide n_kv_heads"),
        (dict(rope_scaling={"factor": 8.0}), r"rope_scaling must be a RopeScaling or None, got \{'factor': 8.0\}"),
    ],
)
def test_validation_names_the_values(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_preset("debug", **changes)


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(factor=0.5), "factor must be >= 1, got 0.5"),
        (dict(low_freq_factor=4.0), "low_freq_factor 4.0 and high_freq_factor 4.0"),
        (dict(low_freq_factor=0.0), "0 < low_freq_factor < high_freq_factor, got low_freq_factor 0.0"),
        (dict(original_max_seq_len=0), "original_max_seq_len must be a positive integer, got 0"),
    ],
)
def test_rope_scaling_validation_names_the_values(changes, message):
    with pytest.raises(ValueError, match=message):
        RopeScaling(**changes)


def test_vocab_layout():
    v = Vocab(32000)
    assert v.vision_offset == 32000
    assert (v.eof, v.eov, v.vision_start, v.vision_end) == (40192, 40193, 40194, 40195)
    assert v.size == 40256 and v.size % 64 == 0 and v.size >= v.used_size
    assert len(v.added_tokens()) == v.used_size - v.text_size
    with pytest.raises(ValueError, match="text_size 0"):
        Vocab(0)


def test_model_package_has_no_distributed_code():
    import pathlib

    import lwm.model

    root = pathlib.Path(lwm.model.__file__).parent
    offenders = [p.name for p in root.rglob("*.py") if "torch.distributed" in p.read_text()]
    assert offenders == []


# Qwen2.5-7B's and Qwen3-8B's config.json fields (their Hugging Face model cards), the rows their
# tokenizers make ids for (151643 + 22 and + 26 added tokens), and their embeddings' rows.
QWEN = {
    "qwen2_5_7b": ("qwen2", 151665, dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                         num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                         max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3_8b": ("qwen3", 151669, dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                       num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                       max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}  # fmt: skip


@pytest.mark.parametrize("name", list(QWEN))
def test_qwen_presets_are_the_checkpoints_shapes_plus_the_vision_rows(name):
    """Parameter for parameter transformers' Qwen2.5-7B / Qwen3-8B (meta device), the embedding cut to the
    tokenizer's ids and grown by the vision rows, as init_hf makes it from the checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from lwm.interop.hf import config_from_hf

    model_type, text, fields = QWEN[name]
    hf_config = AutoConfig.for_model(model_type, rms_norm_eps=1e-6, tie_word_embeddings=False, **fields)
    preset = ModelConfig.from_preset(name)
    assert preset == config_from_hf(hf_config, vocab_size=Vocab(text).size, loss_chunk_size=preset.loss_chunk_size)
    with torch.device("meta"):
        theirs = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf_config).parameters())
        ours = sum(p.numel() for p in Transformer(preset).parameters())
    assert ours == preset.num_params() == theirs + 2 * (Vocab(text).size - fields["vocab_size"]) * preset.dim

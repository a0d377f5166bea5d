"""A run that starts from a Hugging Face base of another family (schedule.init_hf): a Qwen2-style folder
(q/k/v bias, byte-level BPE tokenizer with no BOS, an embedding padded past the tokenizer) and a
Llama-3.2-style one (tied head). What the checkpoint fixes comes from it, the run's memory settings
take effect, a contradicting override is refused, an lr-0 step exports a model whose logits on text
ids are the base's, and a stopped and resumed run ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json

import pytest
import torch
from hf_models import tiny_hf
from hf_tokenizers import CORPUS, llama3_folder, qwen_folder
from omegaconf import OmegaConf
from safetensors.torch import load_file
from train_runs import main_in_process
from transformers import AutoModelForCausalLM, AutoTokenizer

from lwm.data import TextTokenizer, Vocab
from lwm.interop.bundle import read_bundle_info
from lwm.interop.hf import from_hf

MEMORY = ["model.mlp_chunk_size=16", "model.attn_head_groups=2", "model.norm_chunk_size=16", "model.loss_chunk_size=32"]


def base_folder(root, family: str):
    """A tokenizer folder and a random model of `family` beside it, its embedding 40 rows past the
    tokenizer's ids (as Qwen pads 151665 ids to 152064 rows)."""
    make = qwen_folder if family == "qwen2" else llama3_folder
    folder = make(root / family)
    rows = TextTokenizer(folder).vocab_size + 40
    tiny_hf(family, vocab_size=rows).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {f: base_folder(root, f) for f in ("qwen2", "llama3_2_tied")}


def start(folder, *more, steps: int = 1):
    theta = json.loads((folder / "config.json").read_text())["rope_parameters"]["rope_theta"]  # the base's, kept
    stage = ["stage_only=a", f"schedule.stages.0.steps={steps}", f"schedule.stages.0.rope_theta={theta}"]
    return [f"schedule.init_hf={folder}", f"data.tokenizer={folder}", *stage, *more]


@pytest.mark.parametrize("family", ["qwen2", "llama3_2_tied"])
def test_lr_zero_step_exports_the_base_model(bases, family, tmp_path, monkeypatch, capsys):
    folder = bases[family]
    out = tmp_path / "run"
    code, stdout, stderr = main_in_process(
        monkeypatch, capsys, out, *start(folder, "schedule.stages.0.lr=0", "export=true", *MEMORY)
    )
    assert code == 0, stderr[-3000:]
    # what trained: the folder's shapes and options, the run's memory settings, in config.yaml and the header
    trained = json.loads((out / "a" / "model_config.json").read_text())
    written = OmegaConf.load(out / "config.yaml")["model"]
    text = TextTokenizer(folder).vocab_size
    want = {
        "dim": 64,
        "vocab_size": Vocab(text).size,
        "qkv_bias": family == "qwen2",
        "tie_embeddings": "tied" in family,
    }
    want |= {"mlp_chunk_size": 16, "attn_head_groups": 2, "norm_chunk_size": 16, "loss_chunk_size": 32}
    assert {k: trained[k] for k in want} == want and {k: written[k] for k in want} == want
    assert f"model {folder} (" in stdout and "chunks mlp 16 norm 16 loss 32, head groups 2" in stdout

    base = AutoModelForCausalLM.from_pretrained(folder).eval()
    exported = AutoModelForCausalLM.from_pretrained(out / "hf").eval()
    assert type(exported) is type(base) and exported.config.tie_word_embeddings == ("tied" in family)
    ids = torch.randint(0, text, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, ours = base(ids).logits[..., :text], exported(ids).logits[..., :text]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the export's tokenizer is the base's, with the base's special ids
    tokenizer, original = AutoTokenizer.from_pretrained(out / "hf"), AutoTokenizer.from_pretrained(folder)
    assert all(
        tokenizer.encode(t, add_special_tokens=False) == original.encode(t, add_special_tokens=False) for t in CORPUS
    )
    config = json.loads((out / "hf" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (original.bos_token_id, original.eos_token_id)
    assert read_bundle_info(out / "hf").prompt == "template"  # its prompts are written in the base's chat template


def test_an_override_that_contradicts_the_checkpoint_is_refused(bases, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, _, stderr = main_in_process(
        monkeypatch, capsys, out, *start(bases["qwen2"], "model.dim=128", "model.qk_norm=true")
    )
    assert code == 2
    assert "model.dim=128 (the checkpoint's is 64), model.qk_norm=True (the checkpoint's is False)" in stderr, stderr
    assert not out.exists()  # refused before anything is written


def test_a_stopped_and_resumed_run_ends_bit_identical(bases, tmp_path, monkeypatch, capsys):
    folder = bases["qwen2"]
    four = start(folder, "schedule.stages.0.lr=1e-3", steps=4)
    code, _, stderr = main_in_process(monkeypatch, capsys, tmp_path / "whole", *four)
    assert code == 0, stderr[-3000:]
    code, _, stderr = main_in_process(monkeypatch, capsys, tmp_path / "parts", *four, "stop_at_step=2")
    assert code == 4, stderr[-3000:]
    code, _, stderr = main_in_process(monkeypatch, capsys, tmp_path / "parts", *four, "resume=true")
    assert code == 0, stderr[-3000:]
    whole, parts = (
        load_file(tmp_path / "whole" / "a" / "final.safetensors"),
        load_file(tmp_path / "parts" / "a" / "final.safetensors"),
    )
    assert whole.keys() == parts.keys() and all(torch.equal(whole[k], parts[k]) for k in whole)
    key = "layers.0.attn.wq.bias"  # and the steps moved the weights
    assert not torch.equal(parts[key], from_hf(folder).state_dict()[key])

"""A model for inference from a Hugging Face folder or from our training outputs, with its
vocabulary and text tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.interop.bundle import BundleInfo, read_bundle_info
from lwm.interop.hf import from_hf
from lwm.interop.stage_outputs import load_stage
from lwm.model import Transformer


@dataclass
class Loaded:
    model: Transformer | None  # None: run in other processes (lwm.infer.spawned)
    vocab: Vocab
    tokenizer: TextTokenizer
    prompt: str = "native"  # how prompts are written for this model (lwm.interop.bundle)
    vqgan: Path | None = None  # the VQGAN folder that comes with the model, if any


def find_tokenizer(source: Path, tokenizer) -> Path:
    """`tokenizer` when given (a sentencepiece model, a tokenizer.json, or a folder holding either); else the
    model's folder when it holds its own tokenizer (tokenizer.model, else tokenizer.json: lwm.data.TextTokenizer
    picks), else the run's hf/ export beside a stage folder."""
    if tokenizer is not None:
        if not Path(tokenizer).exists():
            raise FileNotFoundError(f"tokenizer {tokenizer} does not exist")
        return Path(tokenizer)
    folder = source if source.is_dir() else source.parent
    for candidate in (folder, folder.parent / "hf"):
        if any((candidate / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
            return candidate
    raise FileNotFoundError(
        f"no tokenizer.json or tokenizer.model in or next to {source}; pass the tokenizer (--tokenizer: a "
        "sentencepiece model, a tokenizer.json or a model folder)"
    )


def load_model(source, tokenizer=None, device="cpu", dtype: torch.dtype | None = None) -> Loaded:
    """source: a Hugging Face LLaMA folder (config.json; with lwm.json, its prompt style and VQGAN),
    a training stage folder, a final.safetensors or a Lightning checkpoint. tokenizer: the
    text tokenizer (lwm.data.TextTokenizer: a sentencepiece model, a tokenizer.json or a folder); found in the
    folder (or the run's hf/ export) when not given. A text-only
    LLaMA (as many rows as text ids) gets zero-initialized vision rows; text generation restricted
    to text (lwm-generate's default) is unchanged by them."""
    source = Path(source)
    companions = model_companions(source, tokenizer)
    if _is_hf(source):
        model = from_hf(source, dtype=dtype)
    else:
        weights, config = load_stage(source)
        config = config.replace(attn_head_groups=1)  # a training memory setting; the KV cache takes whole layers
        with torch.device("meta"):
            model = Transformer(config)
        model.load_state_dict(weights, strict=True, assign=True)
    text, vocab = companions.tokenizer, companions.vocab
    if model.config.vocab_size == text.vocab_size:
        model = with_vision_rows(model, vocab)
    if vocab.used_size > model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {text.vocab_size} text ids (vocabulary of {vocab.used_size} with vision and "
            f"specials) but the model {source} has only {model.config.vocab_size} rows"
        )
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return Loaded(model.eval(), vocab, text, companions.prompt, companions.vqgan)


def _is_hf(source: Path) -> bool:
    return source.is_dir() and (source / "config.json").exists()


def model_companions(source, tokenizer=None) -> Loaded:
    """What comes with the model at `source` but its weights (`model` None): the tokenizer, the vocabulary,
    the prompt style and the VQGAN folder, for a process that runs the model in others."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"model {source} does not exist")
    info = read_bundle_info(source) if _is_hf(source) else BundleInfo()
    text = TextTokenizer(find_tokenizer(source, tokenizer))
    return Loaded(None, Vocab(text.vocab_size), text, info.prompt, info.vqgan)


def with_vision_rows(model: Transformer, vocab: Vocab) -> Transformer:
    """A text-only model grown to the vocabulary's rows, the new embedding and output rows zero."""
    state = model.state_dict()
    for key in [k for k in ("embed.weight", "output.weight") if k in state]:  # a tied head has no weight of its own
        rows = state[key]
        state[key] = torch.cat([rows, rows.new_zeros(vocab.size - rows.shape[0], rows.shape[1])])
    with torch.device("meta"):
        grown = Transformer(model.config.replace(vocab_size=vocab.size))
    grown.load_state_dict(state, strict=True, assign=True)
    return grown

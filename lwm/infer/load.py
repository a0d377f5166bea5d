"""A model for inference from a Hugging Face folder or from our training outputs, with its
vocabulary and text tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.model import Transformer


@dataclass
class Loaded:
    model: Transformer
    vocab: Vocab
    tokenizer: TextTokenizer


def find_tokenizer(source: Path, tokenizer) -> Path:
    if tokenizer is not None:
        if not Path(tokenizer).is_file():
            raise FileNotFoundError(f"tokenizer {tokenizer} does not exist")
        return Path(tokenizer)
    folder = source if source.is_dir() else source.parent
    for candidate in (folder / "tokenizer.model", folder.parent / "hf" / "tokenizer.model"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no tokenizer.model in or next to {source}; pass the sentencepiece model (--tokenizer)")


def load_model(source, tokenizer=None, device="cpu", dtype: torch.dtype | None = None) -> Loaded:
    """source: a Hugging Face LLaMA folder (config.json), a training stage folder, a
    final.safetensors or a Lightning checkpoint. tokenizer: the sentencepiece model; found in the
    folder (or the run's hf/ export) when not given."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"model {source} does not exist")
    if source.is_dir() and (source / "config.json").exists():
        from lwm.interop.hf import from_hf

        model = from_hf(source, dtype=dtype)
    else:
        from lwm.interop.checkpoint import load_stage

        weights, config = load_stage(source)
        with torch.device("meta"):
            model = Transformer(config)
        model.load_state_dict(weights, strict=True, assign=True)
    text = TextTokenizer(find_tokenizer(source, tokenizer))
    vocab = Vocab(text.vocab_size)
    if vocab.used_size > model.config.vocab_size:
        raise ValueError(f"tokenizer has {text.vocab_size} text ids (vocabulary of {vocab.used_size} with vision and "
                         f"specials) but the model {source} has only {model.config.vocab_size} rows")
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return Loaded(model.eval(), vocab, text)

"""The text tokenizer of a Hugging Face folder: what a folder's tokenizer already holds of
lwm.data.Vocab, and an export's tokenizer with the vision codes and special tokens added at the
vocabulary's ids."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lwm.data.vocab import SPECIAL_TOKENS, Vocab, vision_token_name


@dataclass(frozen=True)
class TokenIds:
    """The ids config.json and generation_config.json name (None: the tokenizer has no such token)."""

    bos: int | None
    eos: int | None
    pad: int | None = None


def vision_text_size(folder) -> int | None:
    """How many text ids a folder's vocabulary has when its tokenizer already holds lwm.data.Vocab's
    vision tokens (a folder this project's export or lwm-convert-lwm wrote): the id of the first
    vision code; None for a text-only folder (or one without tokenizer.json)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        added = json.loads(path.read_text()).get("added_tokens", [])
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{path} is not a tokenizer's JSON: {e}") from None
    first = vision_token_name(0)
    return next((t.get("id") for t in added if isinstance(t, dict) and t.get("content") == first), None)


def write_tokenizer(tokenizer_model: Path, vocab_size: int, out_dir: Path, prompt: str = "native") -> TokenIds:
    """A LlamaTokenizer whose added tokens sit at lwm.data.Vocab's ids: the vision codes, then <eof>
    <eov> <vision> </vision>. For prompt style "lwm" the last two are left out, since LWM writes
    <vision> and </vision> as text; for a text-only model (vocab_size = text ids) nothing is added."""
    import sentencepiece as spm
    from transformers import LlamaTokenizer

    text_size = spm.SentencePieceProcessor(model_file=str(tokenizer_model)).get_piece_size()
    vocab = Vocab(text_size)
    if vocab_size not in (vocab.size, text_size):
        raise ValueError(
            f"tokenizer {tokenizer_model} has {text_size} text ids, which makes a vocabulary of {vocab.size} "
            f"rows, but the model has vocab_size {vocab_size} (a text-only model would have {text_size})"
        )
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(tokenizer_model, Path(tmp) / "tokenizer.model")  # the converter reads this name
        tok = LlamaTokenizer.from_pretrained(tmp, add_bos_token=True, add_eos_token=False)
    if vocab_size != text_size:
        specials = list(SPECIAL_TOKENS[:2] if prompt == "lwm" else SPECIAL_TOKENS)
        n_vision = tok.add_tokens(vocab.added_tokens()[: vocab.n_vision_codes], special_tokens=False)
        n_special = tok.add_tokens(specials, special_tokens=True)
        ids = tok.convert_tokens_to_ids([vocab.added_tokens()[0], specials[-1]])
        want = [vocab.vision_offset, vocab.eof + len(specials) - 1]
        if n_vision + n_special != vocab.n_vision_codes + len(specials) or ids != want:
            raise RuntimeError(f"added tokens landed at {ids}, expected {want}")
    tok.save_pretrained(out_dir)
    shutil.copy(tokenizer_model, out_dir / "tokenizer.model")  # for sentencepiece users of the folder
    return TokenIds(bos=tok.bos_token_id, eos=tok.eos_token_id)

"""The one text-tokenizer seam: a sentencepiece model (the bundled one for `tiny`, LLaMA-2's) or a Hugging Face
tokenizer (Llama-3's, Qwen2.5's and Qwen3's byte-level BPE tokenizer.json with its tokenizer_config.json).

    TextTokenizer("data/sample/tokenizer.model")        sentencepiece
    TextTokenizer("Qwen2.5-7B-Instruct")                 a model folder: its tokenizer.model, else its tokenizer.json
    TextTokenizer("Llama-3.1-8B/tokenizer.json")         the folder's tokenizer_config.json is honoured when beside it

Either kind gives text ids in [0, vocab_size), BOS (None for Qwen, which writes none), the EOS the tokenizer's own
config names (Llama-3-Instruct's <|eot_id|>, Qwen-Instruct's <|im_end|>), pad, and the chat template when the
tokenizer has one. A folder this project exported holds lwm.data.Vocab's vision tokens after the text ids;
the text ids end where they begin.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lwm.data.vocab import vision_token_name

KINDS = ("sentencepiece", "hf")
EXPECTED = "a sentencepiece .model file, a Hugging Face tokenizer.json, or a model folder holding either"
# The files of a Hugging Face tokenizer folder that decide its ids and chat form (hashed for an index's signature)
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def locate(path: str | Path) -> tuple[str, Path]:
    """(kind, the file that defines the tokenizer) for a path: a folder's tokenizer.model wins over its
    tokenizer.json (LLaMA-2's and Mistral's folders hold both and were trained with the sentencepiece model,
    and an export of a sentencepiece run keeps the model it trained with: folders exported before the export
    wrote sentencepiece's normalization into the JSON encode differently through it); a .json file is a
    tokenizer.json."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"text tokenizer {path} does not exist; expected {EXPECTED}")
    if path.is_dir():
        for name, kind in (("tokenizer.model", "sentencepiece"), ("tokenizer.json", "hf")):
            if (path / name).is_file():
                return kind, path / name
        raise ValueError(
            f"text tokenizer folder {path} holds neither tokenizer.json (Hugging Face) nor tokenizer.model (sentencepiece)"
        )
    return ("hf" if path.suffix == ".json" else "sentencepiece"), path


def vision_offset(tokenizer_json: Path) -> int | None:
    """The id of lwm.data.Vocab's first vision token in a tokenizer.json that holds them (a folder this project
    exported or lwm-convert-lwm wrote): where its text ids end. None for a text-only tokenizer."""
    try:
        added = json.loads(Path(tokenizer_json).read_text(encoding="utf-8")).get("added_tokens", [])
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"{tokenizer_json} is not a tokenizer's JSON: {e}") from None
    first = vision_token_name(0)
    return next((t.get("id") for t in added if isinstance(t, dict) and t.get("content") == first), None)


class TextTokenizer:
    """kind: "sentencepiece" | "hf"; path: what it was opened from (a file or a folder)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.kind, self.file = locate(self.path)
        if self.kind == "sentencepiece":
            self._open_sentencepiece()
        else:
            self._open_hf()
        if self.eos_id is None:
            raise ValueError(f"text tokenizer {self.path} has no EOS token; every example ends with one")

    def _open_sentencepiece(self) -> None:
        import sentencepiece as spm

        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.file))
        except (RuntimeError, OSError) as e:  # "could not parse ModelProto": another kind of file
            raise ValueError(f"{self.file} is not a sentencepiece model ({e}); expected {EXPECTED}") from None
        self.files = [self.file]
        self.vocab_size = self.sp.get_piece_size()
        ids = (self.sp.bos_id(), self.sp.eos_id(), self.sp.pad_id())  # -1: the model has none
        self.bos_id, self.eos_id, self.pad_id = (i if i >= 0 else None for i in ids)
        self.chat_template = None

    def _open_hf(self) -> None:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        folder = self.file.parent
        configured = self.file.name == "tokenizer.json" and (folder / "tokenizer_config.json").is_file()
        try:  # through the folder when it has a config: its bos/eos/pad, added tokens and chat template
            if configured:
                self.hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            else:
                self.hf = PreTrainedTokenizerFast(tokenizer_file=str(self.file))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed tokenizer.json
            raise ValueError(f"{self.file} is not a Hugging Face tokenizer ({e}); expected {EXPECTED}") from None
        if not self.hf.is_fast:
            raise ValueError(
                f"{folder} loads as a {type(self.hf).__name__}; expected a tokenizer.json (a fast tokenizer)"
            )
        self.files = [folder / n for n in HF_FILES if (folder / n).is_file()] if configured else [self.file]
        offset = vision_offset(self.file)
        self.vocab_size = len(self.hf) if offset is None else offset
        self.bos_id, self.eos_id, self.pad_id = self.hf.bos_token_id, self.hf.eos_token_id, self.hf.pad_token_id
        template = self.hf.chat_template
        self.chat_template = template.get("default") if isinstance(template, dict) else template

    def encode(self, text: str) -> list[int]:
        """Text ids, no BOS or EOS."""
        if self.kind == "sentencepiece":
            return self.sp.encode(text)
        return self.hf.encode(text, add_special_tokens=False)

    def with_bos(self, ids: list[int]) -> list[int]:
        """[BOS] + ids, or ids for a tokenizer that writes no BOS (Qwen's)."""
        return list(ids) if self.bos_id is None else [self.bos_id, *ids]

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The tokenizer's chat template applied to messages ({"role", "content"}), as text."""
        if self.chat_template is None:
            raise ValueError(f"text tokenizer {self.path} has no chat template; use prompt style native or lwm")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def decode(self, ids) -> str:
        """Text of the text ids among `ids` (vision ids and padding rows are left out), special tokens dropped."""
        text_ids = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        if self.kind == "sentencepiece":
            return self.sp.decode(text_ids)
        return self.hf.decode(text_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def pieces(self) -> list[str]:
        """Each text id's piece as text, with the space a word starts with as " " (sentencepiece writes it "▁",
        byte-level BPE "Ġ"); special tokens as written ("<s>", "<|im_end|>")."""
        if self.kind == "sentencepiece":
            return [self.sp.id_to_piece(i).replace("\u2581", " ") for i in range(self.vocab_size)]
        from tokenizers import decoders

        tokens = self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))
        decoder = self.hf.backend_tokenizer.decoder
        if isinstance(decoder, decoders.ByteLevel):  # one token at a time: a word's leading space is kept
            return [decoder.decode([t]) if t is not None else "" for t in tokens]
        return [(t or "").replace("\u2581", " ") for t in tokens]

    def content_hash(self) -> str:
        """sha256 of the tokenizer's files (for one file, of its bytes): what an index of encoded examples
        depends on."""
        if len(self.files) == 1:
            return hashlib.sha256(self.files[0].read_bytes()).hexdigest()
        digest = hashlib.sha256()
        for f in self.files:
            digest.update(f"{f.name}\0{hashlib.sha256(f.read_bytes()).hexdigest()}\0".encode())
        return digest.hexdigest()

    def __repr__(self) -> str:
        return f"TextTokenizer({str(self.path)!r}, kind={self.kind!r}, vocab_size={self.vocab_size})"

"""Tiny tokenizers of the kinds real bases ship, built here from the repository's own text (no downloads):

- `llama3_folder`: byte-level BPE with Llama-3's split pattern, `<|begin_of_text|>` BOS, `<|eot_id|>` EOS
  (as Llama-3-Instruct's tokenizer_config.json says), `<|end_of_text|>`, no pad, a Llama-3-like chat template;
- `qwen_folder`: byte-level BPE with NFC, no BOS, `<|im_end|>` EOS, `<|endoftext|>` pad, a ChatML template with
  Qwen2.5's default system turn;
- `sentencepiece_model`: a sentencepiece BPE with sentencepiece's default normalization (nmt_nfkc, extra
  whitespace removed), the kind LLaMA-2's tokenizer.model is.

Each Hugging Face folder holds tokenizer.json + tokenizer_config.json, written by PreTrainedTokenizerFast's
save_pretrained. `CORPUS` is text that tokenizers tend to disagree on: leading, trailing and doubled spaces,
newlines, tabs, unicode and emoji.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
QWEN_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "The red circle moves left.",
    " a leading space",
    "a trailing space ",
    "  two leading spaces and two trailing  ",
    "doubled  spaces   and    more",
    "line one\nline two\n\nafter a blank line",
    "\nstarts with a newline",
    "ends with a newline\n",
    "\ttab\tseparated\tfields\t",
    "mixed \t \n whitespace \r\n windows",
    "   ",
    "café naïve résumé Ångström über straße",
    "日本語のテキストと中文",
    "Ελληνικά и русский текст",
    "emoji 🎥 and 👍🏽 and 🇫🇷 flags",
    "ﬁ ligature, ① circled, ＡＢＣ fullwidth, ½ fraction, ™ sign",
    "numbers 1234567 and 3.14159, 1,000,000",
    "code: def f(x): return x ** 2  # comment",
    "quotes 'single' \"double\" and it's don't we'll",
    "punctuation!!! ??? ... --- ;;;",
    "non\u00a0breaking and ideographic\u3000space",
    "USER: What color is the square? ASSISTANT: Green.",
]


def training_text(limit: int = 12_000) -> str:
    """A few KB of the repository's own prose (the guides), the same on every run of one checkout."""
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    return text[:limit] + "\n" + "\n".join(CORPUS[:1] + ["café naïve Ångström 日本語 🎥 👍"])


def _byte_level_bpe(split: str, nfc: bool, vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(training_text().splitlines(), trainer)
    return tok


def llama3_folder(folder: Path, vocab_size: int = 700) -> Path:
    """A Llama-3-Instruct-style tokenizer folder (the special tokens after the trained ids, as in Llama-3)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _byte_level_bpe(LLAMA3_SPLIT, nfc=False, vocab_size=vocab_size)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=LLAMA3_TEMPLATE
    )
    return _save(fast, folder, "PreTrainedTokenizerFast")


def qwen_folder(folder: Path, vocab_size: int = 700) -> Path:
    """A Qwen2.5-Instruct-style tokenizer folder: no BOS, EOS <|im_end|>, pad <|endoftext|>."""
    from transformers import PreTrainedTokenizerFast

    tok = _byte_level_bpe(QWEN_SPLIT, nfc=True, vocab_size=vocab_size)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN_TEMPLATE
    )
    return _save(fast, folder, "Qwen2Tokenizer")


def _save(fast, folder: Path, tokenizer_class: str) -> Path:
    """save_pretrained, with the class name the real base's tokenizer_config.json gives (transformers picks its
    tokenizer class by it)."""
    fast.save_pretrained(folder)
    config = Path(folder) / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": tokenizer_class}, indent=2))
    return Path(folder)


def sentencepiece_model(path: Path, vocab_size: int = 400) -> Path:
    """A sentencepiece BPE with the trainer's default normalization (nmt_nfkc, extra whitespace removed),
    unk 0, bos 1, eos 2, no pad, no byte fallback: what LLaMA-2-era models ship, at a tiny size."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text().splitlines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    Path(path).write_bytes(model.getvalue())
    return Path(path)

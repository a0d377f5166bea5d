"""The text tokenizer of a Hugging Face folder: what a folder's tokenizer already holds of
lwm.data.Vocab, and an export's tokenizer with the vision codes and special tokens added at the
vocabulary's ids."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from lwm.data.chat import native_chat_template
from lwm.data.text_tokenizer import TextTokenizer, vision_offset
from lwm.data.vocab import SPECIAL_TOKENS, Vocab


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
    return vision_offset(path) if path.is_file() else None


def write_tokenizer(tokenizer: Path, vocab_size: int, out_dir: Path, prompt: str = "native") -> TokenIds:
    """The base's own tokenizer with lwm.data.Vocab's tokens added at the vocabulary's ids: the vision codes,
    then <eof> <eov> <vision> </vision> (for prompt style "lwm" the last two are left out, since LWM writes
    <vision> and </vision> as text; for a text-only model, vocab_size = text ids, nothing is added).
    `tokenizer`: whatever lwm.data.TextTokenizer opens. A Hugging Face tokenizer keeps its tokenizer.json's
    pipeline, its config and chat template; a sentencepiece model becomes a tokenizer.json that encodes
    exactly as sentencepiece does (sentencepiece_tokenizer), beside a copy of the model. The ids returned are
    the tokenizer's own BOS (None: it writes none), EOS and pad."""

    text = TextTokenizer(tokenizer)
    vocab = Vocab(text.vocab_size)
    if vocab_size not in (vocab.size, text.vocab_size):
        raise ValueError(
            f"tokenizer {tokenizer} has {text.vocab_size} text ids, which makes a vocabulary of {vocab.size} "
            f"rows, but the model has vocab_size {vocab_size} (a text-only model would have {text.vocab_size})"
        )
    if text.kind == "hf":
        fast = text.hf  # opened for this call alone: adding to it changes no one else's
    else:
        fast = sentencepiece_tokenizer(text.file, native_chat_template() if prompt == "native" else None)
    if vocab_size != text.vocab_size:
        _add_vocab_tokens(fast, vocab, prompt, tokenizer)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    if text.kind == "sentencepiece":
        shutil.copy(text.file, Path(out_dir) / "tokenizer.model")  # for sentencepiece users of the folder
    return TokenIds(bos=text.bos_id, eos=text.eos_id, pad=text.pad_id)


def _add_vocab_tokens(fast, vocab: Vocab, prompt: str, source) -> None:
    """The vision codes (plain tokens: a model may write them in text) and the special tokens, checked to
    land at the vocabulary's ids (a tokenizer whose ids have gaps would put them elsewhere)."""
    specials = list(SPECIAL_TOKENS[:2] if prompt == "lwm" else SPECIAL_TOKENS)
    fast.add_tokens(vocab.added_tokens()[: vocab.n_vision_codes], special_tokens=False)
    fast.add_tokens(specials, special_tokens=True)
    names = [vocab.added_tokens()[0], vocab.added_tokens()[vocab.n_vision_codes - 1], specials[-1]]
    ids = fast.convert_tokens_to_ids(names)
    want = [vocab.vision_offset, vocab.eof - 1, vocab.eof + len(specials) - 1]
    if ids != want or len(fast) != want[-1] + 1:
        raise RuntimeError(
            f"the tokens added to {source}'s tokenizer landed at {ids} (of {len(fast)} ids), expected {want}"
        )


def sentencepiece_tokenizer(model_file: Path, chat_template: str | None = None):
    """A PreTrainedTokenizerFast that encodes text as the sentencepiece BPE model does, its normalization
    included (transformers' LlamaTokenizer conversion leaves the model's normalizer out: with sentencepiece's
    default nmt_nfkc and whitespace removal it encodes tabs, newlines, doubled, leading and trailing spaces and
    compatibility characters otherwise). BOS is written first, as LLaMA's tokenizer does."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    proto = pb.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    if proto.trainer_spec.model_type != pb.TrainerSpec.BPE:
        kind = pb.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
        raise ValueError(f"sentencepiece model {model_file} is a {kind} model; the export converts BPE models only")
    tok = sentencepiece_backend(proto)
    piece = lambda i: proto.pieces[i].piece if 0 <= i < len(proto.pieces) else None  # noqa: E731
    spec = proto.trainer_spec
    bos = piece(spec.bos_id)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, spec.bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=piece(spec.eos_id),
        unk_token=piece(spec.unk_id),
        pad_token=piece(spec.pad_id),
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )


def sentencepiece_backend(proto):
    """A tokenizers.Tokenizer equal to a sentencepiece BPE ModelProto: the same ids, pieces merged by the
    merged piece's score (sentencepiece merges the adjacent pair whose union scores highest), unknown runs
    fused into one unk as sentencepiece does, and the model's normalizer spec step by step."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers

    kinds = pb.ModelProto.SentencePiece
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    normal = {p.piece for p in proto.pieces if p.type == kinds.NORMAL}
    merges = sorted(
        (-proto.pieces[vocab[p]].score, vocab[p], (p[:k], p[k:]))
        for p in normal
        for k in range(1, len(p))
        if p[:k] in normal and p[k:] in normal
    )
    unk = proto.pieces[proto.trainer_spec.unk_id].piece
    tok = Tokenizer(
        models.BPE(
            vocab, [m for *_, m in merges], unk_token=unk, fuse_unk=True, byte_fallback=proto.trainer_spec.byte_fallback
        )
    )
    spec = proto.normalizer_spec
    # The charsmap is sentencepiece's own table; tokenizers applies it per grapheme where sentencepiece takes the
    # longest match, so a combining mark after a character the table rewrites ("ﬁ" + U+0301) can normalize
    # otherwise. Text without combining marks (5000 random strings of spaces, tabs, newlines, CJK, emoji, ligatures)
    # encoded the same.
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:  # spaces only (what the charsmap made of tabs and newlines included)
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend("\u2581"))
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    undo = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(undo + ([decoders.Strip(" ", 1, 0)] if spec.add_dummy_prefix else []))
    user = [p.piece for p in proto.pieces if p.type == kinds.USER_DEFINED]  # matched whole, as sentencepiece does
    tok.add_tokens([AddedToken(p, special=False, normalized=True) for p in user])
    return tok

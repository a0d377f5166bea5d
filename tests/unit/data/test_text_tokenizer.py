"""The text-tokenizer seam (lwm.data.TextTokenizer) for sentencepiece models and Hugging Face tokenizers, its
callers with a tokenizer that writes no BOS, and the export of either kind in the base's own Hugging Face form
(lwm.interop.hf_tokenizer.write_tokenizer), checked against transformers' AutoTokenizer on the exported folder."""

import json
import pickle
import shutil

import numpy as np
import pytest
import sentencepiece as spm
from hf_tokenizers import CORPUS, LLAMA3_TEMPLATE, ROOT, llama3_folder, qwen_folder, sentencepiece_model
from transformers import AutoTokenizer

from lwm.data import TextTokenizer, Vocab, encode_example
from lwm.data.chat import SYSTEM, chat_prompt
from lwm.data.example import Encoder
from lwm.interop.hf_tokenizer import TokenIds, vision_text_size, write_tokenizer

KINDS = ("sentencepiece", "llama3", "qwen")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The three tiny tokenizers: kind -> the path a user would pass (a .model file, or a folder)."""
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "sentencepiece": sentencepiece_model(root / "sp.model"),
        "llama3": llama3_folder(root / "llama3"),
        "qwen": qwen_folder(root / "qwen"),
    }


def export_corpus() -> list[str]:
    """CORPUS, every line of the README, and a few lines joined into one text (newlines inside a text)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    return CORPUS + lines + ["\n".join(CORPUS[:8]), "\n\n".join(lines[:20])]


def hf_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# --- the seam --------------------------------------------------------------------------------------------------


def test_sentencepiece_kind_is_the_model(made):
    path = made["sentencepiece"]
    sp = spm.SentencePieceProcessor(model_file=str(path))
    for given in (path, _folder_with(path.parent / "spfolder", path, "tokenizer.model")):
        tok = TextTokenizer(given)
        assert (tok.kind, tok.path, tok.vocab_size) == ("sentencepiece", given, sp.get_piece_size())
        assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.chat_template) == (1, 2, None, None)
        assert [tok.encode(t) for t in CORPUS] == [sp.encode(t) for t in CORPUS]


def _folder_with(folder, file, name):
    folder.mkdir(exist_ok=True)
    shutil.copy(file, folder / name)
    return folder


def test_llama3_folder_ids_from_its_files(made):
    folder = made["llama3"]
    hf = AutoTokenizer.from_pretrained(folder)
    for given in (folder, folder / "tokenizer.json"):  # the file: its folder's tokenizer_config.json is honoured
        tok = TextTokenizer(given)
        assert tok.kind == "hf" and tok.path == given
        assert tok.bos_id == hf.convert_tokens_to_ids("<|begin_of_text|>") == 700  # after the 700 trained ids
        assert tok.eos_id == hf.convert_tokens_to_ids("<|eot_id|>") == 704  # tokenizer_config's, not <|end_of_text|>
        assert tok.pad_id is None and tok.chat_template == LLAMA3_TEMPLATE
        assert tok.vocab_size == len(hf) == 705  # the added special tokens are text ids
        assert [tok.encode(t) for t in CORPUS] == [hf_ids(hf, t) for t in CORPUS]


def test_qwen_folder_has_no_bos(made):
    tok = TextTokenizer(made["qwen"])
    hf = AutoTokenizer.from_pretrained(made["qwen"])
    assert tok.bos_id is None
    assert (tok.eos_id, tok.pad_id) == (
        hf.convert_tokens_to_ids("<|im_end|>"),
        hf.convert_tokens_to_ids("<|endoftext|>"),
    )
    assert tok.vocab_size == tok.eos_id + 1 == len(hf) == 703
    assert "<|im_start|>" in tok.chat_template
    ids = tok.encode("hello <|im_end|> world")  # a special token in the text is that token, as transformers has it
    assert tok.eos_id in ids and tok.decode(ids) == "hello  world"


def test_decode_leaves_out_ids_past_the_text(made):
    for kind in KINDS:
        tok = TextTokenizer(made[kind])
        ids = tok.encode("the red circle moves left")
        assert tok.decode([*ids, tok.vocab_size, tok.vocab_size + 8000, -1]) == tok.decode(ids)
        assert "red circle" in tok.decode(ids)


def test_pieces_mark_word_starts_for_both_kinds(made):
    for kind in KINDS:
        tok = TextTokenizer(made[kind])
        ids = tok.encode("Moves left. Then right")
        pieces = tok.pieces()
        assert len(pieces) == tok.vocab_size
        joined = "".join(pieces[i] for i in ids)
        assert joined.strip() == "Moves left. Then right"
        offsets = np.cumsum([0] + [len(pieces[i]) for i in ids[:-1]])
        starts = [int(o) for o, i in zip(offsets, ids) if pieces[i].startswith(" ")]
        assert starts == [k for k, c in enumerate(joined) if c == " "]  # every word after a space starts a piece


def test_refusals_name_the_path_and_what_was_expected(made, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"text tokenizer {tmp_path / 'nope'} does not exist; expected"):
        TextTokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty holds neither tokenizer.json .* nor tokenizer.model"):
        TextTokenizer(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"README.md is not a sentencepiece model .*expected a sentencepiece .model"):
        TextTokenizer(ROOT / "README.md")
    (tmp_path / "bad.json").write_text('{"version": "1.0"}')
    with pytest.raises(ValueError, match=r"bad.json is not a Hugging Face tokenizer .*expected"):
        TextTokenizer(tmp_path / "bad.json")
    lone = _folder_with(tmp_path / "lone", made["qwen"] / "tokenizer.json", "tokenizer.json")  # no config: no EOS
    with pytest.raises(ValueError, match=f"text tokenizer {lone} has no EOS token"):
        TextTokenizer(lone)


# --- callers: examples, indexes, prompts -----------------------------------------------------------------------


def test_examples_write_bos_only_when_the_tokenizer_has_one(made):
    example = {"q": "What moves?", "a": "The red circle.", "fields": "[q],a"}
    for kind, first in (("llama3", 700), ("qwen", None), ("sentencepiece", 1)):
        tok = TextTokenizer(made[kind])
        enc = encode_example(example, Vocab(tok.vocab_size), tok)
        body = tok.encode("What moves?") + tok.encode("The red circle.")
        assert enc.tokens.tolist() == ([] if first is None else [first]) + body + [tok.eos_id]
        assert enc.loss_mask.tolist() == [False] * (len(enc) - len(tok.encode("The red circle.")) - 1) + [True] * (
            len(tok.encode("The red circle.")) + 1
        )


def test_encoder_pickles_and_its_signature_follows_the_folders_config(made, tmp_path):
    folder = shutil.copytree(made["qwen"], tmp_path / "qwen")
    encoder = Encoder(Vocab(703), TextTokenizer(folder))
    again = pickle.loads(pickle.dumps(encoder))
    example = {"t": "hello there", "fields": "t"}
    assert again.text_tokenizer.kind == "hf"
    np.testing.assert_array_equal(again(example, None, "k").tokens, encoder(example, None, "k").tokens)
    before = encoder.signature()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|endoftext|>"}))
    assert Encoder(Vocab(703), TextTokenizer(folder)).signature()["tokenizer_sha256"] != before["tokenizer_sha256"]
    sp = Encoder(Vocab(400), TextTokenizer(made["sentencepiece"]))
    assert pickle.loads(pickle.dumps(sp)).signature() == sp.signature()


def test_data_tokenizer_may_be_a_folder_or_its_tokenizer_json(made):
    """Refused before: data.tokenizer=DIR "does not exist"; DIR/tokenizer.json "is not a sentencepiece model"."""
    from lwm.core.config import DataSpec, check_data_files

    for given in (made["llama3"], made["llama3"] / "tokenizer.json"):
        spec = DataSpec(tokenizer=str(given))
        check_data_files(spec)
        assert spec.vocab_rows() == Vocab(705).size


def test_find_tokenizer_uses_the_folders_own(made, tmp_path):
    from lwm.infer.load import find_tokenizer

    model = shutil.copytree(made["qwen"], tmp_path / "model")
    assert TextTokenizer(find_tokenizer(model, None)).eos_id == TextTokenizer(made["qwen"]).eos_id
    assert find_tokenizer(model, made["llama3"]) == made["llama3"]  # --tokenizer may be a folder
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or tokenizer.model in or next to"):
        find_tokenizer(tmp_path / "elsewhere" / "final.safetensors", None)


def test_needle_template_without_bos(made):
    from lwm.synth import needle_prompts as prompts

    tok = TextTokenizer(made["qwen"])
    before, _ = prompts.template(tok, "What is the number?")
    assert before == tok.encode(f"{SYSTEM} USER:")
    llama = TextTokenizer(made["llama3"])
    assert prompts.template(llama, "What is the number?")[0][0] == llama.bos_id


# --- chat forms -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_template_chat_form_is_apply_chat_template(made, kind):
    tok = TextTokenizer(made[kind])
    hf = AutoTokenizer.from_pretrained(made[kind])
    vocab = Vocab(tok.vocab_size)
    question = "What color is the square?"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chat_prompt(tok, vocab, question, style="template") == want
    codes = np.arange(2 * 256).reshape(2, 256) % 8192
    ids = chat_prompt(tok, vocab, question, codes, style="template")
    video = vocab.video_tokens(codes)[0].tolist()
    at = len(hf_ids(hf, hf.apply_chat_template(messages, tokenize=False).split(question)[0] + question))
    assert ids[at : at + len(video)] == video  # right after the question, inside the user turn
    assert ids[:at] + ids[at + len(video) :] == want


class _Codes:
    """A code store of one 2-frame video."""

    codes = np.arange(2 * 256).reshape(2, 256) % 8192

    def load(self, video_id, max_frames=None, fps=None):
        return self.codes


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_a_chat_example_is_the_template_conversation_with_loss_on_the_answer(made, kind):
    """fields "chat": the whole text-only example is transformers' apply_chat_template of the system, user and
    assistant turns; its prompt part is the prompt generation gives (chat_prompt, style "template"), and only
    the answer with the template's end of turn carries loss. With a video, the frames follow the question."""
    tok = TextTokenizer(made[kind])
    hf = AutoTokenizer.from_pretrained(made[kind])
    vocab = Vocab(tok.vocab_size)
    example = {"question": "What color is the square?", "answer": "Green.", "fields": "chat"}
    enc = encode_example(example, vocab, tok)
    turns = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": example["question"]},
        {"role": "assistant", "content": "Green."},
    ]
    assert enc.tokens.tolist() == hf.apply_chat_template(turns, tokenize=True, return_dict=False)
    prompt = chat_prompt(tok, vocab, example["question"], style="template")
    assert enc.tokens[: len(prompt)].tolist() == prompt and not enc.loss_mask[: len(prompt)].any()
    answer = enc.tokens[enc.loss_mask]
    assert enc.loss_mask[len(prompt) :].all() and tok.eos_id in answer.tolist()
    assert tok.decode(answer.tolist()).strip().startswith("Green.")

    with_video = encode_example({**example, "vision": "clip"}, vocab, tok, codes=_Codes())
    video_prompt = chat_prompt(tok, vocab, example["question"], _Codes.codes, style="template")
    assert with_video.tokens[: len(video_prompt)].tolist() == video_prompt
    assert with_video.tokens[len(video_prompt) :].tolist() == answer.tolist()
    assert with_video.vision_mask.sum() == 2 * 257 and not with_video.loss_mask[: len(video_prompt)].any()


def test_a_chat_example_needs_a_template_and_its_fields(made):
    from lwm.data.example import ExampleError

    spm_tok = TextTokenizer(made["sentencepiece"])
    with pytest.raises(ExampleError, match="has none"):
        encode_example({"question": "Q?", "answer": "A.", "fields": "chat"}, Vocab(spm_tok.vocab_size), spm_tok)
    tok = TextTokenizer(made["qwen"])
    with pytest.raises(ExampleError, match="needs a non-empty text field 'answer', got None"):
        encode_example({"question": "Q?", "fields": "chat"}, Vocab(tok.vocab_size), tok)


def test_template_style_needs_a_chat_template(made):
    tok = TextTokenizer(made["sentencepiece"])
    with pytest.raises(ValueError, match=f"text tokenizer {made['sentencepiece']} has no chat template"):
        chat_prompt(tok, Vocab(tok.vocab_size), "Why?", style="template")


def test_native_and_lwm_forms_leave_bos_out_for_qwen(made):
    tok = TextTokenizer(made["qwen"])
    vocab = Vocab(tok.vocab_size)
    for style in ("native", "lwm"):
        ids = chat_prompt(tok, vocab, "Why?", style=style)
        assert None not in ids and ids[: len(tok.encode(SYSTEM))] == tok.encode(SYSTEM)


# --- export in the base's own form ------------------------------------------------------------------------------


@pytest.mark.parametrize("with_vision", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_export_encodes_as_training_did(made, tmp_path, kind, with_vision):
    """The exported folder, read by AutoTokenizer, encodes every text of the corpus as the run's text
    tokenizer did: whitespace (leading, trailing, doubled, tabs, newlines), unicode and emoji. For the
    sentencepiece model with default normalization, the LlamaTokenizer conversion the export used before
    encoded 15 of the 22 CORPUS lines and 73 of these 219 texts otherwise."""
    text = TextTokenizer(made[kind])
    vocab = Vocab(text.vocab_size)
    write_tokenizer(made[kind], vocab.size if with_vision else text.vocab_size, tmp_path, "native")
    exported = AutoTokenizer.from_pretrained(tmp_path)
    corpus = export_corpus()
    differ = [t for t in corpus if hf_ids(exported, t) != text.encode(t)]
    assert not differ, f"{len(differ)} of {len(corpus)} texts encode otherwise, e.g. {differ[:3]}"
    assert len(exported) == (vocab.used_size if with_vision else text.vocab_size)
    again = TextTokenizer(tmp_path)  # the export read back by the seam (a sentencepiece run's by its own model)
    assert (again.kind, again.vocab_size, again.bos_id, again.eos_id, again.pad_id) == (
        text.kind,
        text.vocab_size,
        text.bos_id,
        text.eos_id,
        text.pad_id,
    )
    if text.bos_id is not None:  # the tokenizer's own BOS is written first, as the base's does
        assert exported("moves left").input_ids == [text.bos_id, *text.encode("moves left")]


@pytest.mark.parametrize("kind", KINDS)
def test_export_adds_vision_and_special_tokens_at_the_vocabularys_ids(made, tmp_path, kind):
    text = TextTokenizer(made[kind])
    vocab = Vocab(text.vocab_size)
    ids = write_tokenizer(made[kind], vocab.size, tmp_path / "native")
    assert ids == TokenIds(text.bos_id, text.eos_id, text.pad_id)
    exported = AutoTokenizer.from_pretrained(tmp_path / "native")
    names = ["<vision_0>", "<vision_8191>", "<eof>", "<eov>", "<vision>", "</vision>"]
    want = [vocab.vision_offset, vocab.vision_offset + 8191, vocab.eof, vocab.eov, vocab.vision_start, vocab.vision_end]
    assert exported.convert_tokens_to_ids(names) == want
    assert hf_ids(exported, "<vision><vision_7><eof></vision>") == [want[4], vocab.vision_offset + 7, want[2], want[5]]
    assert vision_text_size(tmp_path / "native") == text.vocab_size
    added = exported.added_tokens_decoder
    assert [added[i].special for i in want] == [False, False, True, True, True, True]  # codes: plain tokens
    write_tokenizer(made[kind], vocab.size, tmp_path / "lwm", "lwm")  # LWM writes <vision> and </vision> as text
    lwm = AutoTokenizer.from_pretrained(tmp_path / "lwm")
    assert len(lwm) == vocab.eov + 1 and lwm.convert_tokens_to_ids(["<eov>"]) == [vocab.eov]


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_export_keeps_the_chat_template(made, tmp_path, kind):
    write_tokenizer(made[kind], Vocab(TextTokenizer(made[kind]).vocab_size).size, tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == TextTokenizer(made[kind]).chat_template


def test_sentencepiece_export_renders_the_native_chat_form(made, tmp_path):
    text = TextTokenizer(made["sentencepiece"])
    vocab = Vocab(text.vocab_size)
    write_tokenizer(made["sentencepiece"], vocab.size, tmp_path)
    exported = AutoTokenizer.from_pretrained(tmp_path)
    for question in ("What color is the square?", "  Why,\tthen?  "):
        rendered = exported.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert rendered == chat_prompt(text, vocab, question, style="native")
        # the exported folder's own template, through the template style, is the same prompt
        assert chat_prompt(TextTokenizer(tmp_path / "tokenizer.json"), vocab, question, style="template") == rendered


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_to_hf_writes_the_tokenizers_ids_into_config_and_generation_config(made, tmp_path, kind):
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer

    text = TextTokenizer(made[kind])
    config = ModelConfig.from_preset("debug", vocab_size=Vocab(text.vocab_size).size, n_layers=1)
    to_hf(Transformer(config), tmp_path, tokenizer_model=made[kind])
    for name in ("config.json", "generation_config.json"):
        written = json.loads((tmp_path / name).read_text())
        got = [written.get("bos_token_id"), written.get("eos_token_id"), written.get("pad_token_id")]
        assert got == [text.bos_id, text.eos_id, text.pad_id], name


def test_export_command_takes_the_bases_folder(made, tmp_path, capsys):
    from dataclasses import asdict

    from lwm.disk.weights import save_weights
    from lwm.model import ModelConfig, Transformer
    from lwm.train.export import main

    stage = tmp_path / "a"
    (stage / "checkpoints").mkdir(parents=True)
    config = ModelConfig.from_preset("debug", vocab_size=Vocab(705).size, n_layers=1)
    (stage / "model_config.json").write_text(json.dumps(asdict(config)))
    save_weights(Transformer(config).state_dict(), stage / "final.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([str(stage), "--out", str(tmp_path / "x"), "--tokenizer", str(tmp_path / "empty")])
    assert exit_.value.code == 2 and "empty holds neither tokenizer.json" in capsys.readouterr().err
    assert main([str(stage), "--out", str(tmp_path / "hf"), "--tokenizer", str(made["llama3"])]) == 0
    exported = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert exported.chat_template == LLAMA3_TEMPLATE and len(exported) == Vocab(705).used_size
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 704


def test_generate_writes_the_template_form_when_the_bundle_asks(made):
    from types import SimpleNamespace

    from lwm.infer.cli import build_parser, prompt_ids
    from lwm.infer.load import Loaded

    tok = TextTokenizer(made["qwen"])
    loaded = Loaded(None, Vocab(tok.vocab_size), tok, prompt="template")
    args = build_parser().parse_args(["--model", "m", "--prompt", "Why?"])
    assert prompt_ids(args, loaded) == chat_prompt(tok, loaded.vocab, "Why?", style="template")
    assert prompt_ids(args, loaded)[:1] == tok.encode("<|im_start|>")
    raw = SimpleNamespace(**{**vars(args), "raw": True})
    assert prompt_ids(raw, loaded) == tok.encode("Why?")  # no BOS to write

"""Conversation records (LLaVA's form) and media columns -> training examples (lwm.data.conversation, lwm.data.form):
against the chat forms the project already trains and prompts with, and transformers' apply_chat_template."""

from __future__ import annotations

import numpy as np
import pytest
from hf_tokenizers import ROOT, llama3_folder, qwen_folder
from transformers import AutoTokenizer

from lwm.data import ExampleError, TextTokenizer, Vocab, encode_example
from lwm.data.chat import CHAT_SPEC, SYSTEM, chat_fields
from lwm.data.form import Form

SAMPLE_TOKENIZER = ROOT / "data" / "sample" / "tokenizer.model"


class _Codes:
    """A code store whose files are named by their paths: each path's codes are 2 frames of its own value."""

    def __init__(self, known=None):
        self.known = known

    def id_of(self, path: str) -> str:
        from lwm.data.code_cache import CodesError

        if self.known is not None and path not in self.known:
            raise CodesError(f"{path} has no codes in the store")
        return path

    def load(self, video_id, max_frames=None, fps=None):
        return np.full((2, 256), sum(map(ord, video_id)) % 8192)


def conversation(*turns, **media) -> dict:
    names = ("human", "gpt")
    return {**media, "conversations": [{"from": names[i % 2], "value": t} for i, t in enumerate(turns)]}


FORM = Form(conversation="conversations", media=("video", "image"), media_root="/data")


@pytest.fixture(scope="module")
def sp():
    tok = TextTokenizer(SAMPLE_TOKENIZER)
    return tok, Vocab(tok.vocab_size)


def test_one_turn_with_the_video_after_the_question_is_the_chat_example(sp):
    """The conversation form and the question-answer form the sample trains ("[user+vision+assistant],answer",
    the prompt lwm-generate gives) are one sequence: the same tokens, loss and vision positions."""
    tok, vocab = sp
    got = encode_example(
        conversation("What moves?\n<video>", "A red square.", video="a.mp4"), vocab, tok, _Codes(), FORM
    )
    fields = {**chat_fields("What moves?"), "vision": "/data/a.mp4", "answer": "A red square."}
    want = encode_example(fields, vocab, tok, _Codes(), CHAT_SPEC)
    for name in ("tokens", "loss_mask", "vision_mask"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_turns_roles_and_placeholders(sp):
    """Loss on every assistant turn and its EOS, nothing else; the media where the placeholders are (one newline
    after each taken with it), at the first user turn's start when there is none; an image a one-frame video as
    any media file; the source's own role names."""
    tok, vocab = sp
    record = conversation("<video>\nWhat moves?", "A red square.", "Which way?", "Left.", video="a.mp4")
    enc = encode_example(record, vocab, tok, _Codes(), FORM)
    assert tok.decode(enc.tokens[enc.loss_mask]) == "A red square. Left."
    assert (enc.tokens[enc.loss_mask] == tok.eos_id).sum() == 2 and enc.tokens[-1] == tok.eos_id
    assert (
        tok.decode(enc.tokens[~enc.loss_mask]) == f"{SYSTEM} USER: What moves? ASSISTANT: USER: Which way? ASSISTANT:"
    )
    assert enc.vision_mask.sum() == 2 * 257 and not enc.loss_mask[enc.vision_mask].any()
    first = np.flatnonzero(enc.vision_mask)[0]  # <vision> right after "... USER:"
    assert tok.decode(enc.tokens[:first]) == f"{SYSTEM} USER:"
    no_placeholder = conversation("What moves?", "A red square.", "Which way?", "Left.", video="a.mp4")
    np.testing.assert_array_equal(encode_example(no_placeholder, vocab, tok, _Codes(), FORM).tokens, enc.tokens)

    two = conversation("Compare <image> and <video>.", "Same.", image="b.png", video="a.mp4")
    both = encode_example(two, vocab, tok, _Codes(), FORM)
    codes = both.tokens[both.vision_mask].reshape(2, 2, 257)[:, 0, 0] - vocab.vision_offset
    want = [sum(map(ord, p)) % 8192 for p in ("/data/a.mp4", "/data/b.png")]  # column order: video, then image
    assert codes.tolist() == want

    roles = Form(conversation="turns", roles=(("USER", "user"), ("BOT", "assistant")))
    renamed = {"turns": [{"role": "USER", "content": "Hi?"}, {"role": "BOT", "content": "Hello."}]}
    assert (
        tok.decode(encode_example(renamed, vocab, tok, None, roles).tokens) == f"{SYSTEM} USER: Hi? ASSISTANT: Hello."
    )


def test_media_in_an_assistant_turn_is_generated(sp):
    """A placeholder in the assistant's turn: the media's codes carry loss (text-to-video, LWM's generation)."""
    tok, vocab = sp
    enc = encode_example(conversation("Draw a red square.", "<image>", image="sq.png"), vocab, tok, _Codes(), FORM)
    assert enc.loss_mask[enc.vision_mask].all() and enc.vision_mask.sum() == 2 * 257
    assert tok.decode(enc.tokens[~enc.loss_mask]) == f"{SYSTEM} USER: Draw a red square. ASSISTANT:"


@pytest.mark.parametrize(
    "record,message",
    [
        (conversation("Hi?"), "no assistant turn"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "has the role 'robot'"),
        (conversation("<video> and <video>?", "Yes.", video="a.mp4"), "2 <video>/<image> placeholder"),
        (conversation("<video>?", "Yes.", video="../../etc/passwd.mp4"), "leads out of the media root"),
        (conversation("<video>?", "Yes.", video="gone.mp4"), "has no codes in the store"),
        ({"conversations": "hello"}, "expected a list of turns"),
        (conversation("Hi?", "", video="a.mp4"), "has no text"),
    ],
)
def test_bad_conversations_say_why(sp, record, message):
    tok, vocab = sp
    with pytest.raises(ExampleError, match=message):
        encode_example(record, vocab, tok, _Codes(known={"/data/a.mp4"}), FORM)


def test_a_media_column_in_a_spec_is_the_files_codes(sp):
    """A caption table's media column: its path's codes, in place of the column in the spec, an image's as a
    video's; its text columns are text."""
    tok, vocab = sp
    form = Form(fields="[clip],caption", media=("clip",), media_root="/data")
    enc = encode_example({"clip": "x/a.mp4", "caption": "a red square"}, vocab, tok, _Codes(), form)
    want = encode_example(
        {"vision": "/data/x/a.mp4", "caption": "a red square"}, vocab, tok, _Codes(), "[vision],caption"
    )
    np.testing.assert_array_equal(enc.tokens, want.tokens)
    assert form.undeclared_media({"clip": "a.mp4", "path": "b/c.jpg", "caption": "a c.jpg"}) == ["path"]


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_a_template_conversation_is_apply_chat_template(tmp_path, kind):
    """With a Llama-3 or Qwen tokenizer (its chat template): a text-only multi-turn conversation is transformers'
    apply_chat_template of its turns after the default system turn, loss on exactly each assistant turn as the
    template writes it (content and end of turn); the video inside the user turn where its placeholder is."""
    folder = (llama3_folder if kind == "llama3" else qwen_folder)(tmp_path / kind)
    tok, hf = TextTokenizer(folder), AutoTokenizer.from_pretrained(folder)
    vocab = Vocab(tok.vocab_size)
    record = conversation("What moves?", "A red square.", "Which way?", "Left.")
    enc = encode_example(record, vocab, tok, None, FORM)
    messages = [{"role": "system", "content": SYSTEM}] + [
        {"role": ("user", "assistant")[i % 2], "content": t["value"]} for i, t in enumerate(record["conversations"])
    ]
    assert enc.tokens.tolist() == hf.apply_chat_template(messages, tokenize=True, return_dict=False)

    def ids(turns, prompt=False):
        return hf.apply_chat_template(turns, add_generation_prompt=prompt, tokenize=True, return_dict=False)

    done = 0
    for end in (3, 5):  # the text before each assistant turn carries no loss, the turn all of it
        prompt, turn = len(ids(messages[: end - 1], prompt=True)), len(ids(messages[:end]))
        assert not enc.loss_mask[done:prompt].any() and enc.loss_mask[prompt:turn].all(), end
        done = turn
    assert done == len(enc.tokens)
    video = encode_example(
        conversation("What <video> moves?", "A red square.", video="a.mp4"), vocab, tok, _Codes(), FORM
    )
    split = hf.apply_chat_template(messages[:3], tokenize=False).split("What ")[0] + "What "
    at = len(hf(split, add_special_tokens=False)["input_ids"])
    assert video.vision_mask[at + 1 : at + 1 + 2 * 257].all() and video.tokens[at] == vocab.vision_start


def test_a_sources_direction_trains_media_to_text_text_to_media_or_both(sp):
    """direction (LWM-Chat's): understanding is the spec as written (the caption carries loss), generation its
    groups reversed with the loss moved (the codes carry it: the "[caption],clip" example), both either one per
    example, by a seeded draw that gives an example the same one every time."""
    tok, vocab = sp
    record = {"clip": "a.mp4", "caption": "a red square"}

    def enc(direction, key="f:0", spec="[clip],caption"):
        form = Form(fields=spec, media=("clip",), media_root="/data", direction=direction)
        return encode_example(record, vocab, tok, _Codes(), form, key=key)

    understanding, generation = enc("understanding"), enc("generation")
    np.testing.assert_array_equal(understanding.tokens, enc(None).tokens)
    assert not understanding.loss_mask[understanding.vision_mask].any()
    want = enc(None, spec="[caption],clip")
    np.testing.assert_array_equal(generation.tokens, want.tokens)
    np.testing.assert_array_equal(generation.loss_mask, want.loss_mask)
    assert generation.loss_mask[generation.vision_mask].all()
    assert tok.decode(generation.tokens[~generation.loss_mask]) == "a red square"
    drawn = [enc("both", key=f"f:{i}").tokens.tolist() for i in range(40)]
    assert drawn == [enc("both", key=f"f:{i}").tokens.tolist() for i in range(40)]
    kinds = {tuple(d) for d in drawn}
    assert kinds == {tuple(understanding.tokens.tolist()), tuple(generation.tokens.tolist())}


def test_a_sources_columns_and_options_are_checked_before_any_work(tmp_path):
    """Refused when the config is built (train.py exits 2), naming the source: a column the table's header lacks
    (a media column, a field of its spec), roles without a conversation or mapping to no role, a direction that
    is not one or is given to a conversation."""
    from lwm.configs import from_dict
    from lwm.core.config import DataSpec

    table = tmp_path / "caps.csv"
    table.write_text("clip,caption\na.mp4,a cat\n")
    chats = tmp_path / "chat.json"
    chats.write_text("[]")
    bad = {
        "has no column 'video'": {"path": str(table), "media": ["video"], "fields": "[video],caption"},
        "has no column 'text'": {"path": str(table), "media": ["clip"], "fields": "[clip],text"},
        "roles name a conversation's roles": {"path": str(chats), "roles": {"human": "user"}},
        "roles map a conversation's role names": {"path": str(chats), "conversation": "c", "roles": {"a": "bot"}},
        "direction must be one of": {"path": str(table), "fields": "[clip],caption", "direction": "sideways"},
        "for a source of field specs": {"path": str(chats), "conversation": "c", "direction": "both"},
    }
    for message, source in bad.items():
        with pytest.raises(ValueError, match=f"data.sources.mine: .*{message}"):
            from_dict(DataSpec, {"sources": {"mine": source}}, "data")
    from_dict(DataSpec, {"sources": {"mine": {"path": str(table), "media": ["clip"], "fields": "[clip],caption"}}})


def test_a_text_column_of_media_paths_is_warned_about(tmp_path, sp, caplog):
    """A column the source does not name in its media whose values are media paths is read as text: said once,
    naming the source and the column."""
    from lwm.data import PackedStream, Source

    tok, vocab = sp
    src = tmp_path / "caps.jsonl"
    src.write_text("".join(f'{{"video": "clips/{i}.mp4", "caption": "a clip number {i}"}}\n' for i in range(8)))
    with caplog.at_level("WARNING"):
        PackedStream([Source(str(src), fields="caption")], vocab, tok, seq_len=16, batch_size=1)
    said = [r.getMessage() for r in caplog.records if "media file paths" in r.getMessage()]
    assert len(said) == 1 and str(src) in said[0] and "'video'" in said[0], said

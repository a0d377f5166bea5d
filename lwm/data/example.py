"""One example (a JSON object, LWM's format) -> tokens, loss mask, vision mask.

An example names its fields and a `fields` spec: groups separated by commas, fields inside a group
joined by `+`, a group in brackets carries no loss:

    {"vision": "clip_0003", "question": "What color is the square?", "answer": "Green.",
     "fields": "[vision+question],answer"}

A field whose name contains "vision" is a video: its value is the id of cached codes (or
{"id": ..., "max_frames": ..., "fps": ...}) and it expands to
<vision> f1 <eof> ... fT <eov> </vision>. `fields` may be a list; one entry is chosen per example
with a seeded choice (captions then train both video-to-text and text-to-video). The sequence
is BOS (no loss; none for a tokenizer without one, such as Qwen's), the groups in order, EOS (with loss).

The spec "chat" writes a question and answer in the text tokenizer's own chat template (a Llama-3 or Qwen
base's, lwm.data.chat.template_turns), the prompt lwm-generate and the evaluations give such a model:

    {"vision": "clip_0003", "question": "What color is the square?", "answer": "Green.", "fields": "chat"}

the system turn ("system" field, else lwm.data.chat.SYSTEM), the user's turn with the question and the
video right after it, the generation prompt (no loss), then the answer and the template's end of turn
(with loss). The template writes BOS and the end of turn itself; nothing is added.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np

from lwm.data.chat import SYSTEM, template_turns
from lwm.data.code_cache import CodesError, CodeStore
from lwm.data.conversation import BOS, EOS, MEDIA, ConversationError, conversation_pieces
from lwm.data.form import Form, MediaError
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab

CHAT = "chat"  # the spec that writes an example in the tokenizer's chat template


class ExampleError(ValueError):
    """An example that cannot be encoded; the message says what is wrong."""


@dataclass(frozen=True)
class Group:
    fields: tuple[str, ...]
    loss: bool


@dataclass
class Encoded:
    tokens: np.ndarray  # (L,) int64
    loss_mask: np.ndarray  # (L,) bool: predicting this token is trained
    vision_mask: np.ndarray  # (L,) bool: a vision code or the <eof>/<eov> closing a frame

    def __len__(self) -> int:
        return len(self.tokens)

    def slice(self, start: int, stop: int) -> "Encoded":
        return Encoded(self.tokens[start:stop], self.loss_mask[start:stop], self.vision_mask[start:stop])


def parse_fields(spec: str) -> list[Group]:
    groups = []
    for raw in spec.split(","):
        part = raw.strip()
        loss = not (part.startswith("[") and part.endswith("]"))
        inner = part if loss else part[1:-1]
        names = tuple(n.strip() for n in inner.split("+"))
        if not part or any(not n or "[" in n or "]" in n for n in names):
            raise ExampleError(f"malformed fields spec {spec!r} (group {raw!r})")
        groups.append(Group(names, loss))
    return groups


def reverse_spec(spec: str) -> str:
    """The other direction of a spec: its groups in reverse order, each with loss where it had none."""
    groups = parse_fields(spec)
    return ",".join("+".join(g.fields) if not g.loss else f"[{'+'.join(g.fields)}]" for g in reversed(groups))


def directed(spec: str, direction: str | None, key: str, seed: int) -> str:
    """The spec in a source's direction (lwm.data.form): as written, reversed, or either by a seeded draw."""
    if direction is None or direction == "understanding" or spec.strip() == CHAT:
        return spec
    if direction == "generation":
        return reverse_spec(spec)
    return choose_spec([spec, reverse_spec(spec)], f"{key}:direction", seed)


def choose_spec(spec, key: str, seed: int) -> str:
    """A list of specs: one, chosen by a seeded RNG keyed by the example (order-independent)."""
    if isinstance(spec, str):
        return spec
    if not isinstance(spec, (list, tuple)) or not spec or not all(isinstance(s, str) for s in spec):
        raise ExampleError(f"'fields' must be a string or a non-empty list of strings, got {spec!r}")
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return random.Random(digest).choice(list(spec))


def _video(value, codes: CodeStore | None, vocab: Vocab, max_frames, fps):
    if codes is None:
        raise ExampleError("the example has a vision field but no code store was given")
    if isinstance(value, dict):
        video_id = value.get("id")
        max_frames, fps = value.get("max_frames", max_frames), value.get("fps", fps)
    else:
        video_id = value
    if not isinstance(video_id, str) or not video_id:
        raise ExampleError(f"a vision field must be a video id or {{'id': ...}}, got {value!r}")
    try:
        frames = codes.load(video_id, max_frames=max_frames, fps=fps)
    except (FileNotFoundError, ValueError) as e:
        raise ExampleError(str(e)) from e
    try:
        return vocab.video_tokens(frames)
    except ValueError as e:  # codes out of the vocabulary's range
        raise ExampleError(f"cached codes {codes.path(video_id)}: {e}") from e


def _media(example: dict, form: Form, codes: CodeStore | None, vocab: Vocab, max_frames, fps) -> list:
    """(tokens, vision mask) of each media file the record's media columns name, in order."""
    out = []
    for column in form.media:
        if example.get(column) is not None:  # None: a record without this kind of media (an image on a video's)
            out += _media_column(example, column, form, codes, vocab, max_frames, fps)
    return out


def _media_column(
    example: dict, column: str, form: Form, codes: CodeStore | None, vocab: Vocab, max_frames, fps
) -> list:
    if codes is None:
        raise ExampleError(f"media column {column!r} needs a code store (data.codes)")
    try:
        ids = [codes.id_of(path) for path in form.media_paths(example, column)]
    except (MediaError, CodesError) as e:
        raise ExampleError(str(e)) from None
    return [_video(i, codes, vocab, max_frames, fps) for i in ids]


def encode_example(
    example: dict,
    vocab: Vocab,
    text_tokenizer: TextTokenizer,
    codes: CodeStore | None = None,
    default_fields: str | list | Form | None = None,
    max_frames: int | None = None,
    fps: float | None = None,
    seed: int = 0,
    key: str = "",
) -> Encoded:
    """Encode one example; raises ExampleError saying what is wrong. `key` identifies the example
    for the seeded choice among several specs (e.g. "file:line"). default_fields: the source's default spec,
    or its whole Form (lwm.data.form: media columns, a conversation)."""
    if not isinstance(example, dict):
        raise ExampleError(f"an example must be a JSON object, got {type(example).__name__}")
    form = Form.of(default_fields)
    if form.conversation is not None:
        return _conversation(example, form, vocab, text_tokenizer, codes, max_frames, fps)
    spec = example.get("fields", form.spec())
    if spec is None:
        raise ExampleError("the example has no 'fields' spec and the source gives no default")
    chosen = directed(choose_spec(spec, key, seed), form.direction, key, seed)
    if chosen.strip() == CHAT:
        return _template_chat(example, vocab, text_tokenizer, codes, max_frames, fps)
    groups = parse_fields(chosen)
    bos = np.array(text_tokenizer.with_bos([]), dtype=np.int64)
    ids, loss, vis = [bos], [np.zeros(len(bos), bool)], [np.zeros(len(bos), bool)]
    for group in groups:
        for name in group.fields:
            if name not in example:
                raise ExampleError(f"unknown field {name!r} in spec {spec!r}; the example has {sorted(example)}")
            value = example[name]
            if name in form.media:
                tokens, vmask = _join(_media_column(example, name, form, codes, vocab, max_frames, fps))
            elif "vision" in name:
                tokens, vmask = _video(value, codes, vocab, max_frames, fps)
            else:
                if not isinstance(value, str) or not value.strip():
                    raise ExampleError(f"field {name!r} is empty or not text: {value!r}")
                tokens = np.asarray(text_tokenizer.encode(value), dtype=np.int64)
                vmask = np.zeros(len(tokens), bool)
            ids.append(tokens)
            vis.append(vmask)
            loss.append(np.full(len(tokens), group.loss))
    ids.append(np.array([text_tokenizer.eos_id]))
    loss.append(np.ones(1, bool))
    vis.append(np.zeros(1, bool))
    return Encoded(np.concatenate(ids).astype(np.int64), np.concatenate(loss), np.concatenate(vis))


def _join(parts: list) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([t for t, _ in parts]), np.concatenate([m for _, m in parts])


def _conversation(example: dict, form: Form, vocab: Vocab, tokenizer: TextTokenizer, codes, max_frames, fps) -> Encoded:
    media = _media(example, form, codes, vocab, max_frames, fps) if form.media else []
    try:
        pieces = conversation_pieces(example, form, tokenizer, len(media))
    except ConversationError as e:
        raise ExampleError(str(e)) from None
    ids, loss, vis = [], [], []
    media = iter(media)
    for piece, weighted in pieces:
        if piece is MEDIA:
            tokens, vmask = next(media)
        elif piece is BOS:
            tokens = np.asarray(tokenizer.with_bos([]), np.int64)
            vmask = np.zeros(len(tokens), bool)
        elif piece is EOS:
            tokens, vmask = np.array([tokenizer.eos_id], np.int64), np.zeros(1, bool)
        else:
            tokens = np.asarray(tokenizer.encode(piece), np.int64)
            vmask = np.zeros(len(tokens), bool)
        ids.append(tokens)
        vis.append(vmask)
        loss.append(np.full(len(tokens), weighted))
    return Encoded(np.concatenate(ids).astype(np.int64), np.concatenate(loss), np.concatenate(vis))


def _template_chat(example: dict, vocab: Vocab, tokenizer: TextTokenizer, codes, max_frames, fps) -> Encoded:
    for name in ("question", "answer") + (("system",) if "system" in example else ()):
        if not isinstance(example.get(name), str) or not example[name].strip():
            raise ExampleError(f"the spec 'chat' needs a non-empty text field {name!r}, got {example.get(name)!r}")
    if tokenizer.chat_template is None:
        raise ExampleError(f"the spec 'chat' writes the tokenizer's chat template, and {tokenizer.path} has none")
    video = "vision" in example
    system = example.get("system", SYSTEM)
    try:
        before, after, reply = template_turns(tokenizer, example["question"], example["answer"], video, system)
    except ValueError as e:
        raise ExampleError(str(e)) from None
    parts = [(np.asarray(tokenizer.encode(before), np.int64), False)]
    vis = [np.zeros(len(parts[0][0]), bool)]
    if video:
        tokens, vmask = _video(example["vision"], codes, vocab, max_frames, fps)
        parts.append((tokens, False))
        vis.append(vmask)
    for text, loss in ((after, False), (reply, True)):
        ids = np.asarray(tokenizer.encode(text), np.int64)
        parts.append((ids, loss))
        vis.append(np.zeros(len(ids), bool))
    tokens = np.concatenate([ids for ids, _ in parts])
    loss = np.concatenate([np.full(len(ids), flag) for ids, flag in parts])
    return Encoded(tokens, loss, np.concatenate(vis))


class Encoder:
    """encode_example with a run's settings bound: what a source's index measures and a rank packs. It
    pickles as its settings (the tokenizer and code store are opened again), so index workers get one."""

    def __init__(
        self,
        vocab: Vocab,
        text_tokenizer: TextTokenizer,
        codes: CodeStore | None = None,
        max_frames: int | None = None,
        fps: float | None = None,
        seed: int = 0,
    ):
        self.vocab, self.text_tokenizer, self.codes = vocab, text_tokenizer, codes
        self.max_frames, self.fps, self.seed = max_frames, fps, seed

    def __call__(self, example, fields: str | list | Form | None, key: str) -> Encoded:
        return encode_example(
            example, self.vocab, self.text_tokenizer, self.codes, fields, self.max_frames, self.fps, self.seed, key
        )

    def __getstate__(self) -> dict:
        codes = None if self.codes is None else (str(self.codes.root), self.codes.n_codes)
        return {
            "vocab": self.vocab,
            "tokenizer": str(self.text_tokenizer.path),
            "codes": codes,
            "max_frames": self.max_frames,
            "fps": self.fps,
            "seed": self.seed,
        }

    def __setstate__(self, state: dict) -> None:
        codes = None if state["codes"] is None else CodeStore(*state["codes"])
        self.__init__(
            state["vocab"], TextTokenizer(state["tokenizer"]), codes, state["max_frames"], state["fps"], state["seed"]
        )

    def signature(self) -> dict:
        """What the encoded examples depend on besides the source: a change makes an index stale."""
        codes = None
        if self.codes is not None:  # the manifests, and tokens/ (a file written, replaced or removed in it)
            files = [*sorted(self.codes.root.glob("manifest*.jsonl")), self.codes.root / "tokens"]
            codes = [[f.name, f.stat().st_size if f.is_file() else 0, f.stat().st_mtime_ns] for f in files]
        return {
            "tokenizer_sha256": self.text_tokenizer.content_hash(),
            "vocab": [self.vocab.text_size, self.vocab.n_vision_codes, self.vocab.pad_multiple],
            "codes": codes,
            "max_frames": self.max_frames,
            "fps": self.fps,
            "seed": self.seed,
        }

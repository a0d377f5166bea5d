"""A conversation (LLaVA's, LLaVA-Video's, Video-ChatGPT's form) -> the pieces of one training example.

    {"video": "clips/a.mp4", "conversations": [
        {"from": "human", "value": "<video>\\nWhat moves?"}, {"from": "gpt", "value": "A red square."},
        {"from": "human", "value": "Which way?"}, {"from": "gpt", "value": "Left."}]}

Every turn is trained on (loss) when it is the assistant's, with what closes it (EOS, or the template's end of
turn); the rest is context. The k-th `<video>` or `<image>` placeholder (with one newline after it, as LLaVA
writes "<video>\\n") is where the k-th media file goes, in the order of the source's media columns; a record
with media and no placeholder has them at the start of its first user turn, as LLaVA reads such records. A
placeholder in an assistant turn is media the model is trained to generate (its codes carry loss).

Written in the text tokenizer's own chat template when it has one (a Llama-3 or Qwen base: lwm.data.chat's
"template" style), else in this project's form, the prompt lwm-generate gives ("native"):

    [BOS] "{system} USER: {user}" "ASSISTANT:" "{answer}" EOS "USER: {user}" "ASSISTANT:" "{answer}" EOS

with the system turn's text, else lwm.data.chat.SYSTEM. Pieces are encoded one by one, as an example's fields
are, so a one-turn conversation with its video after the question is the "[user+vision+assistant],answer"
example token for token.
"""

from __future__ import annotations

import re

from lwm.data.chat import SYSTEM, VIDEO_PLACEHOLDER, native_or_template
from lwm.data.form import Form
from lwm.data.text_tokenizer import TextTokenizer

PLACEHOLDER = re.compile(r"<(?:video|image)>\n?")
BOS, EOS = object(), object()  # the pieces that stand for the tokenizer's BOS (none for Qwen's) and EOS
MEDIA = object()  # the piece that stands for the next media file's tokens


class ConversationError(ValueError):
    """A record that is not a usable conversation; the message says why."""


def read_turns(record: dict, form: Form) -> list[tuple[str, str]]:
    """(role, text) of each turn, roles mapped to user / assistant / system by the source's roles."""
    turns = record.get(form.conversation)
    if not isinstance(turns, list) or not turns:
        raise ConversationError(f"conversation column {form.conversation!r} holds {turns!r}; expected a list of turns")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ConversationError(f"turn {i} is {turn!r}; expected an object with 'from' and 'value'")
        name, text = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
        role = form.role(name)
        if role is None:
            known = sorted(dict(form.roles))
            raise ConversationError(f"turn {i} has the role {name!r}; the source's roles are {known} (its 'roles')")
        if not isinstance(text, str) or not text.strip():
            raise ConversationError(f"turn {i} ({name}) has no text: {text!r}")
        if role == "system" and i > 0:
            raise ConversationError(f"turn {i} is a system turn; only the first turn may be")
        out.append((role, text))
    if not any(role == "assistant" for role, _ in out):
        raise ConversationError("the conversation has no assistant turn: nothing in it is trained")
    first = out[1][0] if out[0][0] == "system" and len(out) > 1 else out[0][0]
    if first != "user":
        raise ConversationError("the conversation starts with an assistant turn; expected a user turn first")
    return out


def place_media(turns: list[tuple[str, str]], n_media: int) -> list[tuple[str, str]]:
    """The turns with each placeholder made VIDEO_PLACEHOLDER, where the media files go in order."""
    found = sum(len(PLACEHOLDER.findall(text)) for _, text in turns)
    if found == 0 and n_media:  # LLaVA's records without a placeholder: the media open the first user turn
        i = next(i for i, (role, _) in enumerate(turns) if role == "user")
        turns = [*turns[:i], ("user", "<video>" * n_media + turns[i][1]), *turns[i + 1 :]]
    elif found != n_media:
        raise ConversationError(
            f"the conversation has {found} <video>/<image> placeholder(s) and the record {n_media} media file(s) "
            "in the source's media columns; each placeholder is where one goes"
        )
    return [(role, PLACEHOLDER.sub(VIDEO_PLACEHOLDER, text)) for role, text in turns]


def _split(text: str, loss: bool) -> list:
    """Text with placeholders -> [(piece, loss), MEDIA, ...]."""
    out = []
    for k, part in enumerate(text.split(VIDEO_PLACEHOLDER)):
        if k:
            out.append((MEDIA, loss))
        if part:
            out.append((part, loss))
    return out


def native_pieces(turns: list[tuple[str, str]]) -> list:
    system, rest = (turns[0][1], turns[1:]) if turns[0][0] == "system" else (SYSTEM, turns)
    pieces = [(BOS, False)]
    for k, (role, text) in enumerate(rest):
        if role == "user":
            pieces += _split(f"{system} USER: {text}" if k == 0 else f"USER: {text}", False)
        else:
            pieces += [("ASSISTANT:", False), *_split(text, True), (EOS, True)]
    # each piece encoded on its own, as a field: the spaces around a placeholder are the pieces' own
    return [
        (p.strip(), loss) if isinstance(p, str) else (p, loss)
        for p, loss in pieces
        if not isinstance(p, str) or p.strip()
    ]


def template_pieces(tokenizer: TextTokenizer, turns: list[tuple[str, str]]) -> list:
    messages = [{"role": role, "content": text} for role, text in turns]
    if messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": SYSTEM})
    whole = tokenizer.render_chat(messages, add_generation_prompt=False)
    cuts, at = [], 0  # (text, loss) spans of the rendered conversation
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.render_chat(messages[:i], add_generation_prompt=True)
        done = tokenizer.render_chat(messages[: i + 1], add_generation_prompt=False)
        if not (done.startswith(prompt) and whole.startswith(done) and len(prompt) >= at):
            raise ConversationError(
                f"the chat template of {tokenizer.path} rewrites earlier turns, so the assistant's turn {i} cannot "
                "be trained after the prompt a model is given"
            )
        cuts += [(whole[at : len(prompt)], False), (whole[len(prompt) : len(done)], True)]
        at = len(done)
    cuts.append((whole[at:], False))
    if whole.count(VIDEO_PLACEHOLDER) != sum(m["content"].count(VIDEO_PLACEHOLDER) for m in messages):
        raise ConversationError(f"the chat template of {tokenizer.path} does not write every turn's text once")
    return [piece for text, loss in cuts for piece in _split(text, loss)]


def conversation_pieces(record: dict, form: Form, tokenizer: TextTokenizer, n_media: int) -> list:
    """The example's pieces in order: (text, loss), (BOS or EOS, loss) or (MEDIA, loss) for the next media file.
    Raises ConversationError saying what is wrong."""
    turns = place_media(read_turns(record, form), n_media)
    if native_or_template(tokenizer) == "template":
        return template_pieces(tokenizer, turns)
    return native_pieces(turns)

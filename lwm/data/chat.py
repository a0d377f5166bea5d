"""LWM's chat form: the fields of a training example around a question, and the prompt built
from the same pieces for generation.

    [BOS] "You are a helpful assistant. USER: {question}" [<vision> frames </vision>] "ASSISTANT:"

The question comes before the video. Training examples use the same pieces (`chat_fields`) with
the spec "[user+vision+assistant],answer", so a prompt built here is exactly the prefix the model
was trained on.

LWM's released models (converted by lwm-convert-lwm, prompt style "lwm") were trained on LWM's own
form, which `chat_prompt(..., style="lwm")` writes token for token as LWM's vision_chat.py does:
one BOS, then each piece below encoded on its own by LWM's LLaMA tokenizer (sentencepiece, no BOS
or EOS of its own); <vision> and </vision> are text, and the frames' codes are vision ids.

    [BOS] "You are a helpful assistant. USER: {question}\n" "<vision>" frames "</vision>" " ASSISTANT:"

Without a video it is LWM's text chat form, [BOS] "You are a helpful assistant. USER: {question} ASSISTANT:".

Prompt style "template" writes the text tokenizer's own chat template (a Llama-3 or Qwen base's): a system
turn and a user turn with the question, then the template's generation prompt; the video's tokens go right
after the question, inside the user turn. A tokenizer without BOS (Qwen's) gets none in any style.
"""

from __future__ import annotations

import numpy as np

from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab

# this project's models; LWM's released ones (lwm-convert-lwm); the base tokenizer's own chat template
PROMPT_STYLES = ("native", "lwm", "template")
SYSTEM = "You are a helpful assistant."
CHAT_SPEC = "[user+vision+assistant],answer"
TEXT_CHAT_SPEC = "[user+assistant],answer"
# Where the video goes in the rendered template: a string no template writes and no question holds
VIDEO_PLACEHOLDER = "<lwm-video-placeholder>"


def native_or_template(tokenizer: TextTokenizer) -> str:
    """The prompt style of a model trained with this text tokenizer: a base's Hugging Face tokenizer with a
    chat template (Llama-3-Instruct's, Qwen's) writes its prompts in it ("template"); otherwise "native"."""
    return "template" if tokenizer.kind == "hf" and tokenizer.chat_template is not None else "native"


def chat_fields(question: str) -> dict[str, str]:
    """The text fields of a chat example around a question."""
    return {"user": f"{SYSTEM} USER: {question}", "assistant": "ASSISTANT:"}


def native_chat_template() -> str:
    """chat_fields' form as a Hugging Face chat template (Jinja), for a sentencepiece export: text-only turns
    render [BOS] "{system} USER: {question} ASSISTANT:", which a sentencepiece tokenizer encodes as
    chat_prompt(style="native") does (each field's pieces start at a word); an answer ends with EOS."""
    return (
        "{%- if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
        "{% set messages = messages[1:] %}{% else %}{% set system = '" + SYSTEM + "' %}{% endif %}"
        "{{- bos_token + system }}{%- for message in messages %}"
        "{%- if message['role'] == 'user' %}{{ ' USER: ' + message['content'] }}"
        "{%- elif message['role'] == 'assistant' %}{{ ' ASSISTANT: ' + message['content'] + eos_token }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ ' ASSISTANT:' }}{% endif %}"
    )


def template_turns(
    tokenizer: TextTokenizer, question: str, answer: str | None = None, video: bool = False, system: str = SYSTEM
) -> tuple[str, str, str]:
    """The tokenizer's chat template around a question, as text: (before, after, reply). The prompt is
    before + [the video] + after: a system turn, the user's turn with the question (the video right after
    it), the generation prompt. reply is the assistant's answer as the template closes its turn (its
    end-of-turn token included), "" without an answer."""
    content = question + (VIDEO_PLACEHOLDER if video else "")
    turns = [{"role": "system", "content": system}, {"role": "user", "content": content}]
    prompt = tokenizer.render_chat(turns)
    before, found, after = prompt.partition(VIDEO_PLACEHOLDER) if video else (prompt, True, "")
    if not found or VIDEO_PLACEHOLDER in after:
        raise ValueError(f"the chat template of {tokenizer.path} does not write the user's message exactly once")
    if answer is None:
        return before, after, ""
    whole = tokenizer.render_chat([*turns, {"role": "assistant", "content": answer}], add_generation_prompt=False)
    if not whole.startswith(prompt):
        raise ValueError(
            f"the chat template of {tokenizer.path} writes a conversation that does not start with its own prompt "
            "(it rewrites earlier turns), so an answer cannot be trained after the prompt a model is given"
        )
    return before, after, whole[len(prompt) :]


def template_chat_prompt(
    tokenizer: TextTokenizer, vocab: Vocab, question: str, codes: np.ndarray | None = None, system: str = SYSTEM
) -> list[int]:
    """The tokenizer's chat template rendered with a system turn and a user turn holding the question (and
    the video right after it), generation prompt added. The rendered text is encoded as
    apply_chat_template(tokenize=True) encodes it: the special tokens the template writes, none added."""
    before, after, _ = template_turns(tokenizer, question, video=codes is not None, system=system)
    if codes is None:
        return tokenizer.encode(before)
    return tokenizer.encode(before) + vocab.video_tokens(codes)[0].tolist() + tokenizer.encode(after)


def _lwm_chat_prompt(tokenizer: TextTokenizer, vocab: Vocab, question: str, codes: np.ndarray | None) -> list[int]:
    if codes is None:
        return tokenizer.with_bos(tokenizer.encode(f"{SYSTEM} USER: {question} ASSISTANT:"))
    markers = (tokenizer.encode("<vision>"), tokenizer.encode("</vision>"))
    video = vocab.video_tokens(codes, markers)[0].tolist()
    return tokenizer.with_bos(
        [*tokenizer.encode(f"{SYSTEM} USER: {question}\n"), *video, *tokenizer.encode(" ASSISTANT:")]
    )


def chat_prompt(
    tokenizer: TextTokenizer, vocab: Vocab, question: str, codes: np.ndarray | None = None, style: str = "native"
) -> list[int]:
    """Token ids of a chat prompt; codes (T, 256) of the video's frames, or None for text only.
    style: "native" (this project's models), "lwm" (LWM's released models) or "template" (the tokenizer's
    own chat template); see above."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"the question must be non-empty text, got {question!r}")
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    if style == "lwm":
        return _lwm_chat_prompt(tokenizer, vocab, question, codes)
    if style == "template":
        return template_chat_prompt(tokenizer, vocab, question, codes)
    fields = chat_fields(question)
    ids = tokenizer.with_bos(tokenizer.encode(fields["user"]))
    if codes is not None:
        ids += vocab.video_tokens(codes)[0].tolist()
    return ids + tokenizer.encode(fields["assistant"])

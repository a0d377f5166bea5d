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
"""

from __future__ import annotations

import numpy as np

from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab

PROMPT_STYLES = ("native", "lwm")  # this project's models; LWM's released ones (lwm-convert-lwm)
SYSTEM = "You are a helpful assistant."
CHAT_SPEC = "[user+vision+assistant],answer"
TEXT_CHAT_SPEC = "[user+assistant],answer"


def chat_fields(question: str) -> dict[str, str]:
    """The text fields of a chat example around a question."""
    return {"user": f"{SYSTEM} USER: {question}", "assistant": "ASSISTANT:"}


def _lwm_chat_prompt(tokenizer: TextTokenizer, vocab: Vocab, question: str, codes: np.ndarray | None) -> list[int]:
    if codes is None:
        return [tokenizer.bos_id, *tokenizer.encode(f"{SYSTEM} USER: {question} ASSISTANT:")]
    markers = (tokenizer.encode("<vision>"), tokenizer.encode("</vision>"))
    video = vocab.video_tokens(codes, markers)[0].tolist()
    return [
        tokenizer.bos_id,
        *tokenizer.encode(f"{SYSTEM} USER: {question}\n"),
        *video,
        *tokenizer.encode(" ASSISTANT:"),
    ]


def chat_prompt(
    tokenizer: TextTokenizer, vocab: Vocab, question: str, codes: np.ndarray | None = None, style: str = "native"
) -> list[int]:
    """Token ids of a chat prompt; codes (T, 256) of the video's frames, or None for text only.
    style: "native" (this project's models) or "lwm" (LWM's released models, see above)."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"the question must be non-empty text, got {question!r}")
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    if style == "lwm":
        return _lwm_chat_prompt(tokenizer, vocab, question, codes)
    fields = chat_fields(question)
    ids = [tokenizer.bos_id, *tokenizer.encode(fields["user"])]
    if codes is not None:
        ids += vocab.video_tokens(codes)[0].tolist()
    return ids + tokenizer.encode(fields["assistant"])

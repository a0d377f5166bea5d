"""Multiple choice as text in evaluation: how an answer is normalized for exact match, and how the
letter is read back from generated text. How a question with its options is written is
lwm.data.choices' (the training form the synthetic data writes too)."""

from __future__ import annotations

import re
import unicodedata

from lwm.data.choices import LETTER_INSTRUCTION, LETTERS, letter_question, option_text

__all__ = [
    "LETTERS",
    "LETTER_INSTRUCTION",
    "bare_question",
    "first_letter",
    "letter_question",
    "light",
    "normalize",
    "option_text",
]


def normalize(text: str) -> str:
    """Lowercase, punctuation to spaces, articles (a, an, the) dropped, whitespace collapsed."""
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in str(text).lower())
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def light(text: str) -> str:
    """Case, runs of whitespace and trailing punctuation ignored, articles kept: two options are the same
    option when these agree ("Red" and "red."), and differ when only an article does ("a dog", "the dog")."""
    return " ".join(str(text).casefold().split()).rstrip(".!?;:, ")


def bare_question(question: str, options: list[str]) -> str:
    """The question without its listed options and the instruction, where it is written in the letter
    form already (as in the sample data's multiple-choice rows); otherwise as given."""
    full, bare = " ".join(question.split()), " ".join(letter_question("", options).split())
    if full.lower().endswith(bare.lower()) and len(full) > len(bare):
        return full[: -len(bare)].strip()
    return question


def first_letter(text: str, n_options: int) -> int | None:
    """Index of the first standalone option letter (A .. the n-th) in generated text, or None."""
    m = re.search(rf"\b([A-{LETTERS[n_options - 1]}])\b", text)
    return None if m is None else LETTERS.index(m.group(1))

"""Multiple choice as the model reads it, in training data and in evaluation: the option letters and
how a question with its options is written ("What color? A. Red. B. Cyan. Answer with the letter.").
The synthetic data (lwm.synth) writes its questions with it and long-video QA (lwm.eval.video_qa)
asks them with it, so the two forms cannot drift apart."""

from __future__ import annotations

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LETTER_INSTRUCTION = "Answer with the letter."


def option_text(text: str) -> str:
    """An option as an answer is written in training: stripped, ending with a full stop."""
    text = text.strip()
    return text if text[-1:] in (".", "?", "!") else text + "."


def lettered(options: list[str]) -> list[str]:
    """['A. Red.', 'B. Cyan.', ...]: each option after its letter."""
    if len(options) > len(LETTERS):
        raise ValueError(f"{len(options)} options: at most {len(LETTERS)} have letters")
    return [f"{LETTERS[i]}. {option_text(o)}" for i, o in enumerate(options)]


def letter_question(question: str, options: list[str]) -> str:
    """'What color? A. Red. B. Cyan. Answer with the letter.' (the training form of multiple choice)."""
    return f"{question.strip()} {' '.join(lettered(options))} {LETTER_INSTRUCTION}"

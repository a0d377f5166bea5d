"""Each benchmark's own rules for the letter method: its prompt text, how it reads the letter back from
the model's output, what an output with no letter counts as, how the overall number is made, and the
breakdowns it reports. Written from the benchmarks' published prompts and scoring rules.

  videomme  The prompt of Video-MME's README:
                [This video's subtitles are listed below:\\n{subtitles}\\n]Select the best answer to the
                following multiple-choice question based on the video. Respond with only the letter
                (A, B, C, or D) of the correct option.\\n{question}\\n{A. ...}\\n...\\nThe best answer is:
            (with --subtitles, the subtitle lines at the sampled frames' times; "No subtitles available"
            for a video without a subtitle file, as lmms-eval writes). Reading the letter: Video-MME's
            scorer's rule: strip, delete its list of answer phrases, the first capital A-D that remains.
            That list, as published, runs two pairs of phrases together ("The best option isThe correct
            option is", "Best answer:Best option:"), so "Best answer: C" reads as B; followed as published,
            so that the numbers here are the scorer's. No letter: the question is not counted (the
            scorer's "answered"). Overall: correct / answered, by duration, domain, sub_category, task_type.
  longvideobench  LongVideoBench's loader: "Question: {question}\\nA. ...\\n...\\nAnswer with the
            option's letter from the given choices directly." With --subtitles, the subtitles
            interleaved with the frames as its loader does (a line goes after the frames up to its
            middle time, and only when a sampled frame falls within it, widened to 1 s). Reading: the
            answer phrases deleted, the first capital A-E; no letter: a random option, as its authors
            do (here seeded by the question's id, so a run repeats). Overall: accuracy over all
            questions, by duration_group and question_category.
  mlvu      MLVU's multiple-choice evaluation: "Carefully watch this video and pay attention to every
            detail. Based on your observations, select the best option that accurately addresses the
            question.\\nQuestion: {question}\\nOptions:\\n(A) ...\\n...\\nOnly give the best option.",
            the answer begun with "Best option:(". Reading: the output up to its first ")" must be the
            letter; anything else is wrong. Overall: M-Avg, the mean of the tasks' accuracies.
  (plain)   this project's form: "{question} A. ... B. ... Answer with the letter."; the first standalone
            option letter; none: wrong; accuracy over all questions.

The prompt's text is the user's turn of the model's chat form (lwm.data.chat), before the video as LWM
asks its questions; the interleaved subtitles go between the frames."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from lwm.eval.video_qa.items import Item
from lwm.eval.video_qa.text import LETTERS, first_letter, letter_question

VIDEOMME_INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter (A, B, C, or D) of the correct option."
)
VIDEOMME_SUBTITLES = "This video's subtitles are listed below:"
VIDEOMME_NO_SUBTITLES = "No subtitles available"
VIDEOMME_POST = "The best answer is:"
# Video-MME's list of answer phrases, as its scorer has it (two entries are pairs run together).
VIDEOMME_PHRASES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)
LVB_POST = "Answer with the option's letter from the given choices directly."
LVB_PHRASES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)
MLVU_SYSTEM = (
    "Carefully watch this video and pay attention to every detail. Based on your observations, "
    "select the best option that accurately addresses the question."
)
MLVU_POST = "Only give the best option."
MLVU_ANSWER_START = "Best option:("


@dataclass(frozen=True)
class Pick:
    """What the rule read from an output: the letter it found (None: none), the option it scores (the
    found one, a random one, or None: not counted), and whether it is counted at all."""

    found: int | None
    scored: int | None
    counted: bool


class Rules:
    """The plain form's rules; a benchmark overrides what differs."""

    name = "plain"
    title = "Video QA"
    breakdowns: tuple[str, ...] = ()
    unparsed = "wrong"  # "wrong", "skip" (not counted) or "random"
    overall = "micro"  # "micro" (over questions) or "task_mean" (over the `task` breakdown)
    answer_start = ""  # text that begins the model's answer (after the chat form's ASSISTANT:)
    subtitles = None  # "prefix" or "interleave"

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        return letter_question(item.question, item.options)

    def find(self, text: str, n: int) -> int | None:
        return first_letter(text, n)

    def pick(self, item: Item, text: str) -> Pick:
        n = len(item.options)
        found = self.find(text, n)
        if found is not None:
            return Pick(found, found, True)
        if self.unparsed == "skip":
            return Pick(None, None, False)
        if self.unparsed == "random":
            return Pick(None, random.Random(f"{self.name}:{item.id}").randrange(n), True)
        return Pick(None, None, True)


def _first_capital(text: str, phrases, letters: str) -> str | None:
    s = text.strip()
    for phrase in phrases:
        s = s.replace(phrase, "")
    m = re.search(f"[{letters}]", s)
    return None if m is None else m.group(0)


class VideoMME(Rules):
    name, title = "videomme", "Video-MME"
    breakdowns = ("duration", "domain", "sub_category", "task_type")
    unparsed = "skip"
    subtitles = "prefix"

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        raw = item.meta.get("options") or []
        listed = [str(o).strip() for o in raw] if len(raw) == len(item.options) else []
        if [o for o in listed] != [f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)]:
            listed = [f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)]
        body = "\n".join([VIDEOMME_INSTRUCTION, item.question, *listed, VIDEOMME_POST])
        if subtitles is None:
            return body
        return f"{VIDEOMME_SUBTITLES}\n{subtitles or VIDEOMME_NO_SUBTITLES}\n{body}"

    def find(self, text: str, n: int) -> int | None:
        letter = _first_capital(text, VIDEOMME_PHRASES, "ABCD")
        return None if letter is None else LETTERS.index(letter)  # a letter past the options scores wrong


class LongVideoBench(Rules):
    name, title = "longvideobench", "LongVideoBench"
    breakdowns = ("duration_group", "question_category")
    unparsed = "random"
    subtitles = "interleave"

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        listed = [f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)]
        return "\n".join([f"Question: {item.question}", *listed, LVB_POST])

    def find(self, text: str, n: int) -> int | None:
        letter = _first_capital(text, LVB_PHRASES, "ABCDE")
        return None if letter is None else LETTERS.index(letter)


class MLVU(Rules):
    name, title = "mlvu", "MLVU"
    breakdowns = ("task",)
    overall = "task_mean"
    answer_start = MLVU_ANSWER_START

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        listed = [f"({LETTERS[i]}) {o}" for i, o in enumerate(item.options)]
        return "\n".join([MLVU_SYSTEM, f"Question: {item.question}", "Options:", *listed, MLVU_POST])

    def find(self, text: str, n: int) -> int | None:
        s = text.strip()
        s = s[: s.index(")")] if ")" in s else s
        return LETTERS.index(s) if len(s) == 1 and s in LETTERS[:n] else None


RULES: dict[str | None, Rules] = {
    None: Rules(),
    "videomme": VideoMME(),
    "longvideobench": LongVideoBench(),
    "mlvu": MLVU(),
}


def rules_for(item: Item) -> Rules:
    return RULES[item.benchmark]

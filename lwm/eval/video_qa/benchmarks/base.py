"""What a benchmark is to video QA: a Benchmark (how its files are recognised and read, its rules, its
subtitles, its own results file), and the Rules of the letter method that each benchmark's module
fills in (its prompt, how it reads the letter back, what an output with no letter counts as, how its
overall number is made, the breakdowns it reports). The registry is lwm.eval.video_qa.benchmarks."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from lwm.eval.video_qa.items import Item


@dataclass(frozen=True)
class Pick:
    """What the rule read from an output: the letter it found (None: none), the option it scores (the
    found one, a random one, or None: not counted), and whether it is counted at all."""

    found: int | None
    scored: int | None
    counted: bool


class Rules:
    """The letter method as a benchmark asks and scores it; its module overrides prompt and find."""

    name: str
    title: str
    breakdowns: tuple[str, ...] = ()
    unparsed = "wrong"  # "wrong", "skip" (not counted) or "random"
    unparsed_text = "an output with no letter is wrong"  # the rule in words, for its table
    overall = "micro"  # "micro" (over questions) or "task_mean" (over the `task` breakdown)
    answer_start = ""  # text that begins the model's answer (after the chat form's ASSISTANT:)

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        """The user's turn: the question with its options (and subtitles given as text before it)."""
        raise NotImplementedError

    def find(self, text: str, n: int) -> int | None:
        """The option letter read from the model's output -> its index, or None for none."""
        raise NotImplementedError

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


def first_capital(text: str, phrases, letters: str) -> str | None:
    """The first of `letters` in the stripped text once each answer phrase is deleted, or None."""
    s = text.strip()
    for phrase in phrases:
        s = s.replace(phrase, "")
    m = re.search(f"[{letters}]", s)
    return None if m is None else m.group(0)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark (or the plain form) as video QA reads, asks and scores it."""

    name: str | None  # the items' and records' `benchmark`; None for the plain form
    files: str  # its files as released, for the error that lists the formats known
    recognise: Callable[[dict], bool]  # whether a JSON object (a row, a line; a parquet's columns) is its entry
    items: Callable[..., list[Item]]  # (obj, item_id, source file, video_dir, subtitle_dir) -> its Items
    rules: Rules
    parquet: bool = True  # whether its files may be parquet
    skip: Callable[[dict], str | None] | None = None  # why an entry is not evaluated here, or None
    subtitles: Callable[..., dict] | None = None  # (item, frame times, info) -> {"prefix": text} or {"between": [...]}
    results_file: str | None = None  # its own results file, written when `results(records)` has any
    results: Callable[[list[dict]], list] | None = None

"""LWM's needle, its haystack and the prompt that holds them: what lwm.eval.needle asks and what
lwm.synth.make_retrieval trains on (here, so that the evaluation depends on the data, not back).

Length: a context length is the length of the whole prompt in the model's own tokens, template and
question included, and it is exact. The prompt is put together from token ids: the template's
pieces, the haystack's ids from a sentence start, the needles' ids spliced in at sentence breaks, the
question's ids; the haystack part is cut to whatever is left. Every seam lies before a word that
starts with a space, and a sentencepiece model that splits at whitespace (LLaMA's, the bundled one)
tokenizes each word on its own, so these ids are exactly chat_prompt(decoded user text); the tests
check this. (With a tokenizer that merges across spaces the text reading of the prompt could differ
from its ids by a few tokens at the seams; the ids the model gets still have the requested length.)
"""

from __future__ import annotations

import contextlib
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from lwm.data.chat import chat_fields
from lwm.io import JsonlError, records
from lwm.paths import SAMPLE

DEFAULT_HAYSTACK = SAMPLE / "text.jsonl"


def haystack_path(path: str | Path | None = None) -> Path:
    """The haystack to read: `path`, or (None or the default) the sample's text, made first on a clean clone,
    where the sample is not committed (its progress on stderr: stdout may be a command's result)."""
    path = DEFAULT_HAYSTACK if path is None else Path(path)
    if path == DEFAULT_HAYSTACK and not path.exists():
        from lwm.synth.make_sample import ensure_sample  # its video and tokenizer libraries only when needed

        with contextlib.redirect_stdout(sys.stderr):
            ensure_sample()
    return path


NEEDLE = "The special magic {city} number is: {number}."
QUESTION = "What is the special magic {city} number?"
QUESTION_MANY = "What are the special magic numbers for {cities}?"
INSTRUCTION = (
    "Don't give information outside the document or repeat your findings. Keep your response short and direct."
)
CITIES = (
    "Chicago",
    "Yangon",
    "Antananarivo",
    "Colombo",
    "Almaty",
    "Sydney",
    "Mexico City",
    "Seattle",
    "Lagos",
    "Amsterdam",
    "Belgrade",
    "Cairo",
    "Baghdad",
    "Damascus",
    "Kigali",
    "Dakar",
    "Sofia",
    "Victoria",
    "Tashkent",
    "Mumbai",
    "Barcelona",
    "Kabul",
    "Kathmandu",
    "Jakarta",
    "Helsinki",
    "Lisbon",
    "Montreal",
    "Nairobi",
    "Oslo",
    "Panama City",
    "Quito",
    "Reykjavik",
    "Santiago",
    "Tbilisi",
    "Ulaanbaatar",
    "Vienna",
    "Warsaw",
    "Zagreb",
    "Bangkok",
    "Dublin",
    "Havana",
    "Istanbul",
    "Kyoto",
    "Lima",
    "Manila",
    "Prague",
    "Riga",
    "Tunis",
    "Accra",
    "Bogota",
    "Caracas",
    "Dhaka",
    "Edinburgh",
    "Florence",
    "Geneva",
    "Hanoi",
)
SENTENCE_END = (".", "!", "?")
CLOSERS = "\"')]\u201d\u2019"


# ---------------------------------------------------------------------------------------------------
# The haystack: token ids of real text, with the places a sentence (hence a needle) may start.


def read_documents(path) -> Iterator[str]:
    """The texts of a JSON-lines file (one {"text": ...} per line), or a plain text file as one document."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"haystack {path} does not exist")
    if path.suffix in (".jsonl", ".json"):
        try:
            for n, row in records(path):
                if not isinstance(row, dict) or "text" not in row:
                    got = f"keys {sorted(row)}" if isinstance(row, dict) else type(row).__name__
                    raise ValueError(
                        f'haystack {path} line {n}: expected a JSON object with a "text" field (got {got})'
                    )
                if not isinstance(row["text"], str):
                    raise ValueError(
                        f'haystack {path} line {n}: "text" must be a string, got {type(row["text"]).__name__}'
                    )
                yield row["text"]
        except JsonlError as e:
            raise ValueError(
                f'haystack {path} line {e.line}: expected a JSON object with a "text" field ({e.reason})'
            ) from None
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


class Haystack:
    """At least `min_tokens` ids of the documents (each encoded on its own, then concatenated,
    repeated while too short), with which positions start a word and which start a sentence."""

    def __init__(self, tokenizer, documents: Callable[[], Iterable[str]], min_tokens: int, name: str = "<documents>"):
        self.name = name
        word, end = piece_classes(tokenizer)
        chunks, total = [], 0
        while total < min_tokens:
            before = total
            for doc in documents():
                doc = doc.strip()
                if doc:
                    ids = tokenizer.encode(doc)
                    chunks.append(np.asarray(ids, dtype=np.int64))
                    total += len(ids)
                    if total >= min_tokens:
                        break
            if total == before:
                raise ValueError(f"haystack {name} has no text")
        self.ids = np.concatenate(chunks)
        self.word_start = word[self.ids]
        self.sentence_start = np.flatnonzero(self.word_start[1:] & end[self.ids[:-1]]) + 1
        if self.word_start[0]:
            self.sentence_start = np.concatenate([[0], self.sentence_start])
        if len(self.sentence_start) == 0:
            raise ValueError(f"haystack {name} has no sentence breaks ('.', '!' or '?' followed by a space)")

    @classmethod
    def from_file(cls, tokenizer, path, min_tokens: int) -> "Haystack":
        path = Path(path)
        next(read_documents(path), None)  # a missing or malformed file fails here, naming the file
        return cls(tokenizer, lambda: read_documents(path), min_tokens, name=str(path))

    def __len__(self) -> int:
        return len(self.ids)

    def window(self, n: int, after: int = 0) -> int:
        """The start of n haystack tokens that begin a sentence and end before a word start (so the
        question after them starts a new word); the first sentence start from `after` on that
        allows it (from the beginning when none does)."""
        if n > len(self.ids) - 1:
            raise ValueError(f"haystack {self.name} has {len(self.ids)} tokens, {n + 1} needed")
        starts = self.sentence_start[self.sentence_start + n < len(self.ids)]
        if (starts >= after).any():
            starts = starts[starts >= after]
        if len(starts) == 0:
            return 0
        ok = starts[self.word_start[starts + n]]
        return int(ok[0] if len(ok) else starts[0])

    def breaks(self, start: int, n: int) -> np.ndarray:
        """Offsets (from `start`) in [0, n] where a needle may go: the window's start, its sentence
        starts, and its end."""
        inner = self.sentence_start[(self.sentence_start > start) & (self.sentence_start < start + n)] - start
        return np.concatenate([[0], inner, [n]])


def piece_classes(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Per text id: does its piece start a word (" ..."), does it end a sentence ("." "!" "?")."""
    pieces = tokenizer.pieces()
    word = np.array([p.startswith(" ") for p in pieces], dtype=bool)
    end = np.array([p.rstrip(CLOSERS).endswith(SENTENCE_END) and not p.startswith("<") for p in pieces], dtype=bool)
    return word, end


# ---------------------------------------------------------------------------------------------------
# One trial's prompt.


@dataclass
class Needle:
    city: str
    number: int
    depth: float  # requested, percent of the haystack part
    asked: bool = True
    offset: int = 0  # haystack tokens before it
    position: int = 0  # index of its first token in the prompt
    placed_depth: float = 0.0  # 100 * offset / haystack tokens in the prompt
    found: bool | None = None

    @property
    def text(self) -> str:
        return NEEDLE.format(city=self.city, number=self.number)

    def record(self) -> dict:
        """As a trial's record lists it."""
        return {
            "city": self.city,
            "number": self.number,
            "depth": round(self.depth, 3),
            "asked": self.asked,
            "placed_depth": round(self.placed_depth, 3),
            "position": self.position,
            "found": self.found,
        }


def needle_depths(depth: float, n: int) -> list[float]:
    """The first needle at `depth`, the others spread evenly over the rest of the context."""
    return [depth + k * (100 - depth) / n for k in range(n)]


def number_range(digits: int) -> range:
    """The needles' numbers: `digits` digits, no leading zero (one digit: 0-9)."""
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    return range(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def make_needles(rng: random.Random, depth: float, n: int, ask: int, digits: int = 7) -> list[Needle]:
    cities = rng.sample(CITIES, n)
    numbers = rng.sample(number_range(digits), n)
    asked = set(rng.sample(range(n), ask))
    return [
        Needle(c, x, d, asked=k in asked) for k, (c, x, d) in enumerate(zip(cities, numbers, needle_depths(depth, n)))
    ]


def question_for(needles: Sequence[Needle], order: Sequence[int] | None = None) -> str:
    asked = [needles[k] for k in (order if order is not None else range(len(needles))) if needles[k].asked]
    if len(asked) == 1:
        return QUESTION.format(city=asked[0].city)
    names = [n.city for n in asked]
    return QUESTION_MANY.format(cities=", ".join(names[:-1]) + " and " + names[-1])


def template(tokenizer, question: str, instruction: str = INSTRUCTION) -> tuple[list[int], list[int]]:
    """The prompt's ids before and after the context: [BOS] "{system} USER:" | context |
    "{question} {instruction}" "ASSISTANT:" (chat_prompt's fields with the context first in the user
    turn). An empty instruction leaves it out (a training curriculum's first step)."""

    marker = "\x00"
    fields = chat_fields(marker)
    user = fields["user"]
    if not user.endswith(marker):
        raise RuntimeError(f"the chat template changed: the question is no longer last in {user!r}")
    head = user[: -len(marker)].rstrip(" ")  # "You are a helpful assistant. USER:"
    before = tokenizer.with_bos(tokenizer.encode(head))
    user_end = f"{question} {instruction}" if instruction else question
    after = tokenizer.encode(user_end) + tokenizer.encode(fields["assistant"])
    return before, after


@dataclass
class Prompt:
    ids: list[int]
    needles: list[Needle]
    question: str
    context: slice  # where the context (haystack + needles) lies in ids

    def user_text(self, tokenizer) -> str:
        """The user turn's question field as text: context, question and instruction."""
        after = tokenizer.encode(f"{self.question} {INSTRUCTION}")
        return tokenizer.decode(self.ids[self.context.start : self.context.stop + len(after)])


def build_prompt(
    tokenizer,
    haystack: Haystack,
    length: int,
    needles: list[Needle],
    question: str,
    text_from: int = 0,
    instruction: str = INSTRUCTION,
) -> Prompt:
    """A prompt of exactly `length` ids with the needles at their depths (moved back to sentence
    breaks; 0% is the start of the context, 100% its end). The haystack text is the first window
    from token `text_from` on (training data varies it; the evaluation always starts at 0)."""
    before, after = template(tokenizer, question, instruction)
    needle_ids = [tokenizer.encode(n.text) for n in needles]
    fixed = len(before) + len(after) + sum(map(len, needle_ids))
    n = length - fixed
    if n < 0:
        raise ValueError(
            f"length {length} is shorter than the prompt without any haystack ({fixed} tokens: "
            f"template, {len(needles)} needle(s) and the question)"
        )
    start = haystack.window(n, text_from)
    breaks = haystack.breaks(start, n)
    hay = haystack.ids[start : start + n].tolist()
    offsets = []
    for needle in needles:
        point = n if needle.depth >= 100 else int(n * needle.depth / 100)
        offsets.append(int(breaks[np.searchsorted(breaks, point, side="right") - 1]))
    ids, pos = list(before), 0
    for needle, nid, off in zip(needles, needle_ids, offsets):  # depths rise with k, so offsets do too
        ids += hay[pos:off]
        pos = off
        needle.offset, needle.position = off, len(ids)
        needle.placed_depth = 100.0 * off / n if n else 0.0
        ids += nid
    ids += hay[pos:]
    context = slice(len(before), len(ids))
    ids += after
    assert len(ids) == length, (len(ids), length)
    return Prompt(ids, needles, question, context)


def min_length(tokenizer, needles: int = 1, ask: int | None = None) -> int:
    """The shortest prompt any trial can need with no haystack at all: the template, the longest
    needles and a question naming the longest cities (+2 for cities tokenized differently in a list)."""
    ask = needles if ask is None else ask
    longest = max(
        len(tokenizer.encode(NEEDLE.format(city=c, number=x)))
        for c in CITIES
        for x in (1_000_000, 8_888_888, 9_999_999)
    )
    cities = sorted(CITIES, key=lambda c: len(tokenizer.encode(c)), reverse=True)[:ask]
    before, after = template(tokenizer, question_for([Needle(c, 0, 0) for c in cities]))
    return len(before) + len(after) + needles * longest + 2


# ---------------------------------------------------------------------------------------------------
# Scoring and the grid.

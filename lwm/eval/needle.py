"""Needle in a haystack, in LWM's form: can the model find one sentence anywhere in a long context?

    python -m lwm.eval.needle --model runs/X/hf --lengths 1024 2048 --depths 0 25 50 75 100 --trials 2 --out results/needle
    python -m lwm.eval.needle --model ... --needles 4 --ask 2              # multi-needle: 4 inserted, 2 asked for
    torchrun --nproc_per_node 2 -m lwm.eval.needle --model ...             # prompt and KV cache split over 2 ranks

The needle "The special magic {city} number is: {number}." (a random city and 7-digit number per
trial, seeded; `--digits` for shorter ones) goes into a haystack of real text (any text file, or JSON lines with a "text" field
like PG19; default the bundled data/sample/text.jsonl, repeated if short) at a depth from 0% (the
start) to 100% (the end), moved back to the sentence break before that point. The model sees LWM's
chat prompt with the whole context and the question in the user turn:

    [BOS] "You are a helpful assistant. USER: {context} What is the special magic {city} number?
    Don't give information outside the document or repeat your findings. Keep your response short
    and direct." "ASSISTANT:"

and an answer is right when the needle's number appears in it (digits not run into other digits;
"1,234,567" counts). With N needles, needle k goes at depth d + k (100 - d) / N and R of them are
asked for in one question; a trial scores the fraction of asked numbers found.

Length: a context length is the length of the whole prompt in the model's own tokens, template and
question included, and it is exact. The prompt is put together from token ids: the template's
pieces, the haystack's ids from a sentence start, the needles' ids spliced in at sentence breaks, the
question's ids; the haystack part is cut to whatever is left. Every seam lies before a word that
starts with a space, and a sentencepiece model that splits at whitespace (LLaMA's, the bundled one)
tokenizes each word on its own, so these ids are exactly chat_prompt(decoded user text); the tests
check this. (With a tokenizer that merges across spaces the text reading of the prompt could differ
from its ids by a few tokens at the seams; the ids the model gets still have the requested length.)

Writes OUT/needle.json (the configuration, every trial, accuracy per cell; also written during the
run, at most every 30 s, so a stopped run keeps what it did) and OUT/needle_heatmap.png (depth rows
x length columns). A trial that fails (e.g. out of memory) is recorded with its error and the run
goes on. Exit status: 0, 1 if some trial failed, 2 for bad input. Only rank 0 writes and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from lwm.data.text_tokenizer import TextTokenizer
from lwm.eval.plots import grid_table, heatmap, human_count
from lwm.eval.trials import Autosave, announce, finish, run_trials
from lwm.infer import GenerationConfig
from lwm.infer.load import find_tokenizer
from lwm.infer.prompt import chat_fields
from lwm.infer.runtime import add_model_args, load_generator, start
from lwm.io import JsonlError, records, write_atomic
from lwm.paths import REPO, SAMPLE
from lwm.synth.make_sample import ensure_sample

DEFAULT_HAYSTACK = SAMPLE / "text.jsonl"
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
    """Per text id: does its piece start a word ("▁..."), does it end a sentence ("." "!" "?")."""
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    word = np.array([p.startswith("\u2581") for p in pieces], dtype=bool)
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
    before = [tokenizer.bos_id, *tokenizer.encode(head)]
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


def found_in(number: int, answer: str) -> bool:
    """The number appears in the answer, not as part of a longer run of digits ("1,234,567" counts)."""
    digits = re.sub(r"(?<=\d)[,\s_'](?=\d)", "", answer)
    return re.search(rf"(?<!\d){number}(?!\d)", digits) is not None


def check_grid(lengths, depths, trials: int, needles: int, ask: int | None) -> None:
    if not lengths:
        raise ValueError("lengths: give at least one context length")
    if not depths:
        raise ValueError("depths: give at least one depth")
    bad = [d for d in depths if not 0 <= d <= 100]
    if bad:
        raise ValueError(f"depths must lie in 0..100 (percent of the context), got {bad}")
    bad = [n for n in lengths if n < 1]
    if bad:
        raise ValueError(f"lengths must be positive token counts, got {bad}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not 1 <= needles <= len(CITIES):
        raise ValueError(f"needles must lie in 1..{len(CITIES)}, got {needles}")
    if ask is not None and not 1 <= ask <= needles:
        raise ValueError(f"ask must lie in 1..needles ({needles}), got {ask}")


def check_lengths(tokenizer, lengths, needles: int, ask: int | None) -> None:
    shortest = min_length(tokenizer, needles, ask)
    bad = [n for n in lengths if n < shortest]
    if bad:
        raise ValueError(
            f"lengths {bad} are shorter than the needle(s) and question with the chat template "
            f"({shortest} tokens for {needles} needle(s), {ask or needles} asked); use at least {shortest}"
        )


def trial_rng(seed: int, length: int, depth: float, trial: int) -> random.Random:
    """The same cities and numbers for a (length, depth, trial) on every rank and every run."""
    return random.Random(f"needle/{seed}/{length}/{depth:g}/{trial}")


def summarize(records: list[dict], lengths, depths) -> dict:
    """Accuracy per (length, depth) cell and overall, over the trials that ran (failures are counted apart)."""
    cells = []
    for length in lengths:
        for depth in depths:
            rs = [r for r in records if r["length"] == length and r["depth"] == depth]
            ok = [r for r in rs if r["error"] is None]
            cells.append(
                {
                    "length": length,
                    "depth": depth,
                    "trials": len(rs),
                    "failed": len(rs) - len(ok),
                    "accuracy": float(np.mean([r["score"] for r in ok])) if ok else None,
                    "all_found": float(np.mean([r["correct"] for r in ok])) if ok else None,
                }
            )
    ok = [r for r in records if r["error"] is None]
    return {
        "cells": cells,
        "accuracy": float(np.mean([r["score"] for r in ok])) if ok else None,
        "trials_run": len(records),
        "trials_failed": len(records) - len(ok),
    }


def run_needle(
    generator,
    tokenizer,
    vocab,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int = 1,
    *,
    needles: int = 1,
    ask: int | None = None,
    haystack=None,
    max_new_tokens: int = 16,
    seed: int = 0,
    digits: int = 7,
    instruction: str = INSTRUCTION,
    progress: bool = False,
    on_trial: Callable[[dict, list[dict]], None] | None = None,
) -> dict:
    """Run the grid lengths x depths x trials and return {"config", "trials", "cells", "accuracy", ...}.

    generator: anything with generate(prompt_ids, GenerationConfig) -> new ids (lwm.infer.Generator);
    every rank of a context-parallel group calls this with the same arguments. haystack: a path, a
    Haystack, or None for the bundled sample. on_trial(record, records so far) is called after each
    trial. A trial that raises is recorded with its error (score None) and the run goes on.
    instruction: what follows the question ("" leaves LWM's instruction out, as a curriculum's first
    step trains)."""

    lengths, depths = [int(n) for n in lengths], [float(d) for d in depths]
    check_grid(lengths, depths, trials, needles, ask)
    if needles > len(number_range(digits)):
        raise ValueError(f"{needles} needles need distinct numbers; {digits} digit(s) give {len(number_range(digits))}")
    ask = needles if ask is None else ask
    vocab.check_tokenizer(tokenizer)
    check_lengths(tokenizer, lengths, needles, ask)
    haystack = _haystack(haystack, tokenizer, max(lengths))
    config = GenerationConfig(max_new_tokens=max_new_tokens, stop_tokens=[tokenizer.eos_id], restrict="text")
    trial = partial(run_trial, generator, tokenizer, vocab, haystack, config)
    trial = partial(trial, needles=needles, ask=ask, seed=seed, digits=digits, instruction=instruction)
    grid = [(n, d, t) for n in lengths for d in depths for t in range(trials)]
    records = run_trials(grid, trial, lambda r: r["score"], desc="needle", progress=progress, on_trial=on_trial)
    return {
        "config": {
            "lengths": lengths,
            "depths": depths,
            "trials": trials,
            "needles": needles,
            "ask": ask,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "digits": digits,
            "haystack": haystack.name,
            "needle": NEEDLE,
            "question": QUESTION if ask == 1 else QUESTION_MANY,
            "instruction": instruction,
        },
        "trials": records,
        **summarize(records, lengths, depths),
    }


def _haystack(haystack, tokenizer, longest: int) -> Haystack:
    """A Haystack as given, or read from a path (None: the bundled sample), long enough for `longest`."""
    if not isinstance(haystack, Haystack):
        path = Path(haystack) if haystack is not None else DEFAULT_HAYSTACK
        haystack = Haystack.from_file(tokenizer, path, longest + 4096)
    if len(haystack) <= longest:
        raise ValueError(f"haystack {haystack.name} has {len(haystack)} tokens; the longest length needs {longest + 1}")
    return haystack


def run_trial(
    generator,
    tokenizer,
    vocab,
    haystack: Haystack,
    config,
    length: int,
    depth: float,
    trial: int,
    *,
    needles: int,
    ask: int,
    seed: int,
    digits: int,
    instruction: str,
) -> dict:
    """One trial -> its record: the needles (the same on every rank and every run), the prompt of
    `length` ids, the answer generated with `config` and its score; an error is recorded, not raised."""
    rng = trial_rng(seed, length, depth, trial)
    items = make_needles(rng, depth, needles, ask, digits)
    order = list(range(needles))
    rng.shuffle(order)  # the order the asked cities are named in the question
    question = question_for(items, order)
    record = {"length": length, "depth": depth, "trial": trial, "question": question, "prompt_tokens": None}
    if needles == 1:
        record.update(city=items[0].city, number=items[0].number)
    start = time.perf_counter()
    try:
        prompt = build_prompt(tokenizer, haystack, length, items, question, instruction=instruction)
        record["prompt_tokens"] = len(prompt.ids)
        out = generator.generate(prompt.ids, config)
        answer = tokenizer.decode([t for t in out if t < vocab.text_size])
        for item in items:
            item.found = found_in(item.number, answer) if item.asked else None
        hits = [item.found for item in items if item.asked]
        record.update(answer=answer, score=sum(hits) / len(hits), correct=all(hits), error=None)
    except Exception as e:  # recorded; the grid goes on (an out-of-memory at one length, say)
        record.update(answer=None, score=None, correct=None, error=f"{type(e).__name__}: {e}")
        _free_memory()
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["needles"] = [item.record() for item in items]
    return record


def _free_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------
# Outputs and the command line.


def accuracy_grid(results: dict) -> list[list[float | None]]:
    """Accuracy as depth rows x length columns."""
    cells = {(c["length"], c["depth"]): c["accuracy"] for c in results["cells"]}
    cfg = results["config"]
    return [[cells.get((n, d)) for n in cfg["lengths"]] for d in cfg["depths"]]


def _labels(cfg: dict) -> tuple[list[str], list[str]]:
    """The grid's row (depth) and column (length) labels."""
    return [f"{d:g}" for d in cfg["depths"]], [human_count(n) for n in cfg["lengths"]]


def write_results(results: dict, out: Path, title: str = "Needle in a haystack") -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = write_atomic(out / "needle.json", json.dumps(results, indent=1))
    rows, cols = _labels(results["config"])
    png = heatmap(
        accuracy_grid(results),
        rows,
        cols,
        out / "needle_heatmap.png",
        title=title,
        xlabel="context length (tokens)",
        ylabel="depth (%)",
    )
    return path, png


def build_parser() -> argparse.ArgumentParser:

    p = argparse.ArgumentParser(
        description="Needle-in-a-haystack evaluation (LWM's form) over context lengths x depths",
        epilog="Exit status: 0, 1 if some trial failed (recorded in needle.json), 2 for bad input.",
    )
    add_model_args(p)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="whole-prompt lengths in tokens")
    p.add_argument("--depths", type=float, nargs="+", default=[0, 25, 50, 75, 100], help="needle depths, percent")
    p.add_argument("--trials", type=int, default=2, help="trials per cell (a new city and number each)")
    p.add_argument("--needles", type=int, default=1, help="needles per context")
    p.add_argument("--ask", type=int, help="how many of the needles the question asks for (default: all)")
    p.add_argument(
        "--haystack",
        type=Path,
        help=f'text file, or JSON lines with "text" (default {DEFAULT_HAYSTACK.relative_to(REPO)})',
    )
    p.add_argument("--out", type=Path, default=Path("results/needle"))
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=7, help="digits of the needles' numbers (LWM's: 7)")
    p.add_argument(
        "--no-instruction",
        action="store_true",
        help="leave LWM's instruction after the question out (as lwm/synth/make_retrieval.py --no-instruction)",
    )
    return p


def validate(args) -> Haystack:
    """Every check that needs no weights, before they load -> the haystack; raises FileNotFoundError or
    ValueError naming the input."""

    check_grid(args.lengths, args.depths, args.trials, args.needles, args.ask)
    number_range(args.digits)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not Path(args.model).exists():
        raise FileNotFoundError(f"model {args.model} does not exist")
    tokenizer = TextTokenizer(find_tokenizer(Path(args.model), args.tokenizer))
    check_lengths(tokenizer, args.lengths, args.needles, args.ask)
    if args.haystack is None and not DEFAULT_HAYSTACK.exists():  # the sample data is made, not committed
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the grid's
            ensure_sample()
    return Haystack.from_file(tokenizer, args.haystack or DEFAULT_HAYSTACK, max(args.lengths) + 4096)


def _so_far(args, run_info: dict, records: list[dict]) -> dict:
    """needle.json while the grid runs."""
    config = {
        **run_info,
        "lengths": args.lengths,
        "depths": [float(d) for d in args.depths],
        "trials": args.trials,
        "needles": args.needles,
        "ask": args.ask or args.needles,
        "complete": False,
    }
    return {"config": config, "trials": records}


def _report(results: dict, out: Path, title: str) -> list[str]:
    """Writes needle.json and the heatmap -> the grid table and the accuracy line."""
    path, png = write_results(results, out, title)
    rows, cols = _labels(results["config"])
    acc = results["accuracy"]
    return [
        grid_table(accuracy_grid(results), rows, cols, corner="depth \\ length"),
        f"accuracy {'n/a' if acc is None else f'{acc:.3f}'} over {results['trials_run']} trials"
        f" ({results['trials_failed']} failed); wrote {path} and {png}",
    ]


def _title(args) -> str:
    model = Path(args.model).resolve()
    many = f", {args.needles} needles ({args.ask or args.needles} asked)" if args.needles > 1 else ""
    return f"Needle in a haystack: {model.parent.name}/{model.name}{many}"


def _trial_name(r: dict) -> str:
    return f"length {r['length']} depth {r['depth']:g} trial {r['trial']}"


def run(args, runtime, loaded, gen, haystack: Haystack) -> int:
    """The grid on the loaded model; rank 0 saves as it goes, writes and prints -> exit status."""
    run_info = {
        "model": str(args.model),
        "tokenizer": str(loaded.tokenizer.path),
        "device": runtime.device,
        "dtype": str(next(loaded.model.parameters()).dtype).replace("torch.", ""),
        "world_size": runtime.world,
        "layout": args.layout,
    }
    announce(runtime, "needle", len(args.lengths), len(args.depths), args.trials)
    results = run_needle(
        gen,
        loaded.tokenizer,
        loaded.vocab,
        args.lengths,
        args.depths,
        args.trials,
        needles=args.needles,
        ask=args.ask,
        haystack=haystack,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        digits=args.digits,
        instruction="" if args.no_instruction else INSTRUCTION,
        progress=runtime.rank == 0,
        on_trial=Autosave(args.out / "needle.json", partial(_so_far, args, run_info), runtime.rank),
    )
    results["config"] = {**run_info, **results["config"], "complete": True}
    return finish(runtime, results, lambda: _report(results, args.out, _title(args)), _trial_name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    runtime = start(args.device)
    try:  # every check that needs no weights comes before loading them
        haystack = validate(args)
        loaded, gen = load_generator(args, runtime)
    except (FileNotFoundError, ValueError) as e:
        print(f"needle: {e}", file=sys.stderr)
        return 2
    return run(args, runtime, loaded, gen, haystack)


if __name__ == "__main__":
    sys.exit(main())

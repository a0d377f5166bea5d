"""A small retrieval task in LWM's needle form, dense in answers: several needles in a short
haystack of the bundled text, several of them asked for, each answer trained.

    {"context": "... The special magic Lima number is: 7. ... The special magic Oslo number is: 2. ...",
     "q0": "What is the special magic Oslo number?", "a0": "2.",
     "q1": "What is the special magic Lima number?", "a1": "7.",
     "fields": "[context+q0],a0,[q1],a1"}

    python -m lwm.synth.make_retrieval --out data/retrieval --n 4000 --needles 4 --ask 2 --digits 1

Needle and question are lwm/eval/needle.py's sentences; the numbers are shorter (`--digits`, 1 by
default: ten answers, chance 10%). Before each needle and after the last go 0 to `--filler` words
of the bundled text, so needles sit at varying depths.

`--form chat` writes lwm/eval/needle.py's own prompts instead (LWM's chat form: system line, the
context and the question in the user turn, LWM's instruction, "ASSISTANT:"), each of a random
whole-prompt length in `--lengths` with its needle at a random depth, so what is trained is what
the needle evaluation asks:

    {"prompt": "You are a helpful assistant. USER: ... What is the special magic Oslo number? Don't
     give information ... ASSISTANT:", "answer": "2.", "fields": "[prompt],answer", "length": 117,
     "depths": [41.3]}

    python -m lwm.synth.make_retrieval --form chat --out data/needle_demo/s512 --lengths 128 512

`--numberless` drops the haystack's sentences that hold a digit (the bundled text is full of
numbers a small model takes for the needle's) and writes the text it used to OUT/haystack.txt.

Writes OUT/train.jsonl (seeds 0 .. n-1) and OUT/heldout.jsonl (`--heldout` examples from a
disjoint seed range), deterministic.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from lwm.arg_types import add_options, from_args, option
from lwm.data.text_tokenizer import TextTokenizer
from lwm.paths import SAMPLE
from lwm.synth.needle_prompts import (
    CITIES,
    DEFAULT_HAYSTACK,
    INSTRUCTION,
    NEEDLE,
    QUESTION,
    Haystack,
    build_prompt,
    haystack_path,
    make_needles,
    number_range,
    question_for,
    read_documents,
)

DEFAULT_TOKENIZER = SAMPLE / "tokenizer.model"

HELDOUT_SEED = 10**6  # held-out examples use seeds from here on: never trained on


@dataclass(kw_only=True)
class RetrievalConfig:
    """python -m lwm.synth.make_retrieval: what to write and where."""

    out: Path = option("output folder: train.jsonl, heldout.jsonl", type=Path)
    n: int = option("training examples (seeds 0 .. n-1)", 4000)
    heldout: int = option("held-out examples, from a disjoint seed range", 200)
    needles: int = option("needles per example", 4)
    ask: int = option("how many of the needles are asked for", 2)
    digits: int = option("digits of the needles' numbers (1: ten answers, chance one in ten)", 1)
    filler: int = option("at most this many words of text before each needle", 6)
    haystack: Path = option('text file, or JSON lines with a "text" field', DEFAULT_HAYSTACK, type=Path)
    form: str = option(
        "plain: context, question, answer; chat: lwm/eval/needle.py's prompts (LWM's chat form)",
        "plain",
        choices=["plain", "chat"],
    )
    lengths: list[int] = option(
        "chat: whole-prompt lengths in tokens, uniform in [LOW, HIGH]",
        default_factory=lambda: [128, 512],
        type=int,
        nargs=2,
        metavar=("LOW", "HIGH"),
    )
    tokenizer: Path = option("chat: the sentencepiece model", DEFAULT_TOKENIZER, type=Path)
    numberless: bool = option(
        "drop the haystack's sentences that hold a digit; the text used is written to OUT/haystack.txt "
        "(give it to lwm/eval/needle.py --haystack)",
        False,
        action="store_true",
    )
    instruction: bool = option(
        "chat: leave out LWM's instruction after the question (a curriculum's first step: a small "
        "model learns the retrieval with the question next to the answer, then the full form)",
        True,
        flag="--no-instruction",
        action="store_false",
    )


def words_of(path: Path) -> list[str]:
    return [w for doc in read_documents(path) for w in doc.split()]


def example(seed: int, words: list[str], needles: int, ask: int, digits: int, filler: int) -> dict:
    rng = random.Random(seed)
    cities = rng.sample(CITIES, needles)
    numbers = [rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits) for _ in cities]
    parts = []

    def text():  # 0 to `filler` consecutive words of the haystack
        n = rng.randint(0, filler)
        if n:
            start = rng.randrange(len(words) - n)
            parts.append(" ".join(words[start : start + n]))

    for city, number in zip(cities, numbers):
        text()
        parts.append(NEEDLE.format(city=city, number=number))
    text()  # the last needle is not always at the end
    row, spec = {"context": " ".join(parts)}, "[context"
    for j, k in enumerate(rng.sample(range(needles), ask)):
        row[f"q{j}"], row[f"a{j}"] = QUESTION.format(city=cities[k]), f"{numbers[k]}."
        spec += f"+q{j}],a{j}" if j == 0 else f",[q{j}],a{j}"
    row["fields"] = spec
    return row


def chat_example(
    seed: int,
    tokenizer,
    haystack: Haystack,
    lengths: tuple[int, int],
    needles: int,
    ask: int,
    digits: int,
    instruction: str = INSTRUCTION,
) -> dict:
    """One prompt exactly as lwm/eval/needle.py builds it (LWM's chat form, `length` tokens in all with
    BOS), at a random length in `lengths` and a random depth, over haystack text from a random
    point; the answer is the asked numbers. instruction="": the prompt without LWM's instruction
    after the question."""
    rng = random.Random(seed)
    length, depth = rng.randint(*lengths), rng.uniform(0, 100)
    items = make_needles(rng, depth, needles, ask, digits)
    order = list(range(needles))
    rng.shuffle(order)
    prompt = build_prompt(
        tokenizer,
        haystack,
        length,
        items,
        question_for(items, order),
        text_from=rng.randrange(len(haystack)),
        instruction=instruction,
    )
    text = tokenizer.decode(prompt.ids[1:])  # the data pipeline puts BOS back
    if tokenizer.encode(text) != prompt.ids[1:]:
        raise ValueError(
            f"seed {seed}: the prompt's text does not encode back to its ids; this needs a tokenizer "
            "that splits at whitespace (as the bundled one and LLaMA's do)"
        )
    answer = ", ".join(str(i.number) for i in items if i.asked) + "."
    return {
        "prompt": text,
        "answer": answer,
        "fields": "[prompt],answer",
        "length": length,
        "depths": [round(i.placed_depth, 1) for i in items],
    }


def numberless(path: Path) -> str:
    """The haystack's text without its sentences that hold a digit: the bundled text is dense in
    numbers ("a road of 504 miles", "on day 22"), which a small model confuses with the needle's."""
    docs = []
    for doc in read_documents(path):
        kept = [s for s in re.split(r"(?<=[.!?])\s+", doc.strip()) if s and not re.search(r"\d", s)]
        if kept:
            docs.append(" ".join(kept))
    if not docs:
        raise ValueError(f"haystack {path} has no sentence without a digit")
    return "\n\n".join(docs)


def write(path: Path, rows) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)


def run(config: RetrievalConfig) -> int:
    """Writes OUT/train.jsonl and OUT/heldout.jsonl -> 0; bad input raises ValueError naming the option
    (OUT is made before the checks that read the haystack, as they may write OUT/haystack.txt)."""
    c = config
    if not 1 <= c.ask <= c.needles <= len(CITIES):
        raise ValueError(f"need 1 <= --ask ({c.ask}) <= --needles ({c.needles}) <= {len(CITIES)}")
    if c.digits < 1 or c.n < 1 or c.heldout < 1 or c.filler < 0:
        raise ValueError("--digits, --n and --heldout must be positive and --filler >= 0")
    if not haystack_path(c.haystack).is_file():
        raise ValueError(f"--haystack {c.haystack} does not exist")
    c.out.mkdir(parents=True, exist_ok=True)
    haystack = c.haystack
    if c.numberless:
        haystack = c.out / "haystack.txt"
        haystack.write_text(numberless(c.haystack))
    words = words_of(haystack)
    if len(words) <= c.filler:
        raise ValueError(f"--haystack {haystack} has {len(words)} words, fewer than --filler {c.filler}")
    if c.needles > len(number_range(c.digits)):
        raise ValueError(
            f"--needles {c.needles} need distinct numbers; --digits {c.digits} give {len(number_range(c.digits))}"
        )
    if c.form == "chat":
        make = _chat_maker(c, haystack)
    else:
        make = lambda seed: example(seed, words, c.needles, c.ask, c.digits, c.filler)  # noqa: E731
    write(c.out / "train.jsonl", (make(s) for s in range(c.n)))
    write(c.out / "heldout.jsonl", (make(HELDOUT_SEED + s) for s in range(c.heldout)))
    print(f"wrote {c.n} training and {c.heldout} held-out examples to {c.out}")
    return 0


def _chat_maker(c: RetrievalConfig, path: Path):
    """seed -> a chat example of `c`, once the shortest prompt is known to hold the template and needles."""
    if not c.tokenizer.is_file():
        raise ValueError(f"--tokenizer {c.tokenizer} does not exist")
    low, high = c.lengths
    if not 1 <= low <= high:
        raise ValueError(f"--lengths {low} {high}: need 1 <= LOW <= HIGH")
    tokenizer = TextTokenizer(c.tokenizer)
    haystack = Haystack.from_file(tokenizer, path, high + 4096)
    instruction = INSTRUCTION if c.instruction else ""
    try:
        chat_example(0, tokenizer, haystack, (low, low), c.needles, c.ask, c.digits, instruction)
    except ValueError as e:  # the shortest prompt cannot hold the template and needles
        raise ValueError(f"--lengths {low}: {e}") from None
    return lambda seed: chat_example(seed, tokenizer, haystack, (low, high), c.needles, c.ask, c.digits, instruction)


def build_parser() -> argparse.ArgumentParser:
    return add_options(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]), RetrievalConfig)


def main(argv=None) -> int:
    parser = build_parser()
    try:
        return run(from_args(RetrievalConfig, parser.parse_args(argv)))
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())

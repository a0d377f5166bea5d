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
from pathlib import Path

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
    make_needles,
    number_range,
    question_for,
    read_documents,
)

DEFAULT_TOKENIZER = SAMPLE / "tokenizer.model"

HELDOUT_SEED = 10**6  # held-out examples use seeds from here on: never trained on


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--needles", type=int, default=4)
    p.add_argument("--ask", type=int, default=2)
    p.add_argument("--digits", type=int, default=1)
    p.add_argument("--filler", type=int, default=6, help="at most this many words of text before each needle")
    p.add_argument("--haystack", type=Path, default=DEFAULT_HAYSTACK)
    p.add_argument(
        "--form",
        choices=["plain", "chat"],
        default="plain",
        help="plain: context, question, answer; chat: lwm/eval/needle.py's prompts (LWM's chat form)",
    )
    p.add_argument(
        "--lengths",
        type=int,
        nargs=2,
        default=[128, 512],
        metavar=("LOW", "HIGH"),
        help="chat: whole-prompt lengths in tokens, uniform in [LOW, HIGH]",
    )
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="chat: the sentencepiece model")
    p.add_argument(
        "--numberless",
        action="store_true",
        help="drop the haystack's sentences that hold a digit; the text used is written to OUT/haystack.txt "
        "(give it to lwm/eval/needle.py --haystack)",
    )
    p.add_argument(
        "--no-instruction",
        action="store_true",
        help="chat: leave out LWM's instruction after the question (a curriculum's first step: a small "
        "model learns the retrieval with the question next to the answer, then the full form)",
    )
    args = p.parse_args(argv)
    if not 1 <= args.ask <= args.needles <= len(CITIES):
        p.error(f"need 1 <= --ask ({args.ask}) <= --needles ({args.needles}) <= {len(CITIES)}")
    if args.digits < 1 or args.n < 1 or args.heldout < 1 or args.filler < 0:
        p.error("--digits, --n and --heldout must be positive and --filler >= 0")
    if not args.haystack.is_file():
        p.error(f"--haystack {args.haystack} does not exist")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.numberless:
        try:
            text = numberless(args.haystack)
        except ValueError as e:
            p.error(str(e))
        args.haystack = args.out / "haystack.txt"
        args.haystack.write_text(text)
    words = words_of(args.haystack)
    if len(words) <= args.filler:
        p.error(f"--haystack {args.haystack} has {len(words)} words, fewer than --filler {args.filler}")
    if args.needles > len(number_range(args.digits)):
        p.error(
            f"--needles {args.needles} need distinct numbers; --digits {args.digits} give {len(number_range(args.digits))}"
        )
    if args.form == "chat":
        if not args.tokenizer.is_file():
            p.error(f"--tokenizer {args.tokenizer} does not exist")
        if not 1 <= args.lengths[0] <= args.lengths[1]:
            p.error(f"--lengths {args.lengths[0]} {args.lengths[1]}: need 1 <= LOW <= HIGH")
        tokenizer = TextTokenizer(args.tokenizer)
        haystack = Haystack.from_file(tokenizer, args.haystack, args.lengths[1] + 4096)
        try:
            chat_example(
                0,
                tokenizer,
                haystack,
                (args.lengths[0],) * 2,
                args.needles,
                args.ask,
                args.digits,
                "" if args.no_instruction else INSTRUCTION,
            )
        except ValueError as e:  # the shortest prompt cannot hold the template and needles
            p.error(f"--lengths {args.lengths[0]}: {e}")
        instruction = "" if args.no_instruction else INSTRUCTION
        make = lambda seed: chat_example(  # noqa: E731
            seed,
            tokenizer,
            haystack,
            tuple(args.lengths),
            args.needles,  # noqa: E731
            args.ask,
            args.digits,
            instruction,
        )
    else:
        make = lambda seed: example(seed, words, args.needles, args.ask, args.digits, args.filler)  # noqa: E731
    write(args.out / "train.jsonl", (make(s) for s in range(args.n)))
    write(args.out / "heldout.jsonl", (make(HELDOUT_SEED + s) for s in range(args.heldout)))
    print(f"wrote {args.n} training and {args.heldout} held-out examples to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

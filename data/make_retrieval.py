"""A small retrieval task in LWM's needle form, dense in answers: several needles in a short
haystack of the bundled text, several of them asked for, each answer trained.

    {"context": "... The special magic Lima number is: 7. ... The special magic Oslo number is: 2. ...",
     "q0": "What is the special magic Oslo number?", "a0": "2.",
     "q1": "What is the special magic Lima number?", "a1": "7.",
     "fields": "[context+q0],a0,[q1],a1"}

    python data/make_retrieval.py --out data/retrieval --n 4000 --needles 4 --ask 2 --digits 1

Needle and question are eval/needle.py's sentences; the numbers are shorter (`--digits`, 1 by
default: ten answers, chance 10%). Before each needle and after the last go 0 to `--filler` words
of the bundled text, so needles sit at varying depths.
Writes OUT/train.jsonl (seeds 0 .. n-1) and OUT/heldout.jsonl (`--heldout` examples from a
disjoint seed range), deterministic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval.needle import CITIES, DEFAULT_HAYSTACK, NEEDLE, QUESTION, read_documents  # noqa: E402

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
    args = p.parse_args(argv)
    if not 1 <= args.ask <= args.needles <= len(CITIES):
        p.error(f"need 1 <= --ask ({args.ask}) <= --needles ({args.needles}) <= {len(CITIES)}")
    if args.digits < 1 or args.n < 1 or args.heldout < 1 or args.filler < 0:
        p.error("--digits, --n and --heldout must be positive and --filler >= 0")
    if not args.haystack.is_file():
        p.error(f"--haystack {args.haystack} does not exist")
    words = words_of(args.haystack)
    if len(words) <= args.filler:
        p.error(f"--haystack {args.haystack} has {len(words)} words, fewer than --filler {args.filler}")
    make = lambda seed: example(seed, words, args.needles, args.ask, args.digits, args.filler)  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / "train.jsonl", (make(s) for s in range(args.n)))
    write(args.out / "heldout.jsonl", (make(HELDOUT_SEED + s) for s in range(args.heldout)))
    print(f"wrote {args.n} training and {args.heldout} held-out examples to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

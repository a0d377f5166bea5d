"""Training examples for needle retrieval, built exactly like eval/needle.py's prompts (same
template, haystack, needle sentence and question), with the number as the answer:

    {"user": "You are a helpful assistant. USER: {context} {question} {instruction}",
     "assistant": "ASSISTANT:", "answer": "4821937.", "fields": "[user+assistant],answer"}

    python data/make_needle_data.py --tokenizer data/demo/tokenizer.model --out data/demo/needle.jsonl \
        --n 3000 --min-length 256 --max-length 2048

Lengths (in the tokenizer's tokens, the whole prompt) and depths are drawn at random; the random
stream is separate from the evaluation's (seed + 1000), so no trial is trained on.
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

from eval.needle import DEFAULT_HAYSTACK, Haystack, build_prompt, make_needles, min_length, question_for  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--haystack", default=str(DEFAULT_HAYSTACK))
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--min-length", type=int, default=256)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.infer.prompt import TEXT_CHAT_SPEC, chat_fields

    tok = TextTokenizer(args.tokenizer)
    lo = max(args.min_length, min_length(tok))
    if lo > args.max_length:
        p.error(f"--max-length {args.max_length} is shorter than the shortest prompt ({lo} tokens)")
    haystack = Haystack.from_file(tok, args.haystack, args.max_length)
    rng = random.Random(args.seed + 1000)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for _ in range(args.n):
            needles = make_needles(rng, rng.uniform(0, 100), 1, 1)
            prompt = build_prompt(tok, haystack, rng.randint(lo, args.max_length), needles, question_for(needles))
            row = {**chat_fields(prompt.user_text(tok)), "answer": f"{needles[0].number}.", "fields": TEXT_CHAT_SPEC}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.n} needle examples ({lo}-{args.max_length} tokens) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Video QA whose answers the tiny VQGAN's codes carry: four-option questions (Video-MME style, chance
25%) about the color cards of lwm/synth/make_vniah.py hidden among sample-style haystack frames.

    python -m lwm.synth.make_card_qa --out data/card_qa/f6 --frames 3 6 --n 4000
    python -m lwm.eval.video_qa --model M --data data/card_qa/f6/qa.jsonl --codes data/card_qa/f6/codes

Each video has LOW to HIGH frames at 1 fps; one to four of them are cards of distinct colors, at
random frames. Two questions per video, each answered by the color of one card and offered with
three other colors:

    first  "What color is the first card in the video?"
    last   "What color is the last card in the video?"

A nearest-centroid probe on the codes tells the cards' colors and "no card" apart on held-out
frames (`python -m lwm.synth.make_vniah --probe`: 99.1%), so both answers are readable from the codes;
what the model has to learn is finding the first and the last card among up to four. (Counting the
cards was tried too and not learned by the debug model in the demo's budget: docs/demos.md "Video demo".)

Writes OUT/codes (or --codes; tokens/<id>.npy and manifest.*.jsonl, as lwm-tokenize writes them),
OUT/train.jsonl (every question twice, as the sample QA: the bare question answered with the
option's text, and the question with its options answered with the letter, in the chat form) and
OUT/qa.jsonl (held-out videos from frames of their own, in lwm/eval/video_qa's form):

    {"vision": "cardqa_f6_heldout_000003", "id": "cardqa_f6_heldout_000003_last", "question": "What color
     is the last card in the video?", "options": ["A. Red.", "B. Blue.", "C. Green.", "D. Cyan."],
     "answer": "D", "duration": 5, "task_type": "last", "cards": ["red", "cyan"], "card_frames": [0, 3]}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lwm.data.chat import CHAT_SPEC, chat_fields
from lwm.data.choices import LETTERS, letter_question, lettered
from lwm.interop.vqgan_sources import open_vqgan
from lwm.synth.language import OPTIONS
from lwm.synth.make_vniah import (
    DEFAULT_CHECKPOINT,
    NEEDLE_COLORS,
    check_set_args,
    code_pool,
    save_video,
    write_manifest,
)

MAX_CARDS = 4
QUESTIONS = {"first": "What color is the first card in the video?", "last": "What color is the last card in the video?"}
HELDOUT_SEED = 10**6  # held-out videos and their frame pools use seeds from here on


def questions(cards: list[str], rng: np.random.Generator) -> list[tuple[str, list[str], str]]:
    """(task, options ["Red.", ...], answer letter) of each question about a video's cards."""
    pool = [f"{c.capitalize()}." for c in NEEDLE_COLORS]
    out = []
    for task, answer in (
        ("first", pool[NEEDLE_COLORS.index(cards[0])]),
        ("last", pool[NEEDLE_COLORS.index(cards[-1])]),
    ):
        others = [a for a in pool if a != answer]
        picked = [others[int(k)] for k in rng.choice(len(others), OPTIONS - 1, replace=False)] + [answer]
        texts = [picked[int(k)] for k in rng.permutation(len(picked))]
        out.append((task, texts, LETTERS[texts.index(answer)]))
    return out


def videos(codes, labels, n: int, frames: tuple[int, int], seed: int, prefix: str, out: Path, made_by: dict | None):
    """n videos of the pool's frames; yields (video id, card colors in order, card frame indices),
    each video's codes written to out/tokens/<id>.npy. made_by: the VQGAN's identity (write_manifest)."""
    rng = np.random.default_rng(seed)
    hay = np.flatnonzero(labels == len(NEEDLE_COLORS))
    manifest = []
    for i in range(n):
        count = int(rng.integers(frames[0], frames[1] + 1))
        k = int(rng.integers(1, min(MAX_CARDS, count) + 1))
        colors = rng.choice(len(NEEDLE_COLORS), k, replace=False)
        at = np.sort(rng.choice(count, k, replace=False))
        order = rng.choice(hay, count, replace=len(hay) < count)
        for c, t in zip(colors, at):
            order[t] = int(rng.choice(np.flatnonzero(labels == c)))
        vid = f"{prefix}_{i:06d}"
        manifest.append(save_video(out, vid, codes[order]))
        yield vid, [NEEDLE_COLORS[c] for c in colors], [int(t) for t in at], count, rng
    write_manifest(out, prefix, manifest, made_by)


def write(
    vqgan,
    out: Path,
    n: int,
    heldout: int,
    frames: tuple[int, int],
    seed: int = 0,
    pool: int = 60,
    codes_dir: Path | None = None,
    made_by: dict | None = None,
) -> None:
    """codes_dir: where the videos' codes go (default out/codes; several sets may share one); made_by:
    vqgan's identity, recorded in the codes' manifests (write_manifest)."""

    codes_dir = codes_dir or out / "codes"
    (codes_dir / "tokens").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    codes, labels = code_pool(vqgan, pool, seed)
    with open(out / "train.jsonl", "w") as f:
        for vid, cards, _, _, rng in videos(
            codes, labels, n, frames, seed, f"cardqa_{out.name}_train", codes_dir, made_by
        ):
            for task, options, letter in questions(cards, rng):
                answer = options[LETTERS.index(letter)]
                for question, reply in (
                    (QUESTIONS[task], answer),
                    (letter_question(QUESTIONS[task], options), f"{letter}."),
                ):
                    f.write(
                        json.dumps(
                            {
                                "vision": vid,
                                **chat_fields(question),
                                "answer": reply,
                                "task_type": task,
                                "fields": CHAT_SPEC,
                            }
                        )
                        + "\n"
                    )
    codes, labels = code_pool(vqgan, max(1, pool // 3), HELDOUT_SEED + seed)
    with open(out / "qa.jsonl", "w") as f:
        for vid, cards, at, count, rng in videos(
            codes, labels, heldout, frames, HELDOUT_SEED + seed, f"cardqa_{out.name}_heldout", codes_dir, made_by
        ):
            for task, options, letter in questions(cards, rng):
                f.write(
                    json.dumps(
                        {
                            "vision": vid,
                            "id": f"{vid}_{task}",
                            "question": QUESTIONS[task],
                            "options": lettered(options),
                            "answer": letter,
                            "duration": count,
                            "task_type": task,
                            "cards": cards,
                            "card_frames": at,
                        }
                    )
                    + "\n"
                )
    print(
        f"wrote {n} training videos ({2 * len(QUESTIONS) * n} rows) and {heldout} held-out videos "
        f"({len(QUESTIONS) * heldout} questions), {frames[0]}-{frames[1]} frames, to {out}"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--codes", type=Path, help="write the videos' codes here (default OUT/codes)")
    p.add_argument("--n", type=int, default=4000, help="training videos")
    p.add_argument("--heldout", type=int, default=100, help="held-out videos (two questions each)")
    p.add_argument(
        "--frames",
        type=int,
        nargs=2,
        default=[3, 6],
        metavar=("LOW", "HIGH"),
        help="frames per video, uniform in [LOW, HIGH]",
    )
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the VQGAN (safetensors + json)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    check_set_args(p, args)

    vqgan, made_by = open_vqgan(args.checkpoint)
    write(vqgan, args.out, args.n, args.heldout, tuple(args.frames), args.seed, codes_dir=args.codes, made_by=made_by)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Make the small synthetic vision-language sample: procedural videos, captions, QA, long documents and
a sentencepiece tokenizer trained on all the text. Deterministic: the same seed gives byte-identical
jsonl, text and tokenizer files (and videos that decode to the same frames).

    python -m lwm.synth.make_sample [--out data/sample] [--seed 0] [--n-videos 48] [--force]

From Python:

    from lwm.synth import make_sample
    out = make_sample.ensure_sample()               # -> Path of data/sample, made if missing
    out = make_sample.run(make_sample.SampleConfig(out=Path("/tmp/s"), n_videos=4))

The pieces live beside it in lwm/synth/: scene.py (random scenes, numpy rendering), language.py (captions,
questions), prose.py (documents); the mp4s are written by lwm.video.writer (PyAV).

Layout of the output folder:

    videos/clip_0000.mp4 ...  64x64 RGB, 4 fps, 8-20 s, H.264 (libx264, yuv420p): 1-3 moving shapes
                              (circle, square, triangle; each at most once per video) in palette colors
                              on a dark background, sometimes a large gray digit in the middle, and
                              events at whole seconds (a shape appears, disappears, changes color,
                              starts moving). Shapes move in straight lines and bounce off the edges.
    videos.jsonl              one line per video:
                              {"id": "clip_0000", "path": "videos/clip_0000.mp4", "fps": 4,
                               "duration": 14, "frames": 56, "width": 64, "height": 64,
                               "objects": [{"shape", "color", "final_color", "size", "start": [x, y],
                                            "motion": "still"|"left"|"right"|"up"|"down", "speed"}],
                               "digit": 7 or null,
                               "events": [{"t": 5, "text": "the red circle turns blue", "kind":
                                           "appear"|"disappear"|"recolor"|"start", "object": 0,
                                           "value": "blue" (new color) | "left" (direction) | null}]}
    captions.jsonl            {"vision": "clip_0000", "caption": "...",
                               "fields": ["[vision],caption", "[caption],vision"]}
    qa.jsonl                  in the chat form evaluation prompts with (lwm.data.chat: the question
                              before the video), one line per question:
                              {"vision": "clip_0000", "question": "What color is the square?",
                               "answer": "Green.", "kind": "color",
                               "user": "You are a helpful assistant. USER: What color is the square?",
                               "assistant": "ASSISTANT:", "fields": "[user+vision+assistant],answer"};
                              kinds: how many shapes (count), what color (color; color_start / color_end
                              if it changes), how it moves (motion), which digit (digit; or "Is a digit
                              shown in the video?" "No.": no_digit), what happens at t seconds (event),
                              when does X happen ("At 5 seconds.": when). Each count, color*, motion and
                              digit question is followed by its multiple-choice variant (same kind):
                              "question": "What color is the square? A. Red. B. Green. C. White.
                              D. Cyan. Answer with the letter.", "answer": "B.", "letter": "B",
                              "options": ["A. Red.", "B. Green.", "C. White.", "D. Cyan."] (three
                              distractors from the kind's answer set, the answer at a seeded-random letter)
    text/doc_000.txt ...      8 procedural documents of 20-40K characters (paragraphs split by blank lines)
    text.jsonl                {"text": <document>, "fields": "text"}, one line per document
    tokenizer.model, .vocab   sentencepiece BPE, 4096 pieces, unk 0, bos 1, eos 2, no pad, byte
                              fallback, digits split; trained on the text the examples encode: captions,
                              the qa rows' user, assistant and answer fields, and documents
    DONE                      the arguments of the finished run; a run with the same arguments skips
"""

from __future__ import annotations

import argparse
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm
from filelock import FileLock

from lwm.arg_types import add_options, from_args, option
from lwm.paths import SAMPLE
from lwm.synth.language import caption, event_text, multiple_choice, questions
from lwm.synth.prose import document
from lwm.synth.scene import FPS, random_scene, render, scene_to_json
from lwm.video.writer import write_mp4

DEFAULT_OUT = SAMPLE
N_DOCS = 8
DOC_CHARS = (20_000, 40_000)
VOCAB_SIZE = 4096
FORMAT = 2  # bump when the output changes, so old folders are remade


@dataclass(kw_only=True)
class SampleConfig:
    """python -m lwm.synth.make_sample: where, from which seed, how many videos."""

    out: Path = option(f"output folder (default {DEFAULT_OUT})", DEFAULT_OUT, type=Path)
    seed: int = option("", 0)  # no help text: the names say it
    n_videos: int = option("", 48)
    force: bool = option("regenerate even if the folder is complete", False, action="store_true")


def _rng(seed: int, *stream: int) -> np.random.Generator:
    """Independent generators per (seed, stream...): one video's draws do not shift another's."""
    return np.random.default_rng([seed, *stream])


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def train_tokenizer(lines: list[str], out: Path, seed: int) -> None:
    """BPE on the given lines -> out/tokenizer.model and out/tokenizer.vocab, the same bytes for the same lines."""
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        byte_fallback=True,
        split_digits=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        max_sentence_length=16384,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
    (out / "tokenizer.vocab").write_text(vocab, encoding="utf-8")


def _expected_files(n_videos: int) -> list[str]:
    return (
        [f"videos/clip_{i:04d}.mp4" for i in range(n_videos)]
        + [f"text/doc_{i:03d}.txt" for i in range(N_DOCS)]
        + ["videos.jsonl", "captions.jsonl", "qa.jsonl", "text.jsonl", "tokenizer.model", "tokenizer.vocab"]
    )


def is_complete(out: Path, seed: int, n_videos: int) -> bool:
    done = out / "DONE"
    return (
        done.is_file()
        and done.read_text() == _done_text(seed, n_videos)
        and all((out / f).is_file() for f in _expected_files(n_videos))
    )


def _done_text(seed: int, n_videos: int) -> str:
    return json.dumps({"format": FORMAT, "n_videos": n_videos, "seed": seed}) + "\n"


def generate(out: Path, seed: int, n_videos: int) -> dict:
    """Write everything under `out` (removing this script's old outputs there first); returns counts."""
    (out / "DONE").unlink(missing_ok=True)
    for sub, pattern in (("videos", "clip_*.mp4"), ("text", "doc_*.txt")):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in (out / sub).glob(pattern):
            old.unlink()

    from lwm.data.chat import CHAT_SPEC, chat_fields  # here, not at the top: it imports torch and lightning

    def qa_row(video_id: str, question: str, answer: str, kind: str, **extra) -> dict:
        return {
            "vision": video_id,
            "question": question,
            "answer": answer,
            "kind": kind,
            **chat_fields(question),
            **extra,
            "fields": CHAT_SPEC,
        }

    videos, captions, qa = [], [], []
    for i in range(n_videos):
        scene = random_scene(_rng(seed, i, 0), f"clip_{i:04d}")
        write_mp4(out / "videos" / f"{scene.id}.mp4", render(scene), FPS)
        videos.append(scene_to_json(scene, [event_text(scene, e) for e in scene.events]))
        captions.append(
            {
                "vision": scene.id,
                "caption": caption(scene, _rng(seed, i, 1)),
                "fields": ["[vision],caption", "[caption],vision"],
            }
        )
        choice_rng = _rng(seed, i, 2)
        for q in questions(scene):
            qa.append(qa_row(scene.id, q.question, q.answer, q.kind))
            if (mc := multiple_choice(q, choice_rng)) is not None:
                qa.append(qa_row(scene.id, mc.question, f"{mc.letter}.", q.kind, options=mc.options, letter=mc.letter))

    docs = []
    for i in range(N_DOCS):
        rng = _rng(seed, 1_000_000 + i)
        docs.append(document(rng, int(rng.integers(*DOC_CHARS))))
        (out / "text" / f"doc_{i:03d}.txt").write_text(docs[-1], encoding="utf-8")

    _write_jsonl(out / "videos.jsonl", videos)
    _write_jsonl(out / "captions.jsonl", captions)
    _write_jsonl(out / "qa.jsonl", qa)
    _write_jsonl(out / "text.jsonl", [{"text": d, "fields": "text"} for d in docs])

    lines = [c["caption"] for c in captions] + [x for r in qa for x in (r["user"], r["assistant"], r["answer"])]
    lines += [p for d in docs for p in d.split("\n") if p.strip()]
    train_tokenizer(lines, out, seed)
    (out / "DONE").write_text(_done_text(seed, n_videos))
    return {"videos": len(videos), "captions": len(captions), "qa": len(qa), "documents": len(docs)}


def _mb(paths) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file()) / 1e6


def run(config: SampleConfig) -> Path:
    """Makes the sample in config.out unless it is complete already -> the folder; a bad option raises
    ValueError naming it."""
    c = config
    if c.n_videos < 1:
        raise ValueError(f"--n-videos must be at least 1, got {c.n_videos}")
    c.out.mkdir(parents=True, exist_ok=True)
    with FileLock(c.out / ".make.lock"):  # a second run at once waits, then finds the sample complete
        if not c.force and is_complete(c.out, c.seed, c.n_videos):
            print(f"{c.out} is complete (seed {c.seed}, {c.n_videos} videos); --force to remake it")
            return c.out
        start = time.perf_counter()
        counts = generate(c.out, c.seed, c.n_videos)
    files = list(c.out.rglob("*"))
    print(
        f"wrote {c.out}: "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; {_mb(files):.2f} MB in all, videos {_mb((c.out / 'videos').iterdir()):.2f} MB, "
        f"tokenizer.model {_mb([c.out / 'tokenizer.model']) * 1000:.0f} KB; {time.perf_counter() - start:.1f} s"
    )
    return c.out


def build_parser() -> argparse.ArgumentParser:
    return add_options(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]), SampleConfig)


def main(argv: list[str] | None = None) -> Path:
    """Command line entry point; returns the output folder."""
    parser = build_parser()
    try:
        return run(from_args(SampleConfig, parser.parse_args(argv)))
    except ValueError as e:
        parser.error(str(e))


def ensure_sample(out: str | Path = DEFAULT_OUT, seed: int = 0, n_videos: int = 48, force: bool = False) -> Path:
    """The sample folder, generated first if it is missing or incomplete."""
    return run(SampleConfig(out=Path(out), seed=seed, n_videos=n_videos, force=force))


if __name__ == "__main__":
    main()

"""Make a synthetic long-video QA set on demand (Video-MME style: four options, the answer is a letter),
to measure how accuracy changes with the length of the video. Not committed; deterministic per seed.

    python -m lwm.synth.make_long_videos --out data/long_videos --durations 8 16 32 64 128 3600 --per-duration 8 --seed 0

The videos are the sample corpus's scenes (lwm/synth) made longer: the same shapes, colors,
motions, digits and rendering, at 1 frame per second (--fps), with every shape on screen for the
whole video and events that do not change what the questions ask about (a still shape starts moving
at a known second). So every question can be answered from any part of the video, and the questions
are the sample's multiple-choice questions word for word (data/sample/qa.jsonl rows with "options":
the question, then its options, then "Answer with the letter."), which a model trained on the sample
corpus has seen. Video j of every duration shows the same
shapes, digit and background, with the same questions and options; only the length and the event
times differ (for durations of 6 s or more), so accuracy vs duration compares like with like.

Layout of the output folder:

    videos/long_0064s_03.mp4  64x64 RGB, `duration * fps` frames (read_video(path, fps=1.0) gives one
                              frame per second), H.264: 1-3 moving shapes, sometimes a large gray digit
    videos.jsonl              one record per video, as in data/sample/videos.jsonl, with the event times:
                              {"id": "long_0064s_03", "path": "videos/long_0064s_03.mp4",
                              "fps": 1, "duration": 64, "frames": 64, "objects": [...], "digit": 7 or null,
                              "events": [{"t": 23, "kind": "start", "text": "the red circle starts moving up", ...}]}
    qa.jsonl                  2-8 questions per video (how many shapes, what color is each shape, how
                              does each shape move unless it starts moving later, which digit):
                              {"video": "videos/long_0064s_03.mp4", "id": "long_0064s_03_q1",
                               "duration": 64, "kind": "color", "question": "What color is the circle?",
                               "options": ["A. Red.", "B. Cyan.", "C. Green.", "D. White."], "answer": "B"}
                              (Video-MME style: `question` is the bare question; listed with its options
                              as in training, it reads "What color is the circle? A. Red. B. Cyan.
                              C. Green. D. White. Answer with the letter." (lwm/eval/video_qa/text.py's letter
                              form; lwm.synth.language.choice_question); `video` is relative to this
                              folder; `id` is the video's id and the question's number in it, the same
                              at every duration.
    DONE                      the arguments of the finished run; a run with the same arguments skips

A rerun after an interruption keeps the videos already written (each is written under a temporary name
and renamed when complete) if the seed and format are the same (videos/MADE_WITH); videos that the
arguments no longer ask for are removed. An hour (3600 frames) takes about a second to render and encode.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lwm.paths import DATA
from lwm.synth.language import event_text, multiple_choice, questions
from lwm.synth.make_sample import _mb, _rng, _write_jsonl
from lwm.synth.scene import random_scene, render, scene_to_json
from lwm.video.writer import write_mp4

DEFAULT_OUT = DATA / "long_videos"
FORMAT = 1  # bump when the output changes, so old folders are remade
EVENT_KINDS = ("start",)  # shapes stay on screen and keep their colors
KINDS = ("count", "color", "motion", "digit")  # questions whose answer holds in every part of the video
STREAM = 2_000_000  # random streams (seed, STREAM + j, ...): apart from make_sample's


def video_id(duration: int, j: int) -> str:
    return f"long_{duration:04d}s_{j:02d}"


def make_video(seed: int, duration: int, j: int, fps: int):
    """The scene of video j at this duration and its questions: [(kind, bare question, Choice)]."""
    scene = random_scene(
        _rng(seed, STREAM + j, 0), video_id(duration, j), seconds=duration, fps=fps, event_kinds=EVENT_KINDS
    )
    choice_rng = _rng(seed, STREAM + j, 1)  # not keyed by the duration: the same options at every length
    asked = []
    for q in questions(scene):
        mc = multiple_choice(q, choice_rng)  # drawn for every closed question, so the draws do not depend on KINDS
        if q.kind in KINDS:
            asked.append((q.kind, q.question, mc))
    return scene, asked


def _done_text(seed: int, durations: list[int], per_duration: int, fps: int) -> str:
    return (
        json.dumps({"format": FORMAT, "seed": seed, "durations": durations, "per_duration": per_duration, "fps": fps})
        + "\n"
    )


def is_complete(out: Path, seed: int, durations: list[int], per_duration: int, fps: int = 1) -> bool:
    done = out / "DONE"
    return (
        done.is_file()
        and done.read_text() == _done_text(seed, durations, per_duration, fps)
        and (out / "qa.jsonl").is_file()
        and (out / "videos.jsonl").is_file()
        and all((out / "videos" / f"{video_id(d, j)}.mp4").is_file() for d in durations for j in range(per_duration))
    )


def generate(out: Path, seed: int, durations: list[int], per_duration: int, fps: int = 1) -> dict:
    """Write (or complete) the set under `out`; returns counts."""
    videos_dir = out / "videos"
    videos_dir.mkdir(parents=True, exist_ok=True)
    (out / "DONE").unlink(missing_ok=True)
    for partial in videos_dir.glob(".*.partial"):
        partial.unlink()
    made_with, key = videos_dir / "MADE_WITH", json.dumps({"format": FORMAT, "seed": seed}) + "\n"
    if not made_with.is_file() or made_with.read_text() != key:  # another seed or format: nothing to keep
        for old in videos_dir.glob("long_*.mp4"):
            old.unlink()
        made_with.write_text(key)

    plan = [(d, j) for d in durations for j in range(per_duration)]
    wanted = {f"{video_id(d, j)}.mp4" for d, j in plan}
    for old in videos_dir.glob("long_*.mp4"):
        if old.name not in wanted:
            old.unlink()

    records, qa, reused = [], [], 0
    for k, (duration, j) in enumerate(plan):
        start = time.perf_counter()
        scene, asked = make_video(seed, duration, j, fps)
        path = videos_dir / f"{scene.id}.mp4"
        if path.is_file():
            reused += 1
            note = "kept"
        else:
            partial = videos_dir / f".{path.name}.partial"
            write_mp4(partial, render(scene), fps)
            partial.replace(path)
            note = f"{_mb([path]):.2f} MB"
        records.append(scene_to_json(scene, [event_text(scene, e) for e in scene.events]))
        for n, (kind, question, mc) in enumerate(asked):
            qa.append(
                {
                    "video": f"videos/{path.name}",
                    "id": f"{scene.id}_q{n}",
                    "duration": duration,
                    "kind": kind,
                    "question": question,
                    "options": mc.options,
                    "answer": mc.letter,
                }
            )
        print(
            f"[{k + 1}/{len(plan)}] {scene.id}: {duration} s, {scene.frames} frames, {len(asked)} questions, "
            f"{note}, {time.perf_counter() - start:.1f} s",
            flush=True,
        )

    _write_jsonl(out / "videos.jsonl", records)
    _write_jsonl(out / "qa.jsonl", qa)
    (out / "DONE").write_text(_done_text(seed, durations, per_duration, fps))
    return {"videos": len(plan), "kept": reused, "questions": len(qa)}


def main(argv: list[str] | None = None) -> Path:
    """Command line entry point; returns the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument(
        "--durations",
        type=int,
        nargs="+",
        default=[8, 16, 32, 64, 128, 3600],
        help="video lengths in seconds (default 8 16 32 64 128 3600)",
    )
    parser.add_argument("--per-duration", type=int, default=8, help="videos per duration (default 8)")
    parser.add_argument("--fps", type=int, default=1, help="frames per second of the videos (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="remake every video even if the folder is complete")
    args = parser.parse_args(argv)
    if any(d < 1 for d in args.durations) or len(set(args.durations)) != len(args.durations):
        parser.error(f"--durations must be distinct whole seconds >= 1, got {args.durations}")
    if args.per_duration < 1:
        parser.error(f"--per-duration must be at least 1, got {args.per_duration}")
    if args.fps < 1:
        parser.error(f"--fps must be at least 1, got {args.fps}")
    out = args.out
    if args.force:
        (out / "videos" / "MADE_WITH").unlink(missing_ok=True)
    elif is_complete(out, args.seed, args.durations, args.per_duration, args.fps):
        print(
            f"{out} is complete (seed {args.seed}, durations {args.durations}, {args.per_duration} each); "
            "--force to remake it"
        )
        return out
    start = time.perf_counter()
    counts = generate(out, args.seed, args.durations, args.per_duration, args.fps)
    print(
        f"wrote {out}: {counts['videos']} videos ({counts['kept']} kept from an earlier run), "
        f"{counts['questions']} questions; videos {_mb((out / 'videos').iterdir()):.1f} MB; "
        f"{time.perf_counter() - start:.1f} s"
    )
    return out


if __name__ == "__main__":
    main()

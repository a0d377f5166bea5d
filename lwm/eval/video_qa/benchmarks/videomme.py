"""Video-MME, as released and as its README and scorer ask.

Files: the Hugging Face parquet (videomme/test-00000-of-00001.parquet, one row a question: video_id,
duration, domain, sub_category, url, videoID, question_id, task_type, question, options ["A. ...", ...],
answer "C"), the same rows as JSON, or the GitHub JSON (a list of videos: video_id, duration_category or
duration, video_category, video_sub_category or video_subcategory, url, questions [{question_id,
task_type, question, choices or options, answer}]). Videos: --video-dir/<videoID>.mp4 (.MP4, .mkv; the
GitHub form's videoID is read from its url); subtitles: <dir>/<videoID>.srt.

Prompt, the README's: [This video's subtitles are listed below:\\n{subtitles}\\n]Select the best answer to
the following multiple-choice question based on the video. Respond with only the letter (A, B, C, or D)
of the correct option.\\n{question}\\n{A. ...}\\n...\\nThe best answer is: (with --subtitles, the lines
on screen at the sampled frames' times, as lmms-eval builds them; "No subtitles available" for a video
without a subtitle file). Reading the letter, the scorer's rule: strip, delete its list of answer
phrases, the first capital A-D that remains. That list, as published, runs two pairs of phrases together
("The best option isThe correct option is", "Best answer:Best option:"), so "Best answer: C" reads as B;
followed as published, so that the numbers here are the scorer's. No letter: not counted (the scorer's
"answered"). Overall: correct / answered, by duration, domain, sub_category, task_type.

Results file: videomme_results.json, its videos, each with the keys of the current template
(evaluation/output_test_template.json: duration, domain, sub_category; `options` per question) and,
beside them with the same values, those its last published scorer (evaluation/eval_your_results.py)
reads (duration_category, video_category, video_subcategory; `choices`), so a scorer of either form
reads it; url, videoID, `missing` (its video could not be read) and its questions, each with the
model's raw `response` to the prompt ("" where none was generated)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np

from lwm.eval.video_qa.benchmarks.base import Benchmark, Rules, first_capital
from lwm.eval.video_qa.items import (
    VIDEO_ERRORS,
    Item,
    ItemError,
    bad_item,
    duration_value,
    letter_index,
    parse_options,
    text_field,
    video_file,
)
from lwm.eval.video_qa.subtitles import Line, SubtitleError, clean
from lwm.eval.video_qa.text import LETTERS

OPTIONS = 4
INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter (A, B, C, or D) of the correct option."
)
SUBTITLES = "This video's subtitles are listed below:"
NO_SUBTITLES = "No subtitles available"
POST = "The best answer is:"
# Video-MME's list of answer phrases, as its scorer has it (two entries are pairs run together).
PHRASES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)

# ------------------------------------------------------------------------------------ reading


def recognise(obj: dict) -> bool:
    keys = set(obj)
    if isinstance(obj.get("questions"), list) and keys & {"video_id", "url", "duration_category", "video_category"}:
        return True
    return {"videoID", "question_id", "task_type"} <= keys


def _youtube_id(url) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return None
    parsed = urlparse(url.strip())
    found = parse_qs(parsed.query).get("v")
    if found:
        return found[0]
    tail = parsed.path.rstrip("/").rsplit("/", 1)[-1]  # youtu.be/<id>, /shorts/<id>
    return tail or None


def read_question(row: dict, item_id: str, video_dir, subtitle_dir) -> Item:
    """One question (a parquet row, or a GitHub question with its video's fields) -> an Item."""
    item = Item(id=str(row.get("question_id") or item_id), benchmark="videomme")
    duration = row.get("duration", row.get("duration_category"))
    domain = row.get("domain", row.get("video_category"))
    sub = row.get("sub_category", row.get("video_sub_category", row.get("video_subcategory")))
    vid = row.get("videoID") or _youtube_id(row.get("url")) or row.get("video_id")
    raw_options = row.get("options", row.get("choices"))
    if isinstance(raw_options, tuple):
        raw_options = list(raw_options)
    item.meta = {
        "video_id": row.get("video_id"),
        "videoID": vid,
        "url": row.get("url"),
        "duration": duration,
        "domain": domain,
        "sub_category": sub,
        "question_id": row.get("question_id"),
        "task_type": row.get("task_type"),
        "question": row.get("question"),
        "options": raw_options,
        "answer": row.get("answer"),
    }
    item.groups = {k: str(item.meta[k]) for k in ("duration", "domain", "sub_category", "task_type") if item.meta[k]}
    item.duration = duration_value(duration) if isinstance(duration, (str, int, float)) else None
    item.task = item.meta["task_type"]
    item.question, item.answer = row.get("question"), row.get("answer")
    try:
        if not isinstance(vid, str) or not vid.strip():
            raise ItemError("malformed", "no video: expected 'videoID' (or a YouTube 'url')")
        item.video_key = vid.strip()
        if video_dir is not None:
            item.video = video_file(video_dir, item.video_key)
            item.video_roots = (str(video_dir),)
        if subtitle_dir is not None:
            item.subtitles = str(Path(subtitle_dir) / f"{item.video_key}.srt")
        item.question, item.answer = text_field(row, "question"), text_field(row, "answer")
        if not isinstance(raw_options, list) or len(raw_options) != OPTIONS:
            n = len(raw_options) if isinstance(raw_options, list) else raw_options
            raise ItemError("options", f"Video-MME questions have {OPTIONS} options, got {n!r}")
        item.options = parse_options(raw_options, distinct=False)
        k = letter_index(item.answer, len(item.options))
        if k is None:
            raise ItemError("answer", f"answer {item.answer!r} is not an option letter A-D")
        item.answer_index = k
    except ItemError as e:
        return bad_item(item.id, e, partial=item)
    return item


def items(obj: dict, item_id: str, source: Path, video_dir, subtitle_dir) -> list[Item]:
    """A row, or a GitHub video with its questions (each inheriting the video's fields)."""
    if not isinstance(obj.get("questions"), list):
        return [read_question(obj, item_id, video_dir, subtitle_dir)]
    shared = {k: v for k, v in obj.items() if k != "questions"}
    out = []
    for k, q in enumerate(obj["questions"]):
        qid = f"{item_id}.{k + 1}"
        if not isinstance(q, dict):
            out.append(
                bad_item(qid, ItemError("malformed", f"a question must be a JSON object, got {type(q).__name__}"))
            )
            continue
        out.append(read_question({**shared, **q}, qid, video_dir, subtitle_dir))
    return out


# ------------------------------------------------------------------------------------ prompt and answer


class VideoMME(Rules):
    name, title = "videomme", "Video-MME"
    breakdowns = ("duration", "domain", "sub_category", "task_type")
    unparsed = "skip"
    unparsed_text = "an output with no letter is not counted (Video-MME's scorer)"

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        raw = item.meta.get("options") or []
        listed = [str(o).strip() for o in raw] if len(raw) == len(item.options) else []
        if [o for o in listed] != [f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)]:
            listed = [f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)]
        body = "\n".join([INSTRUCTION, item.question, *listed, POST])
        if subtitles is None:
            return body
        return f"{SUBTITLES}\n{subtitles or NO_SUBTITLES}\n{body}"

    def find(self, text: str, n: int) -> int | None:
        letter = first_capital(text, PHRASES, "ABCD")
        return None if letter is None else LETTERS.index(letter)  # a letter past the options scores wrong


# ------------------------------------------------------------------------------------ subtitles

_SRT_TIME = re.compile(r"(\d+):(\d+):(\d+)[,.](\d+)")


def _srt_seconds(text: str) -> float:
    m = _SRT_TIME.search(text)
    if m is None:
        raise ValueError(f"not a time: {text!r}")
    h, mi, s, frac = m.groups()
    return int(h) * 3600 + int(mi) * 60 + int(s) + int(frac) / 10 ** len(frac)


def read_srt(path) -> list[Line]:
    """An .srt file: blocks of an index, "HH:MM:SS,mmm --> HH:MM:SS,mmm" and text lines (the text wrapped
    in <font ...> tags, stripped here)."""
    try:
        raw = Path(path).read_text(encoding="utf-8-sig", errors="replace")
    except OSError as e:
        raise SubtitleError(f"{path}: {e.strerror or e}") from e
    out = []
    for block in re.split(r"\n\s*\n", raw.replace("\r\n", "\n").replace("\r", "\n")):
        rows = [r for r in block.strip().split("\n") if r.strip()]
        at = next((i for i, r in enumerate(rows) if "-->" in r), None)
        if at is None:
            continue
        try:
            start, end = (_srt_seconds(t) for t in rows[at].split("-->", 1))
        except ValueError as e:
            raise SubtitleError(f"{path}: {e}") from e
        text = clean(" ".join(rows[at + 1 :]))
        if text:
            out.append(Line(start, end, text))
    return out


def at_frames(lines: list[Line], times) -> list[str]:
    """The texts of the lines on screen at any of the sampled times (start <= t < end), in order, each once."""
    times = np.sort(np.asarray(times, dtype=np.float64))
    out = []
    for line in lines:
        i = np.searchsorted(times, line.start, side="left")  # first time >= start
        if i < len(times) and times[i] < line.end and line.text:
            out.append(line.text)
    return out


def subtitles(item: Item, times, info: dict) -> dict:
    """The lines at the frames, as text before the question; a video without a subtitle file says so (as
    lmms-eval does)."""
    if not os.path.isfile(item.subtitles):
        info["subtitle_lines"] = 0
        return {"prefix": ""}
    texts = at_frames(read_srt(item.subtitles), times)
    info["subtitle_lines"] = len(texts)
    return {"prefix": "\n".join(texts)}


# ------------------------------------------------------------------------------------ results file


def results(records: list[dict]) -> list[dict]:
    """The records of Video-MME's questions as its scorer's input: videos in the order first met,
    questions in theirs."""
    videos: dict[str, dict] = {}
    for r in records:
        if r.get("benchmark") != "videomme":
            continue
        m = r.get("meta", {})
        key = str(m.get("video_id") or m.get("videoID") or r["video"])
        v = videos.setdefault(
            key,
            {
                "video_id": m.get("video_id") or key,
                "duration": m.get("duration"),
                "domain": m.get("domain"),
                "sub_category": m.get("sub_category"),
                "duration_category": m.get("duration"),  # the published scorer's names, same values
                "video_category": m.get("domain"),
                "video_subcategory": m.get("sub_category"),
                "url": m.get("url"),
                "videoID": m.get("videoID"),
                "missing": False,
                "questions": [],
            },
        )
        v["missing"] = v["missing"] or r.get("error_kind") in VIDEO_ERRORS
        v["questions"].append(
            {
                "question_id": m.get("question_id") or r["id"],
                "task_type": m.get("task_type"),
                "question": m.get("question"),
                "options": m.get("options"),
                "choices": m.get("options"),  # the published scorer's name
                "answer": m.get("answer"),
                "response": (r.get("letter") or {}).get("output", "") if r.get("error") is None else "",
            }
        )
    return list(videos.values())


BENCHMARK = Benchmark(
    name="videomme",
    files="Video-MME (the Hugging Face parquet videomme/test-*.parquet, or the GitHub JSON of videos with questions)",
    recognise=recognise,
    items=items,
    rules=VideoMME(),
    subtitles=subtitles,
    results_file="videomme_results.json",
    results=results,
)

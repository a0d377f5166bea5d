"""LongVideoBench, as released and as its loader asks.

Files: lvb_val.json or the validation parquet (id, video_id, video_path, subtitle_path, question,
candidates or option0..option4 with "N/A" for none, correct_choice, duration, duration_group,
question_category, topic_category, starting_timestamp_for_subtitles). Videos: --video-dir/<video_path>
(default the data's folder's videos/); subtitles: <dir>/<subtitle_path>, JSON (a list of {"timestamp":
[start, end], "text"} or {"start": "HH:MM:SS.mmm", "end": ..., "line"}; an end that is not a number is
the video's end; times less the question's starting_timestamp_for_subtitles).

Prompt, its loader's: "Question: {question}\\nA. ...\\n...\\nAnswer with the option's letter from the
given choices directly." With --subtitles, the subtitles interleaved with the frames as its loader does
(a line goes after the frames up to its middle time, and only when a sampled frame falls within it,
widened to 1 s). Reading: the answer phrases deleted, the first capital A-E; no letter: a random option,
as its authors do (here seeded by the question's id, so a run repeats). Overall: accuracy over all
questions, by duration_group and question_category."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from lwm.eval.video_qa.benchmarks.base import Benchmark, Rules, first_capital
from lwm.eval.video_qa.items import Item, ItemError, bad_item, duration_value, text_field
from lwm.eval.video_qa.subtitles import Line, SubtitleError, clean
from lwm.eval.video_qa.text import LETTERS

OPTIONS = (2, 5)
POST = "Answer with the option's letter from the given choices directly."
PHRASES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)

# ------------------------------------------------------------------------------------ reading


def recognise(obj: dict) -> bool:
    return "video_path" in obj and bool(set(obj) & {"candidates", "option0"})


def items(row: dict, item_id: str, source: Path, video_dir, subtitle_dir) -> list[Item]:
    """One question -> its Item; videos default to the data's folder's videos/."""
    video_dir = video_dir if video_dir is not None else source.parent / "videos"
    item = Item(id=str(row.get("id") or item_id), benchmark="longvideobench")
    keep = ("id", "video_id", "video_path", "subtitle_path", "duration", "duration_group", "question_category",
            "topic_category", "starting_timestamp_for_subtitles", "correct_choice")  # fmt: skip
    item.meta = {k: row.get(k) for k in keep}
    item.groups = {k: str(row[k]) for k in ("duration_group", "question_category") if row.get(k) is not None}
    item.task = row.get("question_category")
    item.question = row.get("question") if isinstance(row.get("question"), str) else None
    try:
        item.duration = duration_value(row.get("duration"))
        path = text_field(row, "video_path")
        item.video_key = Path(path).stem
        item.video = str(Path(video_dir) / path) if video_dir is not None else path
        item.video_roots = (str(video_dir),) if video_dir is not None else ()
        if subtitle_dir is not None and row.get("subtitle_path"):
            item.subtitles = str(Path(subtitle_dir) / str(row["subtitle_path"]))
            item.subtitle_offset = float(row.get("starting_timestamp_for_subtitles") or 0.0)
        item.question = text_field(row, "question")
        raw = row.get("candidates")
        if raw is None:
            raw = [row.get(f"option{i}") for i in range(5)]
            raw = [o for o in raw if o is not None and o != "N/A"]
        if not isinstance(raw, list) or not OPTIONS[0] <= len(raw) <= OPTIONS[1]:
            n = len(raw) if isinstance(raw, list) else raw
            raise ItemError("options", f"LongVideoBench questions have 2 to 5 options, got {n!r}")
        item.options = [str(o).strip() for o in raw]
        choice = row.get("correct_choice")
        if choice is None:
            raise ItemError("answer", "no correct_choice (LongVideoBench's test set is scored by its leaderboard)")
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(item.options):
            raise ItemError("answer", f"correct_choice {choice!r} is not an option index 0..{len(item.options) - 1}")
        item.answer_index, item.answer = choice, item.options[choice]
    except ItemError as e:
        return [bad_item(item.id, e, partial=item)]
    return [item]


# ------------------------------------------------------------------------------------ prompt and answer


class LongVideoBench(Rules):
    name, title = "longvideobench", "LongVideoBench"
    breakdowns = ("duration_group", "question_category")
    unparsed = "random"
    unparsed_text = (
        "an output with no letter is scored as a random option (LongVideoBench's authors; seeded by the question's id)"
    )

    def prompt(self, item: Item, subtitles: str | None = None) -> str:
        listed = [f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options)]
        return "\n".join([f"Question: {item.question}", *listed, POST])

    def find(self, text: str, n: int) -> int | None:
        letter = first_capital(text, PHRASES, "ABCDE")
        return None if letter is None else LETTERS.index(letter)


# ------------------------------------------------------------------------------------ subtitles


def _hms(text: str) -> float:
    h, m, s = str(text).split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def read_subtitles(path, offset: float = 0.0, duration: float | None = None) -> list[Line]:
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise SubtitleError(f"{path}: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SubtitleError(f"{path}: not JSON ({e})") from e
    if not isinstance(entries, list):
        raise SubtitleError(f"{path}: expected a JSON list of subtitle lines, got {type(entries).__name__}")
    out = []
    for k, e in enumerate(entries):
        try:
            if "timestamp" in e:
                start, end = e["timestamp"]
                if not isinstance(end, (int, float)) or isinstance(end, bool):
                    end = duration if duration is not None else math.inf
                text = e["text"]
            else:
                start, end, text = _hms(e["start"]), _hms(e["end"]), e["line"]
            out.append(Line(float(start) - offset, float(end) - offset, clean(str(text))))
        except (KeyError, TypeError, ValueError) as err:
            raise SubtitleError(f"{path}: entry {k + 1} is not a subtitle line ({type(err).__name__}: {err})") from err
    return out


def interleave(lines: list[Line], times) -> list[tuple[int, str]]:
    """(how many frames come before it, text) for each line the loader puts among the frames: after the
    frames whose times are at most its middle, when some sampled frame falls strictly within it (a line
    shorter than 1 s widened to 1 s about its middle for that test)."""
    times = np.asarray(times, dtype=np.float64)
    out, before = [], 0
    for line in lines:
        middle = (line.start + line.end) / 2
        while before < len(times) and times[before] <= middle:
            before += 1
        start, end = (line.start, line.end) if line.end - line.start >= 1 else (middle - 0.5, middle + 0.5)
        if ((times > start) & (times < end)).any():
            out.append((before, line.text))
    return out


def subtitles(item: Item, times, info: dict) -> dict:
    """The lines interleaved with the frames."""
    duration = item.duration if isinstance(item.duration, (int, float)) else info.get("video_seconds")
    between = interleave(read_subtitles(item.subtitles, item.subtitle_offset, duration), times)
    info["subtitle_lines"] = len(between)
    return {"between": between}


BENCHMARK = Benchmark(
    name="longvideobench",
    files="LongVideoBench (lvb_val.json, or its validation parquet)",
    recognise=recognise,
    items=items,
    rules=LongVideoBench(),
    subtitles=subtitles,
)

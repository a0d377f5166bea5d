"""Subtitles at the sampled frames' times.

Files: Video-MME's .srt (blocks of an index, "HH:MM:SS,mmm --> HH:MM:SS,mmm" and text lines; the text
wrapped in <font ...> tags, stripped here) and LongVideoBench's JSON (a list of {"timestamp": [start,
end], "text"} or {"start": "HH:MM:SS.mmm", "end": ..., "line"}; an end that is not a number is the
video's end; times less the question's starting_timestamp_for_subtitles).

Which lines: `at_frames`, Video-MME's setting as lmms-eval builds it: every line on screen at a sampled
frame's time (start <= t < end), in order, each once. `interleave`, LongVideoBench's loader's: each line
goes after the frames whose times are at most its middle, and only when some sampled frame falls
strictly within it (a line shorter than 1 s is widened to 1 s about its middle for that test)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_TAG = re.compile(r"<[^>]+>")
_SRT_TIME = re.compile(r"(\d+):(\d+):(\d+)[,.](\d+)")


@dataclass(frozen=True)
class Line:
    start: float
    end: float
    text: str


class SubtitleError(ValueError):
    """A subtitle file that cannot be read; the message names it."""


def _srt_seconds(text: str) -> float:
    m = _SRT_TIME.search(text)
    if m is None:
        raise ValueError(f"not a time: {text!r}")
    h, mi, s, frac = m.groups()
    return int(h) * 3600 + int(mi) * 60 + int(s) + int(frac) / 10 ** len(frac)


def clean(text: str) -> str:
    """Font and other tags removed, whitespace collapsed."""
    return " ".join(_TAG.sub("", text).split())


def read_srt(path) -> list[Line]:
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


def _hms(text: str) -> float:
    h, m, s = str(text).split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def read_lvb(path, offset: float = 0.0, duration: float | None = None) -> list[Line]:
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


def at_frames(lines: list[Line], times) -> list[str]:
    """The texts of the lines on screen at any of the sampled times, in order, each once."""
    times = np.sort(np.asarray(times, dtype=np.float64))
    out = []
    for line in lines:
        i = np.searchsorted(times, line.start, side="left")  # first time >= start
        if i < len(times) and times[i] < line.end and line.text:
            out.append(line.text)
    return out


def interleave(lines: list[Line], times) -> list[tuple[int, str]]:
    """(how many frames come before it, text) for each line LongVideoBench's loader puts among the frames."""
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

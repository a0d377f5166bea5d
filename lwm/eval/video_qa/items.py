"""Video QA items: the one internal type every benchmark's files and the plain form are read into
(lwm.eval.video_qa.benchmarks holds the readers), and what the readers share: options, answers,
durations, video files, unique ids, and the Item of a bad entry, which keeps its error and what could be
read of it, so the run records it and goes on.

How an answer names its option (`answer_index`): a bare letter ("C", "c", "(C)", "C.") is the option at
that letter, whatever the options' texts say (options "A. C.", "B. A.", "C. B.", "D. D." with answer "C"
is option C); otherwise the answer is matched against the option texts, exactly first, then ignoring
case and trailing punctuation, then also articles and punctuation, stopping at the first of these that
finds a match (two matches at that step make the answer ambiguous: an error)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from lwm.eval.video_qa.text import LETTERS, light, normalize

VIDEO_EXTENSIONS = (".mp4", ".MP4", ".mkv")  # tried in this order for a video named by its id, as lmms-eval does


class ItemError(ValueError):
    """An item that cannot be evaluated; `kind` groups the reasons in the summary."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# the kinds of a video that could not be read
VIDEO_ERRORS = ("video_missing", "video_outside", "video_unreadable", "codes", "vqgan")


@dataclass
class Item:
    id: str
    question: str | None = None
    answer: str | None = None
    options: list[str] | None = None  # texts without letter prefixes; None for an open question
    answer_index: int | None = None
    video: str | None = None  # a file path, resolved
    video_key: str | None = None  # a video id (videoID / vision): cached codes, or --video-dir/<id>.mp4
    # The folders `video` must stay in, links and `..` followed (confine_video); () for an item built in code.
    video_roots: tuple[str, ...] = ()
    duration: float | str | None = None  # seconds, or a bucket name as given
    task: str | None = None  # the question's kind (its benchmark's task field, or kind), for a breakdown
    benchmark: str | None = None  # its benchmark's name in lwm.eval.video_qa.benchmarks; None for the plain form
    groups: dict[str, str] = field(default_factory=dict)  # the benchmark's breakdowns: {"domain": "Knowledge", ...}
    meta: dict = field(default_factory=dict)  # the released fields, echoed in records and result files
    subtitles: str | None = None  # the video's subtitle file (with --subtitles)
    subtitle_offset: float = 0.0  # seconds to subtract from the subtitles' times, where a benchmark gives them
    error: str | None = None  # set for an item that cannot be evaluated
    error_kind: str | None = None
    where: str | None = None  # where it was read: "<file>:<row or line>" (".<k>" for a video's k-th question)


_PREFIX = re.compile(r"^\s*\(?([A-Z])[.):]\s*(.*)$", re.S)
_LETTER = re.compile(r"^\s*\(?([A-Za-z])\)?[.:]?\s*$")


def strip_prefixes(raw: list[str]) -> list[str]:
    """["A. Red", "B. Blue"] -> ["Red", "Blue"] when every option carries its own letter in order; else as given."""
    prefixed = [_PREFIX.match(o) for o in raw]
    if all(m and m.group(1) == LETTERS[i] and m.group(2).strip() for i, m in enumerate(prefixed)):
        raw = [m.group(2) for m in prefixed]
    return [o.strip() for o in raw]


def parse_options(raw, distinct: bool = True) -> list[str]:
    """A list of option texts (or {"A": text, ...}) -> texts without letter prefixes ("A. Red" -> "Red").
    distinct: refuse two options that are the same text (`text.light`: case and trailing punctuation
    ignored; "a dog" and "the dog" differ). A benchmark scored by letters does not need it."""
    if isinstance(raw, dict):
        keys = sorted(raw)
        if keys != list(LETTERS[: len(keys)]):
            raise ItemError("malformed", f"options given as a mapping must have the keys A, B, ...; got {keys}")
        raw = [raw[k] for k in keys]
    if not isinstance(raw, list) or not 2 <= len(raw) <= len(LETTERS):
        raise ItemError("malformed", f"options must be a list of 2 to 26 texts, got {raw!r}")
    if not all(isinstance(o, str) and o.strip() for o in raw):
        raise ItemError("malformed", f"every option must be non-empty text, got {raw!r}")
    options = strip_prefixes(raw)
    if distinct and len({light(o) for o in options}) < len(options):
        raise ItemError("malformed", f"options are not distinct: {options}")
    return options


def _shown(options: list[str]) -> str:
    return ", ".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))


def letter_index(answer: str, n_options: int) -> int | None:
    """The option a bare letter names ("C", "c", "(C)", "C.") -> its index, or None (not a letter, or past the options)."""
    m = _LETTER.match(answer)
    if m is None:
        return None
    k = LETTERS.index(m.group(1).upper())
    return k if k < n_options else None


def answer_index(answer: str, options: list[str], letters: bool = True, texts: bool = True) -> int:
    """The option an answer names: by its letter (when `letters`), else by its text (when `texts`; see
    the module's doc for the order). Raises ItemError("answer") naming the options."""
    if letters:
        k = letter_index(answer, len(options))
        if k is not None:
            return k
    if texts:
        for key in (str.strip, light, normalize):
            target = key(answer)
            if not target:
                continue
            hits = [i for i, o in enumerate(options) if target in (key(o), key(f"{LETTERS[i]}. {o}"))]
            if len(hits) > 1:
                named = ", ".join(LETTERS[i] for i in hits)
                raise ItemError(
                    "answer", f"answer {answer!r} is ambiguous: it names options {named} ({_shown(options)})"
                )
            if hits:
                return hits[0]
    raise ItemError("answer", f"answer {answer!r} is not among the options ({_shown(options)})")


def duration_value(value) -> float | str | None:
    """Seconds (a number or numeric text) or a bucket name as given; None when absent."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value.strip()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ItemError("malformed", f"duration must be seconds >= 0 or a bucket name, got {value!r}")
    return float(value)


def video_file(folder, name: str) -> str:
    """folder/<name>.mp4, or the first of .MP4 and .mkv that exists (the .mp4 path when none does, so the
    error names it). A name that has an extension already is taken as it is."""
    base = Path(folder) / name
    if Path(name).suffix.lower() in {e.lower() for e in VIDEO_EXTENSIONS}:
        return str(base)
    for ext in VIDEO_EXTENSIONS:
        if Path(f"{base}{ext}").is_file():
            return f"{base}{ext}"
    return f"{base}{VIDEO_EXTENSIONS[0]}"


def confine_video(item: Item) -> None:
    """Marks an item failed ("video_outside") whose video leads out of its roots (an absolute path, `..` or
    a symlink elsewhere): a data file names videos in its folders, never a file anywhere on the machine.
    Nothing is opened; the real path is where the bytes would come from, as the code store's ids are checked."""
    if item.error is not None or item.video is None or not item.video_roots:
        return
    try:
        real = Path(item.video).resolve()
        roots = [Path(r).resolve() for r in item.video_roots]
    except (OSError, RuntimeError) as e:  # a symlink loop
        item.error, item.error_kind = f"video {item.video}: cannot resolve it: {e}", "video_outside"
        return
    if not any(real.is_relative_to(r) for r in roots):
        shown = " or ".join(str(r) for r in item.video_roots)
        item.error = (
            f"item {item.id}: video {item.video} leads to {real}, outside {shown}; a video is a file in the data's "
            "video folder (--video-dir, or the data file's own), never a path out of it (absolute, '..' or a symlink)"
        )
        item.error_kind = "video_outside"


def text_field(obj: dict, key: str, required: bool = True) -> str | None:
    value = obj.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        if required:
            raise ItemError("malformed", f"{key!r} must be non-empty text, got {value!r}")
        return None
    return value.strip()


class DuplicateIdError(ValueError):
    """Items of one run with the same id: each is one question, scored and written once under its id."""


def check_unique_ids(items: list[Item]) -> None:
    """Raises DuplicateIdError naming each id given more than once and where (the first few), before any
    item is evaluated: a question scored twice would count twice and appear twice in the result files."""
    places: dict[str, list[str]] = {}
    for k, item in enumerate(items):
        places.setdefault(item.id, []).append(item.where or f"item {k + 1}")
    repeated = {i: w for i, w in places.items() if len(w) > 1}
    if repeated:
        shown = "; ".join(f"{i!r} at {', '.join(w)}" for i, w in list(repeated.items())[:5])
        more = f" (and {len(repeated) - 5} more)" if len(repeated) > 5 else ""
        raise DuplicateIdError(
            f"{len(repeated)} question id(s) given more than once: {shown}{more}; each question must have its "
            "own id (results are counted and written by id): remove the repeated questions or give them their own ids"
        )


def bad_item(item_id: str, e: Exception, obj=None, partial: Item | None = None) -> Item:
    """An Item that records why it cannot be evaluated, keeping what could be read (the benchmark's fields
    among them, so the error record still says which video, domain, task ... it was)."""
    item = partial or Item(id=item_id)
    item.error, item.error_kind = str(e), getattr(e, "kind", "malformed")
    if partial is None and isinstance(obj, dict):
        item.id = str(obj.get("question_id", obj.get("id", item_id)))
        item.question = obj.get("question") if isinstance(obj.get("question"), str) else None
        item.answer = obj.get("answer") if isinstance(obj.get("answer"), str) else None
        try:
            item.duration = duration_value(obj.get("duration"))
        except ItemError:
            pass
    return item

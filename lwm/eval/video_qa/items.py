"""Video QA items: JSON objects (plain, or in Video-MME's field names) -> Items, from a JSON-lines file
or a .json list. The forms are in lwm.eval.video_qa's doc. A bad line or object is an Item with its
error, so the run records it and goes on."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from lwm.eval.video_qa.text import LETTERS, bare_question, normalize
from lwm.io import JsonlError, lines


class ItemError(ValueError):
    """An item that cannot be evaluated; `kind` groups the reasons in the summary."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class Item:
    id: str
    question: str | None = None
    answer: str | None = None
    options: list[str] | None = None  # texts without letter prefixes; None for an open question
    answer_index: int | None = None
    video: str | None = None  # a file path, resolved
    video_key: str | None = None  # a video id (videoID / vision): cached codes, or --video-dir/<id>.mp4
    duration: float | str | None = None  # seconds, or a bucket name as given
    task: str | None = None  # the question's kind (Video-MME's task_type, or kind), for a breakdown
    error: str | None = None  # set for an item that cannot be evaluated
    error_kind: str | None = None


_PREFIX = re.compile(r"^\s*\(?([A-Z])[.):]\s*(.*)$", re.S)
_LETTER = re.compile(r"^\s*\(?([A-Z])\)?[.:]?\s*$")


def parse_options(raw) -> list[str]:
    """A list of option texts (or {"A": text, ...}) -> texts without letter prefixes ("A. Red" -> "Red")."""
    if isinstance(raw, dict):
        keys = sorted(raw)
        if keys != list(LETTERS[: len(keys)]):
            raise ItemError("malformed", f"options given as a mapping must have the keys A, B, ...; got {keys}")
        raw = [raw[k] for k in keys]
    if not isinstance(raw, list) or not 2 <= len(raw) <= len(LETTERS):
        raise ItemError("malformed", f"options must be a list of 2 to 26 texts, got {raw!r}")
    if not all(isinstance(o, str) and o.strip() for o in raw):
        raise ItemError("malformed", f"every option must be non-empty text, got {raw!r}")
    prefixed = [_PREFIX.match(o) for o in raw]
    if all(m and m.group(1) == LETTERS[i] and m.group(2).strip() for i, m in enumerate(prefixed)):
        raw = [m.group(2) for m in prefixed]
    options = [o.strip() for o in raw]
    normalized = [normalize(o) for o in options]
    if len(set(normalized)) < len(normalized):
        raise ItemError("malformed", f"options are not distinct: {options}")
    return options


def answer_index(answer: str, options: list[str]) -> int:
    """The option an answer names: by its text ("Cyan.", "B. Cyan") or by its letter ("B", "B.", "(B)")."""
    target = normalize(answer)
    for i, o in enumerate(options):
        if target in (normalize(o), normalize(f"{LETTERS[i]}. {o}")):
            return i
    m = _LETTER.match(answer)
    if m and LETTERS.index(m.group(1)) < len(options):
        return LETTERS.index(m.group(1))
    shown = ", ".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    raise ItemError("answer", f"answer {answer!r} is not among the options ({shown})")


def _duration(value) -> float | str | None:
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


def parse_item(obj, item_id: str, base_dir: Path, video_dir: Path | None = None) -> Item:
    """One question (a JSON object) -> an Item; raises ItemError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ItemError("malformed", f"expected a JSON object, got {type(obj).__name__}")
    item = Item(id=str(obj.get("question_id", obj.get("id", item_id))))
    question, answer = obj.get("question"), obj.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ItemError("malformed", f"'question' must be non-empty text, got {question!r}")
    if not isinstance(answer, str) or not answer.strip():
        raise ItemError("malformed", f"'answer' must be non-empty text, got {answer!r}")
    item.question, item.answer = question.strip(), answer.strip()
    item.duration = _duration(obj.get("duration"))
    task = obj.get("task_type", obj.get("kind"))
    item.task = str(task).strip() if isinstance(task, (str, int)) and str(task).strip() else None
    if obj.get("options") is not None:
        item.options = parse_options(obj["options"])
        item.answer_index = answer_index(item.answer, item.options)
        item.question = bare_question(item.question, item.options)
    video = obj.get("video")
    key = obj.get("videoID", obj.get("vision"))
    if isinstance(video, str) and video.strip():
        path = Path(video.strip()).expanduser()
        item.video = str(path if path.is_absolute() else base_dir / path)
    elif isinstance(key, str) and key.strip():
        item.video_key = key.strip()
        if video_dir is not None:
            item.video = str(Path(video_dir) / f"{item.video_key}.mp4")
    else:
        raise ItemError("malformed", "no video: expected 'video' (a path) or 'videoID' (with --video-dir)")
    return item


def _bad(item_id: str, e: Exception, obj=None) -> Item:
    item = Item(id=item_id, error=str(e), error_kind=getattr(e, "kind", "malformed"))
    if isinstance(obj, dict):  # keep what can be kept, for the record
        item.id = str(obj.get("question_id", obj.get("id", item_id)))
        item.question = obj.get("question") if isinstance(obj.get("question"), str) else None
        item.answer = obj.get("answer") if isinstance(obj.get("answer"), str) else None
        try:
            item.duration = _duration(obj.get("duration"))
        except ItemError:
            pass
    return item


def expand(obj, item_id: str, base_dir: Path, video_dir: Path | None) -> list[Item]:
    """A question, or a Video-MME video with a list of questions (each inherits the video's fields)."""
    if isinstance(obj, dict) and isinstance(obj.get("questions"), list):
        shared = {k: v for k, v in obj.items() if k != "questions"}
        entries = [
            ({**shared, **q} if isinstance(q, dict) else q, f"{item_id}.{k + 1}")
            for k, q in enumerate(obj["questions"])
        ]
    else:
        entries = [(obj, item_id)]
    items = []
    for entry, eid in entries:
        try:
            items.append(parse_item(entry, eid, base_dir, video_dir))
        except ItemError as e:
            items.append(_bad(eid, e, entry))
    return items


def read_items(path, video_dir=None) -> list[Item]:
    """All items of a JSON-lines file (or a .json list); a bad line becomes an Item with its error."""
    path = Path(path)
    base, name = path.resolve().parent, path.name
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError:
            data = None
        if isinstance(data, list):
            return [it for k, obj in enumerate(data) for it in expand(obj, f"{name}:{k + 1}", base, video_dir)]
    items = []
    for line in lines(path):
        n = line.number
        try:
            obj = line.parse()
        except JsonlError as e:  # a bad line, the last one included, is a recorded item: the run goes on
            items.append(Item(id=f"{name}:{n}", error=f"line {n} is {e.reason}", error_kind="malformed"))
            continue
        items.extend(expand(obj, f"{name}:{n}", base, video_dir))
    return items

"""The benchmarks' files as released, each read by an adapter into Items (lwm.eval.video_qa.items):

  videomme        Video-MME. The Hugging Face parquet (videomme/test-00000-of-00001.parquet, one row a
                  question: video_id, duration, domain, sub_category, url, videoID, question_id, task_type,
                  question, options ["A. ...", ...], answer "C"), the same rows as JSON, or the GitHub JSON
                  (a list of videos: video_id, duration_category or duration, video_category,
                  video_sub_category or video_subcategory, url, questions [{question_id, task_type,
                  question, choices or options, answer}]). Videos: --video-dir/<videoID>.mp4 (.MP4, .mkv;
                  the GitHub form's videoID is read from its url); subtitles: <dir>/<videoID>.srt.
  longvideobench  LongVideoBench: lvb_val.json or the validation parquet (id, video_id, video_path,
                  subtitle_path, question, candidates or option0..option4 with "N/A" for none,
                  correct_choice, duration, duration_group, question_category, topic_category,
                  starting_timestamp_for_subtitles). Videos: --video-dir/<video_path> (default the data's
                  folder's videos/); subtitles: <dir>/<subtitle_path>.
  mlvu            MLVU: one task's JSON (json/1_plotQA.json: video, duration, question, candidates, answer
                  as text, question_type), or the json/ folder for every task. Videos:
                  --video-dir/<the file's stem>/<video> (default the json folder's ../video). The tasks
                  without candidates (sub_scene, summary) are scored by GPT-4 in MLVU: skipped here.
  jsonl           the plain form, JSON lines (or a .json list) of {video, question, options?, answer, duration?}.

The format is chosen by the file and its content, object by object (a line of JSON lines may be any
of the forms). A file none of whose entries is one of these is a FormatError, raised before any model
loads; a bad entry of a known format is an Item with its error and the metadata read so far."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from lwm.eval.video_qa.items import (
    Item,
    ItemError,
    answer_index,
    bad_item,
    check_unique_ids,
    duration_value,
    letter_index,
    parse_item,
    parse_options,
    strip_prefixes,
    text_field,
    video_file,
)
from lwm.io import JsonlError, lines

FORMATS = {
    "videomme": "Video-MME (the Hugging Face parquet videomme/test-*.parquet, or the GitHub JSON of videos with questions)",
    "longvideobench": "LongVideoBench (lvb_val.json, or its validation parquet)",
    "mlvu": "MLVU (a task's JSON, json/1_plotQA.json ..., or the json/ folder)",
    "jsonl": "JSON lines (or a .json list) of {video, question, options?, answer, duration?}",
}


class FormatError(ValueError):
    """A data file in none of the known formats; the message names the file and the formats."""

    def __init__(self, path, why: str):
        known = "; ".join(FORMATS.values())
        super().__init__(f"{path}: {why}; the formats known are: {known}")


# ------------------------------------------------------------------------------------ which form


def kind_of(obj) -> str | None:
    """Which adapter reads a JSON object, or None for none."""
    if not isinstance(obj, dict):
        return None
    keys = set(obj)
    if isinstance(obj.get("questions"), list) and keys & {"video_id", "url", "duration_category", "video_category"}:
        return "videomme"
    if {"videoID", "question_id", "task_type"} <= keys:
        return "videomme"
    if "video_path" in keys and keys & {"candidates", "option0"}:
        return "longvideobench"
    if "candidates" in keys and "video" in keys:
        return "mlvu"
    if "question" in keys or "answer" in keys or keys & {"video", "videoID", "vision"}:
        return "jsonl"
    return None


# ------------------------------------------------------------------------------------ Video-MME

VIDEOMME_OPTIONS = 4


def _youtube_id(url) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return None
    parsed = urlparse(url.strip())
    found = parse_qs(parsed.query).get("v")
    if found:
        return found[0]
    tail = parsed.path.rstrip("/").rsplit("/", 1)[-1]  # youtu.be/<id>, /shorts/<id>
    return tail or None


def videomme_item(row: dict, item_id: str, video_dir, subtitle_dir) -> Item:
    """One Video-MME question (a parquet row, or a GitHub question with its video's fields) -> an Item."""
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
        if subtitle_dir is not None:
            item.subtitles = str(Path(subtitle_dir) / f"{item.video_key}.srt")
        item.question, item.answer = text_field(row, "question"), text_field(row, "answer")
        if not isinstance(raw_options, list) or len(raw_options) != VIDEOMME_OPTIONS:
            n = len(raw_options) if isinstance(raw_options, list) else raw_options
            raise ItemError("options", f"Video-MME questions have {VIDEOMME_OPTIONS} options, got {n!r}")
        item.options = parse_options(raw_options, distinct=False)
        k = letter_index(item.answer, len(item.options))
        if k is None:
            raise ItemError("answer", f"answer {item.answer!r} is not an option letter A-D")
        item.answer_index = k
    except ItemError as e:
        return bad_item(item.id, e, partial=item)
    return item


def videomme_items(obj: dict, item_id: str, video_dir, subtitle_dir) -> list[Item]:
    """A Video-MME row, or a GitHub video with its questions (each inheriting the video's fields)."""
    if not isinstance(obj.get("questions"), list):
        return [videomme_item(obj, item_id, video_dir, subtitle_dir)]
    shared = {k: v for k, v in obj.items() if k != "questions"}
    out = []
    for k, q in enumerate(obj["questions"]):
        qid = f"{item_id}.{k + 1}"
        if not isinstance(q, dict):
            out.append(
                bad_item(qid, ItemError("malformed", f"a question must be a JSON object, got {type(q).__name__}"))
            )
            continue
        out.append(videomme_item({**shared, **q}, qid, video_dir, subtitle_dir))
    return out


# ------------------------------------------------------------------------------------ LongVideoBench

LVB_OPTIONS = (2, 5)


def lvb_item(row: dict, item_id: str, video_dir, subtitle_dir) -> Item:
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
        if subtitle_dir is not None and row.get("subtitle_path"):
            item.subtitles = str(Path(subtitle_dir) / str(row["subtitle_path"]))
            item.subtitle_offset = float(row.get("starting_timestamp_for_subtitles") or 0.0)
        item.question = text_field(row, "question")
        raw = row.get("candidates")
        if raw is None:
            raw = [row.get(f"option{i}") for i in range(5)]
            raw = [o for o in raw if o is not None and o != "N/A"]
        if not isinstance(raw, list) or not LVB_OPTIONS[0] <= len(raw) <= LVB_OPTIONS[1]:
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
        return bad_item(item.id, e, partial=item)
    return item


# ------------------------------------------------------------------------------------ MLVU


def mlvu_task(path: Path) -> str:
    """A task's file stem without its number: 1_plotQA -> plotQA."""
    return re.sub(r"^\d+_", "", path.stem)


def mlvu_item(obj: dict, item_id: str, source: Path, video_dir) -> Item:
    item = Item(id=str(obj.get("question_id", obj.get("id", item_id))), benchmark="mlvu")
    task = obj.get("question_type") or mlvu_task(source)
    item.meta = {k: obj.get(k) for k in ("video", "duration", "question_type", "candidates", "answer")}
    item.meta["task_file"] = source.name
    item.groups, item.task = {"task": str(task)}, str(task)
    item.question = obj.get("question") if isinstance(obj.get("question"), str) else None
    try:
        item.duration = duration_value(obj.get("duration"))
        name = text_field(obj, "video")
        folder = Path(video_dir) if video_dir is not None else source.parent.parent / "video"
        by_task = folder / source.stem / name
        item.video = str(by_task if by_task.is_file() or not (folder / name).is_file() else folder / name)
        item.video_key = Path(name).stem
        item.question, item.answer = text_field(obj, "question"), text_field(obj, "answer")
        raw = obj.get("candidates")
        if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(c, str) and c.strip() for c in raw):
            raise ItemError("options", f"MLVU candidates must be a list of at least 2 texts, got {raw!r}")
        item.options = [c.strip() for c in raw]
        item.answer_index = answer_index(item.answer, item.options, letters=False)  # MLVU's answers are texts
    except ItemError as e:
        return bad_item(item.id, e, partial=item)
    return item


def is_mlvu_generation(obj) -> bool:
    """MLVU's open tasks (sub_scene, summary): no candidates; MLVU scores them with GPT-4."""
    return isinstance(obj, dict) and "video" in obj and "candidates" not in obj and "question_type" in obj


# ------------------------------------------------------------------------------------ reading


class Reader:
    """Items from one data file or folder; `skipped` counts what is not evaluated here, by reason."""

    def __init__(self, video_dir=None, subtitle_dir=None):
        self.video_dir, self.subtitle_dir = video_dir, subtitle_dir
        self.skipped: dict[str, int] = {}
        self.formats: set[str] = set()

    def adapt(self, obj, item_id: str, source: Path) -> list[Item]:
        """One JSON object of any known form -> its items (a bad one: an Item with its error), each knowing
        where it was read (item_id, or item_id.k for a video's k-th question)."""
        items = self._adapt(obj, item_id, source)
        grouped = isinstance(obj, dict) and isinstance(obj.get("questions"), list)
        for k, item in enumerate(items):
            item.where = f"{item_id}.{k + 1}" if grouped else item_id
        return items

    def _adapt(self, obj, item_id: str, source: Path) -> list[Item]:
        kind = kind_of(obj)
        if kind is not None:
            self.formats.add(kind)
        if kind == "videomme":
            return videomme_items(obj, item_id, self.video_dir, self.subtitle_dir)
        if kind == "longvideobench":
            video_dir = self.video_dir if self.video_dir is not None else source.parent / "videos"
            return [lvb_item(obj, item_id, video_dir, self.subtitle_dir)]
        if kind == "mlvu":
            return [mlvu_item(obj, item_id, source, self.video_dir)]
        if isinstance(obj, dict) and isinstance(obj.get("questions"), list):  # the plain form, grouped by video
            shared = {k: v for k, v in obj.items() if k != "questions"}
            entries = [(q if not isinstance(q, dict) else {**shared, **q}, f"{item_id}.{k + 1}")
                       for k, q in enumerate(obj["questions"])]  # fmt: skip
        else:
            entries = [(obj, item_id)]
        out = []
        for entry, eid in entries:
            try:
                out.append(parse_item(entry, eid, source.resolve().parent, self.video_dir))
            except ItemError as e:
                out.append(bad_item(eid, e, entry))
        return out

    def _one(self, obj, item_id: str, source: Path) -> list[Item]:
        if is_mlvu_generation(obj):
            why = "MLVU generation tasks (no candidates; MLVU scores them with GPT-4)"
            self.skipped[why] = self.skipped.get(why, 0) + 1
            return []
        return self.adapt(obj, item_id, source)

    def _objects(self, objects, name: str, source: Path) -> list[Item]:
        return [it for k, obj in enumerate(objects) for it in self._one(obj, f"{name}:{k + 1}", source)]

    def read(self, path) -> list[Item]:
        """The items of a data file or folder; raises FormatError (no known format) or DuplicateIdError (an
        id given twice, which every benchmark's items are checked for here)."""
        items = self._read(Path(path))
        check_unique_ids(items)
        return items

    def _read(self, path: Path) -> list[Item]:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".json", ".jsonl", ".parquet"))
            if not files:
                raise FormatError(path, "a folder with no .json, .jsonl or .parquet files")
            return [it for f in files for it in self._read(f)]
        head = path.read_bytes()[:4] if path.is_file() else b""
        if path.suffix.lower() == ".parquet" or head == b"PAR1":
            return self._parquet(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise FormatError(path, "not UTF-8 text and not a parquet file") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, list):
            if not any(kind_of(o) or is_mlvu_generation(o) for o in data):
                raise FormatError(path, "a JSON list none of whose entries is a question or a video with questions")
            return self._objects(data, path.name, path)
        if isinstance(data, dict) and kind_of(data) is None:
            raise FormatError(path, f"a JSON object with the keys {sorted(data)[:12]}")
        return self._jsonl(path)

    def _jsonl(self, path: Path) -> list[Item]:
        items, good = [], 0
        for line in lines(path):
            n = line.number
            try:
                obj = line.parse()
            except JsonlError as e:  # a bad line, the last one included, is a recorded item: the run goes on
                where = f"{path.name}:{n}"
                items.append(Item(id=where, error=f"line {n} is {e.reason}", error_kind="malformed", where=where))
                continue
            good += kind_of(obj) is not None or is_mlvu_generation(obj)
            items.extend(self._one(obj, f"{path.name}:{n}", path))
        if not good:
            raise FormatError(path, "no line is a JSON object of a question")
        return items

    def _parquet(self, path: Path) -> list[Item]:
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except Exception as e:
            raise FormatError(path, f"cannot read as parquet ({type(e).__name__}: {e})") from e
        columns = set(table.column_names)
        rows = table.to_pylist()
        sample = {c: None for c in columns}
        if kind_of(sample) not in ("videomme", "longvideobench", "mlvu"):
            raise FormatError(path, f"a parquet file with the columns {sorted(columns)}")
        return self._objects(rows, path.name, path)


def read_items(path, video_dir=None, subtitles=None) -> list[Item]:
    """All items of a data file (or MLVU's json/ folder) in any known format; raises FormatError when the
    file is in none of them, DuplicateIdError when an id is given twice. Bad entries are Items with their
    errors."""
    return Reader(video_dir, subtitles).read(path)


__all__ = ["FORMATS", "FormatError", "Reader", "read_items", "kind_of", "strip_prefixes"]

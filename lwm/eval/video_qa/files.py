"""A data file or folder -> Items (lwm.eval.video_qa.items): the benchmarks' files as released and the
plain form, each object read by the benchmark whose entry it is (lwm.eval.video_qa.benchmarks).

Files: JSON (a list, or one object), JSON lines (a line may be of any form), parquet (its columns must be
a benchmark's), or a folder of such files (.json, .jsonl, .parquet), read in name order. A file none of
whose entries is of a known form is a FormatError, raised before any model loads; a bad entry of a known
form is an Item with its error and what could be read of it. Every run's ids are checked to be unique."""

from __future__ import annotations

import json
from pathlib import Path

from lwm.eval.video_qa.benchmarks import BENCHMARKS, benchmark_of, read_entry, skipped
from lwm.eval.video_qa.items import Item, check_unique_ids, confine_video
from lwm.io import JsonlError, lines


class FormatError(ValueError):
    """A data file in none of the known formats; the message names the file and the formats."""

    def __init__(self, path, why: str):
        known = "; ".join(b.files for b in BENCHMARKS)
        super().__init__(f"{path}: {why}; the formats known are: {known}")


class Reader:
    """Items from one data file or folder; `skipped` counts what is not evaluated here, by reason."""

    def __init__(self, video_dir=None, subtitle_dir=None):
        self.video_dir, self.subtitle_dir = video_dir, subtitle_dir
        self.skipped: dict[str, int] = {}

    def adapt(self, obj, item_id: str, source: Path) -> list[Item]:
        """One JSON object of any known form -> its items (a bad one: an Item with its error), each knowing
        where it was read (item_id, or item_id.k for a video's k-th question)."""
        items = read_entry(obj, item_id, source, self.video_dir, self.subtitle_dir)
        grouped = isinstance(obj, dict) and isinstance(obj.get("questions"), list)
        for k, item in enumerate(items):
            item.where = f"{item_id}.{k + 1}" if grouped else item_id
            confine_video(item)  # before anything opens it: a failure of its own, the batch goes on
        return items

    def _one(self, obj, item_id: str, source: Path) -> list[Item]:
        why = skipped(obj)
        if why is not None:
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
            if not any(benchmark_of(o) or skipped(o) for o in data):
                raise FormatError(path, "a JSON list none of whose entries is a question or a video with questions")
            return self._objects(data, path.name, path)
        if isinstance(data, dict) and benchmark_of(data) is None:
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
            good += benchmark_of(obj) is not None or skipped(obj) is not None
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
        known = benchmark_of({c: None for c in columns})
        if known is None or not known.parquet:
            raise FormatError(path, f"a parquet file with the columns {sorted(columns)}")
        return self._objects(rows, path.name, path)


def read_items(path, video_dir=None, subtitles=None) -> list[Item]:
    """All items of a data file (or a folder of them) in any known format; raises FormatError when the
    file is in none of them, DuplicateIdError when an id is given twice. Bad entries are Items with their
    errors."""
    return Reader(video_dir, subtitles).read(path)

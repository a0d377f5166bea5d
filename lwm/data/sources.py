"""Reading the examples of one data source by number: JSON lines, or parquet (the form Hugging Face
datasets are published in), chosen by the file's extension.

    reader = open_source(path)          # .jsonl/.json: JSON lines; .parquet: read by row groups
    reader.scan()                       # the first pass: JSON lines find their byte offsets (a full read)
    len(reader); reader.example(i)      # the i-th example as a dict; raises SourceError naming its place
    reader.where(i)                     # "path:line" (JSON lines, from 1) or "path:row i" (parquet, from 0)

A JSON-lines reader whose offsets are known (a source's index keeps them) reads line i with one seek.
A parquet reader reads the row group holding row i and keeps the last few groups read; a null column of
a row is a missing field, as an absent key is in a JSON line. Reading is lazy and per process: a reader
copied into a loader worker opens its own file.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

import numpy as np

from lwm.io import JsonlError, LineIndex, read_lines

JSONL = (".jsonl", ".json")
PARQUET = (".parquet",)
GROUPS_KEPT = 4  # row groups a parquet reader keeps decoded (a shuffled epoch reads rows in any order)


class SourceError(ValueError):
    """An example that cannot be read: `where` names its file and line or row, `reason` says why."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def source_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in JSONL:
        return "jsonl"
    if suffix in PARQUET:
        return "parquet"
    raise ValueError(f"data source {path}: expected a JSON-lines ({', '.join(JSONL)}) or parquet (.parquet) file")


class JsonlSource:
    """A JSON-lines file: its non-blank lines, a partial last line dropped (lwm.io.read_lines)."""

    format = "jsonl"

    def __init__(self, path: Path, max_line_bytes: int | None, lines: LineIndex | None = None):
        self.path, self.max_line_bytes, self.lines = path, max_line_bytes, lines

    def scan(self) -> None:
        if self.lines is None:
            self.lines = read_lines(self.path, self.max_line_bytes)

    def __len__(self) -> int:
        return len(self.lines)

    def where(self, i: int) -> str:
        return f"{self.path}:{int(self.lines.numbers[i])}"

    def example(self, i: int):
        try:
            return self.lines[i].parse()
        except JsonlError as e:
            raise SourceError(self.where(i), e.reason) from None

    def examples(self, start: int, stop: int) -> Iterator[tuple[int, object]]:
        """(i, the example or its SourceError) for i in [start, stop), read in one pass of the file."""
        for i, line in zip(range(start, stop), self.lines[start:stop]):
            try:
                yield i, line.parse()
            except JsonlError as e:
                yield i, SourceError(self.where(i), e.reason)

    def places(self) -> dict[str, np.ndarray]:
        """What an index keeps so that no later start reads the whole file again."""
        oversize = self.lines.oversize
        return {
            "offsets": self.lines.offsets,
            "numbers": self.lines.numbers,
            "oversize_offsets": np.fromiter(oversize.keys(), np.int64, len(oversize)),
            "oversize_sizes": np.fromiter(oversize.values(), np.int64, len(oversize)),
        }

    @classmethod
    def from_places(cls, path: Path, max_line_bytes: int | None, places) -> "JsonlSource":
        oversize = dict(zip(places["oversize_offsets"].tolist(), places["oversize_sizes"].tolist()))
        lines = LineIndex(path, places["offsets"], places["numbers"], max_line_bytes, oversize)
        return cls(path, max_line_bytes, lines)


class ParquetSource:
    """A parquet file read by row groups; row i is the i-th row of the file."""

    format = "parquet"

    def __init__(self, path: Path):
        self.path = path
        self._file, self._pid = None, None
        self._groups: OrderedDict[int, list | SourceError] = OrderedDict()
        meta = self._parquet().metadata
        counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])  # (groups + 1,) first row of each

    def __getstate__(self) -> dict:  # a spawned loader worker opens the file itself
        return {**self.__dict__, "_file": None, "_pid": None, "_groups": OrderedDict()}

    def _parquet(self):
        if self._pid != os.getpid():  # a loader worker opens its own file, never its parent's
            import pyarrow.parquet as pq

            try:
                self._file = pq.ParquetFile(self.path)
            except Exception as e:  # noqa: BLE001 (pyarrow raises several kinds for a file that is not parquet)
                raise ValueError(f"data source {self.path} cannot be read as parquet ({type(e).__name__}: {e})") from e
            self._pid, self._groups = os.getpid(), OrderedDict()
        return self._file

    def scan(self) -> None:
        pass  # the row counts are in the file's footer

    def __len__(self) -> int:
        return int(self.starts[-1])

    def where(self, i: int) -> str:
        return f"{self.path}:row {i}"

    def _group(self, g: int) -> list | SourceError:
        """Row group g as one dict per row (null columns left out), or the error that stops reading it."""
        parquet = self._parquet()  # first: a new process starts with no groups
        groups = self._groups
        if g not in groups:
            try:
                rows = parquet.read_row_group(g).to_pylist()
                groups[g] = [{k: v for k, v in row.items() if v is not None} for row in rows]
            except Exception as e:  # noqa: BLE001 (a damaged group: its rows are skipped, each named)
                groups[g] = SourceError(f"{self.path}:row group {g}", f"cannot be read ({type(e).__name__}: {e})")
            if len(groups) > GROUPS_KEPT:
                groups.popitem(last=False)
        groups.move_to_end(g)
        return groups[g]

    def example(self, i: int):
        g = int(np.searchsorted(self.starts, i, side="right")) - 1
        rows = self._group(g)
        if isinstance(rows, SourceError):
            raise SourceError(self.where(i), f"its row group {g} {rows.reason}")
        return rows[i - int(self.starts[g])]

    def examples(self, start: int, stop: int) -> Iterator[tuple[int, object]]:
        for i in range(start, stop):
            try:
                yield i, self.example(i)
            except SourceError as e:
                yield i, e

    def places(self) -> dict[str, np.ndarray]:
        return {}

    @classmethod
    def from_places(cls, path: Path, max_line_bytes: int | None, places) -> "ParquetSource":
        return cls(path)


def open_source(path: str | Path, max_line_bytes: int | None = None, places=None) -> JsonlSource | ParquetSource:
    """The reader of a source file; `places`: what its index kept (no scan is needed then)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data source {path} does not exist")
    kind = JsonlSource if source_format(path) == "jsonl" else ParquetSource
    if places is not None:
        return kind.from_places(path, max_line_bytes, places)
    return kind(path, max_line_bytes) if kind is JsonlSource else kind(path)

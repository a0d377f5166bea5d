"""Reading the examples of one data source by number: JSON lines, or parquet (the form Hugging Face
datasets are published in), chosen by the file's extension.

    reader = open_source(path)          # .jsonl/.json: JSON lines; .parquet: read by row groups
    reader.scan()                       # the first pass: JSON lines find their byte offsets (a full read)
    len(reader); reader.example(i)      # the i-th example as a dict; raises SourceError naming its place
    reader.where(i)                     # "path:line" (JSON lines, from 1) or "path:row i" (parquet, from 0)

A JSON-lines reader whose offsets are known (a source's index keeps them) reads line i with one seek.
A parquet reader reads the row group holding row i and keeps the last few groups read; a null column of
a row is a missing field, as an absent key is in a JSON line. max_line_bytes bounds a row as it bounds a
line: a row whose cells hold more is skipped, never made into Python objects, and a row group whose
uncompressed size is over GROUP_LINES times it is skipped unread (the footer says its size). Reading is lazy and per process: a reader
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
GROUP_LINES = 16  # a row group is read whole: up to this many of max_line_bytes (1 GiB with the default)


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

    def __init__(self, path: Path, max_line_bytes: int | None = None):
        self.path, self.max_line_bytes = path, max_line_bytes
        self._file, self._pid = None, None
        self._groups: OrderedDict[int, list | SourceError] = OrderedDict()
        meta = self._parquet().metadata
        counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self.group_bytes = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]  # uncompressed
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])  # (groups + 1,) first row of each

    def __getstate__(self) -> dict:  # a spawned loader worker opens the file itself
        return {**self.__dict__, "_file": None, "_pid": None, "_groups": OrderedDict()}

    def _parquet(self):
        if self._pid != os.getpid():  # a loader worker opens its own file, never its parent's
            self._file = parquet_file(self.path)
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
            bound = self.max_line_bytes
            if bound is not None and self.group_bytes[g] > GROUP_LINES * bound:
                groups[g] = SourceError(
                    f"{self.path}:row group {g}",
                    f"holds {self.group_bytes[g]} bytes uncompressed, more than {GROUP_LINES} x max_line_bytes "
                    f"{bound}: not read",
                )
            else:
                try:
                    groups[g] = self._rows(parquet.read_row_group(g), int(self.starts[g]))
                except Exception as e:  # noqa: BLE001 (a damaged group: its rows are skipped, each named)
                    groups[g] = SourceError(f"{self.path}:row group {g}", f"cannot be read ({type(e).__name__}: {e})")
            if len(groups) > GROUPS_KEPT:
                groups.popitem(last=False)
        groups.move_to_end(g)
        return groups[g]

    def _rows(self, table, first: int) -> list:
        """A row group's rows as dicts (null columns left out); a row over max_line_bytes as its SourceError,
        measured on its Arrow buffers and never converted."""
        bound = self.max_line_bytes
        sizes = [table.slice(r, 1).nbytes for r in range(table.num_rows)] if bound is not None else []
        big = {r for r, size in enumerate(sizes) if size > bound}
        keep = [r for r in range(table.num_rows) if r not in big]
        decoded = iter(table.take(keep).to_pylist() if big else table.to_pylist())
        return [
            SourceError(
                self.where(first + r), f"a row of {sizes[r]} bytes, longer than max_line_bytes {bound}: not read"
            )
            if r in big
            else {k: v for k, v in next(decoded).items() if v is not None}
            for r in range(table.num_rows)
        ]

    def example(self, i: int):
        g = int(np.searchsorted(self.starts, i, side="right")) - 1
        rows = self._group(g)
        if isinstance(rows, SourceError):
            raise SourceError(self.where(i), f"its row group {g} {rows.reason}")
        row = rows[i - int(self.starts[g])]
        if isinstance(row, SourceError):
            raise row
        return row

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
        return cls(path, max_line_bytes)


def parquet_file(path: Path):
    """The pyarrow ParquetFile of `path` (its footer read); ValueError naming the file when it is not one
    (truncated, damaged, another format)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 (pyarrow raises several kinds for a file that is not parquet)
        raise ValueError(f"data source {path} cannot be read as parquet ({type(e).__name__}: {e})") from None


def check_readable(path: str | Path) -> None:
    """Before any work: a parquet source whose footer cannot be read (truncated, damaged) raises ValueError
    naming it. JSON lines need no check: a bad line is skipped and counted."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() in PARQUET:
        parquet_file(path)


def open_source(path: str | Path, max_line_bytes: int | None = None, places=None) -> JsonlSource | ParquetSource:
    """The reader of a source file; `places`: what its index kept (no scan is needed then)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data source {path} does not exist")
    kind = JsonlSource if source_format(path) == "jsonl" else ParquetSource
    if places is not None:
        return kind.from_places(path, max_line_bytes, places)
    return kind(path, max_line_bytes)

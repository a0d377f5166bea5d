"""Reading the examples of one data source by number: JSON lines, one JSON array (a .json whose first
byte is "[", as conversation sets are published), parquet (the form Hugging Face datasets are published
in), a CSV / TSV table with a header row (caption tables), or a webdataset tar shard (lwm.data.shards),
chosen by the file's extension.

    reader = open_source(path)          # .jsonl/.json: JSON lines; .parquet: read by row groups
    reader.scan()                       # the first pass: JSON lines find their byte offsets (a full read)
    len(reader); reader.example(i)      # the i-th example as a dict; raises SourceError naming its place
    reader.where(i)                     # "path:line" (JSON lines, tables: from 1), "path:row i", "path:element i",
                                        # "path:sample i"

A JSON-lines reader whose offsets are known (a source's index keeps them) reads line i with one seek.
A parquet reader reads the row group holding row i and keeps the last few groups read; a null column of
a row is a missing field, as an absent key is in a JSON line. max_line_bytes bounds a row as it bounds a
line: a row whose cells hold more is skipped, never made into Python objects, and a row group whose
uncompressed size is over GROUP_LINES times it is skipped unread (the footer says its size). Reading is lazy and per process: a reader
copied into a loader worker opens its own file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

import numpy as np

from lwm.data.shards import TAR, TarSource
from lwm.data.spans import SourceError, SpanSource
from lwm.io import JsonlError, LineIndex, read_lines

JSONL = (".jsonl", ".json")
PARQUET = (".parquet",)
TABLES = {".csv": ",", ".tsv": "\t"}  # extension -> the cells' delimiter
HEADER_BYTES = 1 << 20  # a table's header row is read whole: at most this long
FORMATS = (
    f"a JSON-lines ({', '.join(JSONL)}), parquet (.parquet), table ({', '.join(TABLES)}: a header row, then "
    "a row an example) or webdataset shard (.tar) file"
)
GROUPS_KEPT = 4  # row groups a parquet reader keeps decoded (a shuffled epoch reads rows in any order)
GROUP_LINES = 16  # a row group is read whole: up to this many of max_line_bytes (1 GiB with the default)


def source_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in JSONL:
        return "jsonl"
    if suffix in PARQUET:
        return "parquet"
    if suffix in TABLES:
        return "table"
    if suffix in TAR:
        return "tar"
    raise ValueError(f"data source {path}: expected {FORMATS}")


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


class TableSource(SpanSource):
    """A CSV or TSV file whose first row names its columns: row i (from 0, the header not counted) as a
    dict of its cells by column, an empty cell a missing field (as a null parquet cell is). A row may span
    lines (a quoted cell holding newlines); it is named by the line it starts on."""

    format = "table"
    KEPT = ("offsets", "sizes", "numbers")

    def __init__(self, path: Path, max_line_bytes: int | None = None, places=None):
        super().__init__(path, max_line_bytes, places)
        self.delimiter = TABLES[path.suffix.lower()]
        self.columns, self._body = table_header(path)  # the names, where the first row starts

    def _spans(self) -> tuple[np.ndarray, ...]:
        with open(self.path, "rb") as f:
            header_lines = f.read(self._body).count(b"\n")
        return _table_rows(self.path, self._body, header_lines)

    def where(self, i: int) -> str:
        return f"{self.path}:{int(self.spans['numbers'][i])}"

    def _parse(self, raw: bytes, i: int) -> dict:
        try:
            text = raw.decode("utf-8")
            rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=self.delimiter, strict=True))
        except UnicodeDecodeError as e:
            raise SourceError(self.where(i), f"not UTF-8 ({e.reason} at byte {e.start})") from None
        except csv.Error as e:
            raise SourceError(self.where(i), f"not a table row ({e})") from None
        if len(rows) != 1:
            raise SourceError(self.where(i), "a quoted cell is not closed, or the file changed since it was read")
        cells = rows[0]
        if len(cells) != len(self.columns):
            raise SourceError(self.where(i), f"has {len(cells)} cells; the header names {len(self.columns)} columns")
        return {name: cell for name, cell in zip(self.columns, cells) if cell != ""}


def table_header(path: Path) -> tuple[list[str], int]:
    """(the column names, the byte offset after the header row) of a CSV or TSV file; ValueError naming
    the file when it has no header, an empty or repeated column name, or a header over HEADER_BYTES."""
    delimiter = TABLES[path.suffix.lower()]
    with open(path, "rb") as f:
        ends, size, _ = _record_end(f)
        if ends is None:
            raise ValueError(f"data source {path} is empty: a table's first row names its columns")
        if size > HEADER_BYTES:
            raise ValueError(f"data source {path}: its header row is {size} bytes, more than {HEADER_BYTES}")
        f.seek(0)
        text = f.read(size).decode("utf-8-sig", errors="replace")
    names = next(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter), [])
    if not names or any(not n.strip() for n in names) or len(set(names)) != len(names):
        raise ValueError(f"data source {path}: its header row must name each column once, got {names}")
    return names, size


def _record_end(f) -> tuple[int | None, int, bool]:
    """From f's position, one record (its lines until the quotes balance), read in pieces and never held:
    (the lines it spans, None at the end of the file; its size in bytes; whether it is blank)."""
    size, lines, quotes, blank = 0, 0, 0, True
    while True:
        piece = f.readline(1 << 16)
        if not piece:
            return (None if size == 0 else lines + 1), size, blank
        size += len(piece)
        quotes += piece.count(b'"')
        blank = blank and not piece.strip()
        if piece.endswith(b"\n"):
            lines += 1
            if quotes % 2 == 0:
                return lines, size, blank


def _table_rows(path: Path, start: int, line: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's byte offset, size and first line number (from 1), blank lines left out."""
    offsets, sizes, numbers = [], [], []
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        while (got := _record_end(f))[0] is not None:
            spanned, size, blank = got
            if not blank:
                offsets.append(offset)
                sizes.append(size)
                numbers.append(line + 1)
            offset += size
            line += spanned
    return tuple(np.asarray(x, np.int64) for x in (offsets, sizes, numbers))


class ArraySource(SpanSource):
    """A JSON file holding one array (as LLaVA, LLaVA-Video and Video-ChatGPT publish their sets): element
    i as example i, its span found without parsing it (array_elements); one cut short (a truncated file)
    is skipped naming it."""

    format = "array"

    def _spans(self) -> tuple[np.ndarray, ...]:
        return array_elements(self.path)

    def where(self, i: int) -> str:
        return f"{self.path}:element {i}"  # from 0, as parquet's rows

    def _parse(self, raw: bytes, i: int):
        try:
            return json.loads(raw)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            raise SourceError(self.where(i), f"not JSON ({e})") from None


def is_json_array(path: Path) -> bool:
    """Whether a .json file holds an array (its first byte that is not white space is "["), not JSON lines."""
    with open(path, "rb") as f:
        while piece := f.read(4096):
            if stripped := piece.lstrip():
                return stripped.startswith(b"[")
    return False


_OUTSIDE = re.compile(rb'["\[\]{},]')  # what changes the state outside strings
_INSIDE = re.compile(rb'["\\]')  # inside a string: its end, or an escape


def array_elements(path: Path, piece_bytes: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, sizes) of the elements of the JSON array in `path`, each span from after the "[" or ","
    before it to the "," or "]" after it (white space included: json.loads takes it), found by tracking
    strings, escapes and nesting in pieces of piece_bytes; an element the file ends inside runs to its end."""
    offsets, sizes = [], []
    depth, in_string, escaped, start, content, done = 0, False, False, None, False, False
    with open(path, "rb") as f:
        base = 0
        while not done and (piece := f.read(piece_bytes)):
            at, escaped = (1 if escaped else 0), False  # an escape at the end of the last piece skips a byte
            while at < len(piece):
                if in_string:
                    m = _INSIDE.search(piece, at)
                    if m is None:
                        break
                    if m.group() == b"\\":
                        at = m.end() + 1
                        escaped = at > len(piece)
                    else:
                        in_string, at = False, m.end()
                    continue
                m = _OUTSIDE.search(piece, at)
                if depth == 1 and piece[at : m.start() if m else len(piece)].strip():
                    content = True  # a number, true, false or null at the top level
                if m is None:
                    break
                c, pos, at = m.group(), base + m.start(), m.end()
                if c == b'"':
                    in_string, content = True, content or depth >= 1
                elif c in b"[{":
                    depth += 1
                    if depth == 1:
                        start, content = pos + 1, False
                    else:
                        content = True
                elif c in b"]}":
                    depth -= 1
                    if depth == 0:
                        if content:
                            offsets.append(start)
                            sizes.append(pos - start)
                        done = True
                        break
                elif depth == 1:  # the comma after an element
                    offsets.append(start)
                    sizes.append(pos - start)
                    start, content = pos + 1, False
            base += len(piece)
    if not done and start is not None and content:  # the file ends inside the array: cut short, its read says so
        offsets.append(start)
        sizes.append(base - start)
    return np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)


def parquet_file(path: Path):
    """The pyarrow ParquetFile of `path` (its footer read); ValueError naming the file when it is not one
    (truncated, damaged, another format)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 (pyarrow raises several kinds for a file that is not parquet)
        raise ValueError(f"data source {path} cannot be read as parquet ({type(e).__name__}: {e})") from None


def check_readable(path: str | Path) -> None:
    """Before any work: a parquet source whose footer cannot be read (truncated, damaged), or a table whose
    header row does not name its columns, raises ValueError naming it. JSON lines need no check: a bad
    line is skipped and counted, as a bad table row is."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() in PARQUET:
        parquet_file(path)
    if path.is_file() and path.suffix.lower() in TABLES:
        table_header(path)


def schema_columns(path: str | Path) -> list[str] | None:
    """The columns every record of a table or parquet source has (its header, its schema); None for JSON and
    tar shards, whose records each name their own keys, and for a file that is not there (refused elsewhere)."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.suffix.lower() in TABLES:
        return table_header(path)[0]
    if path.suffix.lower() in PARQUET:
        return list(parquet_file(path).schema_arrow.names)
    return None


def check_columns(path: str | Path, columns) -> None:
    """ValueError naming the first of `columns` that a table's header or a parquet schema lacks (JSON and tar
    records name their own keys: nothing to check before reading them)."""
    have = schema_columns(path)
    missing = [c for c in columns if have is not None and c not in have]
    if missing:
        raise ValueError(f"{path} has no column {missing[0]!r} (its columns: {have})")


def first_records(path: str | Path, count: int = 100, read_bytes: int = 1 << 18) -> list[dict] | None:
    """The first records of a JSON-lines or JSON-array source that parse as objects (up to `count`, from about
    its first `read_bytes`: a line begun before them is read whole, an element cut by them is not), read
    before any work; None for a source of another kind."""
    if not Path(path).is_file() or Path(path).suffix.lower() not in JSONL:
        return None  # not there (refused elsewhere), a folder, or another kind
    records = []
    with open(path, "rb") as f:
        if source_kind(path) == "jsonl":
            while len(records) < count and f.tell() < read_bytes and (line := f.readline(read_bytes)):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
            return [r for r in records if isinstance(r, dict)]
        text, decoder = f.read(read_bytes).decode("utf-8", errors="ignore"), json.JSONDecoder()
    i = text.index("[") + 1
    while len(records) < count:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except ValueError:  # the array's end, or an element cut by read_bytes
            break
        records.append(record)
    return [r for r in records if isinstance(r, dict)]


def check_record_keys(path: str | Path, columns, unless: str | None = None) -> None:
    """ValueError naming the first of `columns` that none of a JSON source's first records holds (a misspelt
    column, which would skip every record as it is read): its records name their own keys, so these are the
    check a table's header gets. unless: records holding this key are not asked (an example's own "fields"
    spec replaces the source's). Nothing is said where no such record is among the first."""
    records = [r for r in first_records(path) or () if unless is None or unless not in r]
    if not records:
        return
    for column in columns:
        if not any(column in r for r in records):
            keys = sorted({k for r in records for k in r})
            raise ValueError(
                f"{path}: none of its first {len(records)} records has a field {column!r} (they have {keys})"
            )


def source_kind(path: str | Path) -> str:
    """source_format, with a .json holding one array told apart from JSON lines by its first byte."""
    kind = source_format(path)
    return "array" if kind == "jsonl" and Path(path).suffix.lower() == ".json" and is_json_array(path) else kind


def open_source(path: str | Path, max_line_bytes: int | None = None, places=None):
    """The reader of a source file; `places`: what its index kept (no scan is needed then)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data source {path} does not exist")
    kinds = {
        "jsonl": JsonlSource,
        "array": ArraySource,
        "parquet": ParquetSource,
        "table": TableSource,
        "tar": TarSource,
    }
    kind = kinds[source_kind(path)]
    if places is not None:
        return kind.from_places(path, max_line_bytes, places)
    return kind(path, max_line_bytes)

"""JSON lines: the one reader and appender of the project's .jsonl files (lwm-tokenize's manifests and
failures, video indexes, data sources, haystacks, evaluation records).

    for record in read_jsonl(path): ...          # the values, one per non-blank line
    for n, record in records(path): ...          # with their line numbers, streamed
    index = read_lines(path); index[i].parse()   # random access: byte offsets, 16 bytes a line
    read_lines(path, max_line_bytes=2**26)       # longer lines are counted, never held (parse says so)
    with JsonlAppender(path) as out:             # or append_jsonl(path, record) for one
        out.append(record)

A killed writer leaves at most its last line cut short. The reader skips such a leftover: a last
line without its newline that does not parse, or, where a later append has started a fresh line
after it, a line that is a JSON object or array cut short (a proper prefix of one). Any other line
that is not JSON is an error naming the file and line (JsonlError). Callers that record a bad line
as a failed item and go on (lwm/eval/video_qa/) take the raw lines (`lines`) and parse each one.

Nothing here keeps a Python object per line: a data source of millions of lines is an index of byte
offsets (LineIndex), and each line is read from the file when it is wanted.

A full disk is NoSpaceLeft naming the file (lwm.disk.writes, where every write that must not be left
half done lives).
"""

from __future__ import annotations

import json
import logging
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np

from lwm.disk.writes import writes_to

log = logging.getLogger(__name__)


class JsonlError(ValueError):
    """A line that is not JSON: `path:line: reason`."""

    def __init__(self, path: str | Path, line: int, reason: str):
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = Path(path), line, reason


@dataclass(frozen=True, slots=True)
class Line:
    """One non-blank line of a JSON-lines file, not parsed yet."""

    path: Path
    number: int  # 1-based; blank lines count
    raw: bytes  # without its newline (empty for a line over the limit: it is never held)
    terminated: bool  # False only for a last line without a newline
    offset: int = 0  # of its first byte in the file
    oversize: int = 0  # a line longer than the reader's limit: its length in bytes (newline not counted)
    limit: int | None = None  # the reader's max_line_bytes

    def parse(self) -> Any:
        if self.oversize:
            raise JsonlError(
                self.path,
                self.number,
                f"a line of {self.oversize} bytes, longer than max_line_bytes {self.limit}: not read",
            )
        try:  # a BOM is allowed at the start of the file (editors write one)
            text = self.raw.decode("utf-8-sig" if self.number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise JsonlError(self.path, self.number, f"not UTF-8: {e.reason} at byte {e.start}") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise JsonlError(self.path, self.number, f"not JSON: {e.msg} (column {e.pos + 1})") from None

    def leftover(self) -> bool:
        """Whether this line, which does not parse, is what a killed writer left: the unterminated last
        line, or a record cut short that a later append closed with its fresh line."""
        if not self.terminated:
            return True
        try:
            return _cut_short(self.raw.decode("utf-8", errors="replace"))
        except RecursionError:
            return False


READ_CHUNK = 1 << 20  # bytes one read asks for: a line is read piece by piece, so one over the limit is never held


def _next_line(f: BinaryIO, limit: int | None) -> tuple[bytes | None, int, bool, bool] | None:
    """The next line of `f` from where it stands: (its bytes with the newline, or None when it is longer
    than `limit` bytes without the newline; its size with the newline; whether it ends in one; whether it
    is blank), None at the end of the file. Read READ_CHUNK bytes at a time: at most limit + 1 +
    READ_CHUNK bytes of a line are held, however long it is (None: no limit, the whole line)."""
    piece = f.readline(READ_CHUNK)
    if not piece:
        return None
    pieces: list[bytes] | None = [piece]
    size, blank = len(piece), piece.isspace()
    while not piece.endswith(b"\n"):
        piece = f.readline(READ_CHUNK)
        if not piece:
            break
        size, blank = size + len(piece), blank and piece.isspace()
        if pieces is not None:
            pieces.append(piece)
            if limit is not None and size > limit + 1:
                pieces = None  # too long whatever follows: counted on, no longer held
    terminated = piece.endswith(b"\n")
    if limit is not None and size - terminated > limit:
        pieces = None
    raw = None if pieces is None else pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return raw, size, terminated, blank


def lines(path: str | Path, max_line_bytes: int | None = None) -> Iterator[Line]:
    """The non-blank lines of a JSON-lines file, in order (split at "\\n" only, like the format). A line
    longer than `max_line_bytes` (without its newline) comes without its bytes, with its length in
    `oversize`: it is never read into memory whole (its parse raises JsonlError saying so)."""
    path = Path(path)
    with open(path, "rb") as f:
        offset, number = 0, 0
        while (got := _next_line(f, max_line_bytes)) is not None:
            raw, size, terminated, blank = got
            number += 1
            if not blank:
                yield _line(path, number, offset, raw, size, terminated, max_line_bytes)
            offset += size


def _line(path: Path, number: int, offset: int, raw: bytes | None, size: int, terminated: bool, limit) -> Line:
    """The Line read as `_next_line` gives it (raw None: over the limit)."""
    if raw is None:
        return Line(path, number, b"", terminated, offset, oversize=size - terminated, limit=limit)
    return Line(path, number, raw[:-1] if terminated else raw, terminated, offset, limit=limit)


class LineIndex(Sequence):
    """The non-blank lines of a JSON-lines file as byte offsets and line numbers, 16 bytes a line and no
    Python object per line: `index[i]` reads line i from the file (a Line), a slice is an index too.
    A line longer than `max_line_bytes` is read back without its bytes (Line.oversize): the lengths of
    such lines are kept by offset (`oversize`), so they are not read again."""

    def __init__(
        self,
        path: Path,
        offsets: np.ndarray,
        numbers: np.ndarray,
        max_line_bytes: int | None = None,
        oversize: dict[int, int] | None = None,
    ):
        self.path, self.offsets, self.numbers = path, offsets, numbers  # (N,) int64 each
        self.max_line_bytes, self.oversize = max_line_bytes, oversize or {}

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LineIndex(self.path, self.offsets[i], self.numbers[i], self.max_line_bytes, self.oversize)
        with open(self.path, "rb") as f:
            return self._read(f, int(self.offsets[i]), int(self.numbers[i]))

    def __iter__(self) -> Iterator[Line]:
        with open(self.path, "rb") as f:
            for offset, number in zip(self.offsets.tolist(), self.numbers.tolist()):
                yield self._read(f, offset, number)

    def _read(self, f: BinaryIO, offset: int, number: int) -> Line:
        limit = self.max_line_bytes
        if offset in self.oversize:
            return Line(self.path, number, b"", True, offset, oversize=self.oversize[offset], limit=limit)
        f.seek(offset)
        got = _next_line(f, limit)  # in pieces: a line that grew since it was indexed is not held either
        if got is None or got[3]:
            raise JsonlError(self.path, number, "the file changed since it was read: this line is gone")
        raw, size, terminated, _ = got
        return _line(self.path, number, offset, raw, size, terminated, limit)


def read_lines(path: str | Path, max_line_bytes: int | None = None) -> LineIndex:
    """The non-blank lines, unparsed (for callers that parse lazily), without a partial last line.
    `max_line_bytes`: longer lines are indexed but never held (see `lines`), and their parse says so."""
    path = Path(path)
    offsets, numbers, last = array("q"), array("q"), None  # 8 bytes an entry, not an int object
    oversize: dict[int, int] = {}
    for last in lines(path, max_line_bytes):
        offsets.append(last.offset)
        numbers.append(last.number)
        if last.oversize:
            oversize[last.offset] = last.oversize
    index = LineIndex(
        path, np.frombuffer(offsets, np.int64), np.frombuffer(numbers, np.int64), max_line_bytes, oversize
    )
    if last is not None and not last.terminated and not last.oversize:  # an oversized one is counted, not dropped
        try:
            last.parse()
        except JsonlError:
            index = index[:-1]  # a killed writer's last line
    return index


def records(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every JSON line; a killed writer's leftover is skipped, any other line
    that is not JSON raises JsonlError."""
    for line in lines(path):
        try:
            value = line.parse()
        except JsonlError:
            if not line.leftover():
                raise
            if line.terminated:  # an unterminated last line is normal while a writer runs; this is not
                log.warning("%s:%d: skipping a record cut short (a killed writer's leftover)", line.path, line.number)
            continue
        yield line.number, value


def read_jsonl(path: str | Path) -> list[Any]:
    """The values of every JSON line, as `records`."""
    return [value for _, value in records(path)]


class JsonlAppender:
    """Appends records to a JSON-lines file, one line each, flushed and fsynced as it is written, so a
    kill leaves at most the last line cut short. When the file ends in such a line, a newline comes
    first: the new record starts a line of its own (the leftover stays, and the reader skips it).
    `truncate` starts the file empty; `default` is json.dumps's, for values JSON does not know."""

    def __init__(self, path: str | Path, default: Callable[[Any], Any] | None = None, truncate: bool = False):
        self.path, self.default = Path(path), default
        with writes_to(self.path):
            self.f = open(self.path, "wb" if truncate else "a+b")
        if not truncate and self.f.seek(0, os.SEEK_END):
            self.f.seek(-1, os.SEEK_END)
            if self.f.read(1) != b"\n":
                self._write(b"\n")

    def _write(self, data: bytes) -> None:
        with writes_to(self.path):
            self.f.write(data)
            self.f.flush()
            os.fsync(self.f.fileno())  # a record's line is on disk before the caller counts it done

    def append(self, record: Any) -> None:
        # dumps escapes newlines in strings, so a record is always one line
        self._write((json.dumps(record, default=self.default) + "\n").encode())

    def close(self) -> None:
        with writes_to(self.path):
            self.f.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def append_jsonl(path: str | Path, record: Any, default: Callable[[Any], Any] | None = None) -> None:
    """Appends one record (see JsonlAppender)."""
    with JsonlAppender(path, default) as out:
        out.append(record)


# Whatever can follow a cut inside a value until the brackets close: nothing, a number's digit, a key's
# colon and value, a whole key and value (after a comma), the rest of true / false / null.
_FILLS = ("", "0", ":0", '"":0', "e", "ue", "rue", "se", "lse", "alse", "l", "ll", "ull")


def _cut_short(text: str) -> bool:
    """Whether `text` is a JSON object or array cut short: a proper prefix of one."""
    text = text.strip()
    if not text.startswith(("{", "[")):
        return False
    closers, in_string, escape, hex_left = [], False, False, 0
    for c in text:
        if in_string:
            if hex_left:
                hex_left -= 1
            elif escape:
                escape, hex_left = False, 4 if c == "u" else 0
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            closers.append("}" if c == "{" else "]")
        elif c in "}]":
            if not closers or closers.pop() != c or not closers:
                return False  # a mismatched bracket, or the value closed with text left: not a cut
    close_string = ("0" * hex_left + ("n" if escape else "") + '"') if in_string else ""
    tail = "".join(reversed(closers))
    for fill in _FILLS:
        try:
            json.loads(text + close_string + fill + tail)
            return True
        except json.JSONDecodeError:
            pass
    return False

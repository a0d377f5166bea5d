"""JSON lines: the one reader and appender of the project's .jsonl files (lwm-tokenize's manifests and
failures, video indexes, data sources, haystacks, evaluation records).

    for record in read_jsonl(path): ...          # the values, one per non-blank line
    for n, record in records(path): ...          # with their line numbers, for messages
    with JsonlAppender(path) as out:             # or append_jsonl(path, record) for one
        out.append(record)

A killed writer leaves at most its last line cut short. The reader skips such a leftover: a last
line without its newline that does not parse, or, where a later append has started a fresh line
after it, a line that is a JSON object or array cut short (a proper prefix of one). Any other line
that is not JSON is an error naming the file and line (JsonlError). Callers that record a bad line
as a failed item and go on (lwm/eval/video_qa.py) take the raw lines (`lines`) and parse each one.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)


class JsonlError(ValueError):
    """A line that is not JSON: `path:line: reason`."""

    def __init__(self, path: str | Path, line: int, reason: str):
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = Path(path), line, reason


@dataclass(frozen=True, slots=True)  # slots: a data source keeps one per line in memory
class Line:
    """One non-blank line of a JSON-lines file, not parsed yet."""

    path: Path
    number: int  # 1-based; blank lines count
    raw: bytes  # without its newline
    terminated: bool  # False only for a last line without a newline

    def parse(self) -> Any:
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


def lines(path: str | Path) -> Iterator[Line]:
    """The non-blank lines of a JSON-lines file, in order (split at "\\n" only, like the format)."""
    path = Path(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            terminated = raw.endswith(b"\n")
            raw = raw[:-1] if terminated else raw
            if raw.strip():
                yield Line(path, number, raw, terminated)


def read_lines(path: str | Path) -> list[Line]:
    """The non-blank lines, unparsed (for callers that parse lazily), without a partial last line."""
    found = list(lines(path))
    if found and not found[-1].terminated:
        try:
            found[-1].parse()
        except JsonlError:
            found.pop()  # a killed writer's last line
    return found


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
        self.f = open(self.path, "wb" if truncate else "a+b")
        if not truncate and self.f.seek(0, os.SEEK_END):
            self.f.seek(-1, os.SEEK_END)
            if self.f.read(1) != b"\n":
                self._write(b"\n")

    def _write(self, data: bytes) -> None:
        self.f.write(data)
        self.f.flush()
        os.fsync(self.f.fileno())  # a record's line is on disk before the caller counts it done

    def append(self, record: Any) -> None:
        # dumps escapes newlines in strings, so a record is always one line
        self._write((json.dumps(record, default=self.default) + "\n").encode())

    def close(self) -> None:
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


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file and a rename: a reader never sees half of it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


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

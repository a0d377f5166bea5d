"""What every reader of a source file shares: the error naming an example's place, and the reader of
examples that are byte spans of their file (tables, JSON arrays, webdataset shards)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np


class SourceError(ValueError):
    """An example that cannot be read: `where` names its file and line or row, `reason` says why."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


class SpanSource:
    """A source whose example i is the byte span (offsets[i], sizes[i]) of its file, found by one scan that
    holds no example (`_spans`, an index keeps what `places` gives): a span longer than max_line_bytes is
    never read; `_parse` makes the example of a span's bytes."""

    format = ""
    KEPT = ("offsets", "sizes")  # what places() gives and the constructor takes back

    def __init__(self, path: Path, max_line_bytes: int | None = None, places=None):
        self.path, self.max_line_bytes = path, max_line_bytes
        self.spans = None if places is None else {k: np.asarray(places[k]) for k in self.KEPT}  # (N,) int64 each

    def scan(self) -> None:
        if self.spans is None:
            self.spans = dict(zip(self.KEPT, self._spans()))

    def _spans(self) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def _parse(self, raw: bytes, i: int):
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.spans["offsets"])

    def _read(self, f, i: int):
        size, bound = int(self.spans["sizes"][i]), self.max_line_bytes
        if bound is not None and size > bound:
            raise SourceError(self.where(i), f"{size} bytes, longer than max_line_bytes {bound}: not read")
        f.seek(int(self.spans["offsets"][i]))
        raw = f.read(size)
        if len(raw) != size:
            raise SourceError(self.where(i), "the file changed since it was read: this example is gone")
        return self._parse(raw, i)

    def example(self, i: int):
        with open(self.path, "rb") as f:
            return self._read(f, i)

    def examples(self, start: int, stop: int) -> Iterator[tuple[int, object]]:
        with open(self.path, "rb") as f:
            for i in range(start, stop):
                try:
                    yield i, self._read(f, i)
                except SourceError as e:
                    yield i, e

    def places(self) -> dict[str, np.ndarray]:
        return dict(self.spans)

    @classmethod
    def from_places(cls, path: Path, max_line_bytes: int | None, places) -> "SpanSource":
        return cls(path, max_line_bytes, places)

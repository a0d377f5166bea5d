"""Zero-copy msgpack decoding: bin and ext payloads come back as memoryviews into the buffer.

msgpack's own decoder copies every bin and ext payload into a new bytes object. LWM's checkpoint
records hold whole parameter leaves (up to several GB) as nested payloads, so decoding one with it
costs several copies of the leaf; decoding over a view costs none. Only the types Flax's
serializer writes are needed, but every msgpack type is read.

The bytes come from files people download, so every declared length is checked against the bytes
that are there before anything is allocated or looped over, nesting is bounded, and a record read
in pieces is re-decoded at most a logarithmic number of times (each read at least doubles it).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

MAX_DEPTH = 32  # Flax writes 3 levels (a chunked leaf's map of ext arrays); deeper is not a checkpoint


class MsgpackError(ValueError):
    pass


class Truncated(IndexError):
    """The buffer ends inside an object that needs at least `need` bytes of it (from its start)."""

    def __init__(self, need: int, have: int):
        super().__init__(
            f"the object runs past the end of the buffer (it needs at least {need} bytes, {have} are there)"
        )
        self.need = need


@dataclass(frozen=True)
class Ext:
    code: int
    data: memoryview


_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_NUMBERS = {
    0xCA: ">f",
    0xCB: ">d",
    0xCC: ">B",
    0xCD: ">H",
    0xCE: ">I",
    0xCF: ">Q",
    0xD0: ">b",
    0xD1: ">h",
    0xD2: ">i",
    0xD3: ">q",
}
_BIN = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # bin 8/16/32 -> bytes of its length
_KEY_TYPES = (str, int, float, bool, bytes, type(None))


def _need(buf: memoryview, end: int) -> None:
    if end > len(buf):
        raise Truncated(end, len(buf))


def _length(buf: memoryview, i: int, size: int) -> tuple[int, int]:
    _need(buf, i + size)
    return int.from_bytes(buf[i : i + size], "big"), i + size


def _take(buf: memoryview, i: int, n: int) -> tuple[memoryview, int]:
    _need(buf, i + n)
    return buf[i : i + n], i + n


def _container(buf: memoryview, start: int, b: int, depth: int):
    if depth >= MAX_DEPTH:
        raise MsgpackError(f"objects nested deeper than {MAX_DEPTH} levels at offset {start}")
    is_map = b <= 0x8F or b in (0xDE, 0xDF)
    n, i = (b & 0x0F, start + 1) if b <= 0x9F else _length(buf, start + 1, 2 if b in (0xDC, 0xDE) else 4)
    count = 2 * n if is_map else n
    _need(buf, i + count)  # every element takes at least a byte: a huge count fails here, not after a loop
    items = []
    for _ in range(count):
        item, i = decode(buf, i, depth + 1)
        items.append(bytes(item) if is_map and isinstance(item, memoryview) else item)
    if not is_map:
        return items, i
    bad = [type(k).__name__ for k in items[::2] if not isinstance(k, _KEY_TYPES)]
    if bad:
        raise MsgpackError(f"the map at offset {start} has a key of type {bad[0]}; keys are strings or numbers")
    return dict(zip(items[::2], items[1::2])), i


def decode(buf: memoryview, i: int = 0, depth: int = 0):
    """(object, offset after it) of the msgpack object at buf[i]. Raises Truncated (an IndexError)
    when the buffer ends inside it, MsgpackError for bytes that are no msgpack object."""
    _need(buf, i + 1)
    start, b = i, buf[i]
    i += 1
    if b <= 0x7F:
        return b, i
    if b >= 0xE0:
        return b - 0x100, i
    if 0x80 <= b <= 0x9F or b in (0xDC, 0xDD, 0xDE, 0xDF):  # map or array
        return _container(buf, start, b, depth)
    if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):  # str
        n, i = (b & 0x1F, i) if b <= 0xBF else _length(buf, i, {0xD9: 1, 0xDA: 2, 0xDB: 4}[b])
        text, i = _take(buf, i, n)
        try:
            return bytes(text).decode("utf-8"), i
        except UnicodeDecodeError as e:
            raise MsgpackError(f"the string at offset {start} is not UTF-8 ({e})") from None
    if b in _FIXED:
        return _FIXED[b], i
    if b in _NUMBERS:
        _need(buf, i + struct.calcsize(_NUMBERS[b]))
        return struct.unpack_from(_NUMBERS[b], buf, i)[0], i + struct.calcsize(_NUMBERS[b])
    if b in _BIN:
        n, i = _length(buf, i, _BIN[b])
        return _take(buf, i, n)
    if b in (0xC7, 0xC8, 0xC9) or 0xD4 <= b <= 0xD8:  # ext, fixext
        n, i = _length(buf, i, {0xC7: 1, 0xC8: 2, 0xC9: 4}[b]) if b <= 0xC9 else (1 << (b - 0xD4), i)
        _need(buf, i + 1)
        code = struct.unpack_from(">b", buf, i)[0]
        data, i = _take(buf, i + 1, n)
        return Ext(code, data), i
    raise MsgpackError(f"byte 0x{b:02x} at offset {start} starts no msgpack object")


class RecordReader:
    """The `[key, bin]` records of a file, one at a time: the key decoded, the bin read straight
    from the file into a buffer of its own (returned as a writable memoryview). A bin is allocated
    only once the file is known to hold its bytes."""

    def __init__(self, f: BinaryIO, head: int = 1 << 16):
        self.f, self.head, self.pending = f, head, b""
        self.offset = f.tell()  # the file offset of pending[0]
        self.left = f.seek(0, os.SEEK_END) - self.offset  # bytes of the file not yet read
        f.seek(self.offset)

    def __iter__(self):
        return self

    def _read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise MsgpackError(f"the file changed while being read (byte {self.offset + len(self.pending)})")
        self.left -= n
        return data

    def _more(self, need: int) -> None:
        """Read until `pending` holds at least `need` bytes, and at least double it, so that a record
        decoded again after each read costs linear time in all."""
        if need - len(self.pending) > self.left:
            raise MsgpackError(
                f"the file ends inside the record at byte {self.offset}: it needs at least {need} bytes, "
                f"{len(self.pending) + self.left} are left"
            )
        want = min(self.left, max(need - len(self.pending), len(self.pending), self.head))
        self.pending += self._read(want)

    def _start(self, view: memoryview) -> tuple[object, object, int | None, int]:
        """(key, small value, None, offset after it) or (key, None, bin length, offset of the bin's
        bytes) for the record at view[0]."""
        if view[0] == 0x92:
            i = 1
        elif view[0] == 0xDC and _length(view, 1, 2)[0] == 2:
            i = 3
        else:
            raise MsgpackError(f"the record at byte {self.offset} starts with 0x{view[0]:02x}, not a 2-element array")
        key, i = decode(view, i)
        _need(view, i + 1)
        if view[i] not in _BIN:  # not a bin: a small object, decoded in place
            value, i = decode(view, i)
            return key, value, None, i
        n, i = _length(view, i + 1, _BIN[view[i]])
        return key, None, n, i

    def __next__(self) -> tuple[object, memoryview | object]:
        while True:  # the record's start (its key and the bin's header) must be in `pending`
            if not self.pending:
                if not self.left:
                    raise StopIteration
                self._more(1)
            try:
                key, value, n, i = self._start(memoryview(self.pending))
                break
            except Truncated as e:
                self._more(e.need)
        if n is None:
            self.pending, self.offset = self.pending[i:], self.offset + i
            return key, value
        have = min(n, len(self.pending) - i)
        if n - have > self.left:
            raise MsgpackError(
                f"the record at byte {self.offset} declares a {n}-byte value, but the file ends "
                f"{have + self.left} bytes after its start"
            )
        payload = bytearray(n)
        payload[:have] = self.pending[i : i + have]
        if have < n:
            if self.f.readinto(memoryview(payload)[have:]) != n - have:
                raise MsgpackError(f"the file changed while being read (the record at byte {self.offset})")
            self.left -= n - have
        self.pending, self.offset = self.pending[i + have :], self.offset + i + n
        return key, memoryview(payload)

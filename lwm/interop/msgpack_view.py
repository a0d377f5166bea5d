"""Zero-copy msgpack decoding: bin and ext payloads come back as memoryviews into the buffer.

msgpack's own decoder copies every bin and ext payload into a new bytes object. LWM's checkpoint
records hold whole parameter leaves (up to several GB) as nested payloads, so decoding one with it
costs several copies of the leaf; decoding over a view costs none. Only the types Flax's
serializer writes are needed, but every msgpack type is read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO


class MsgpackError(ValueError):
    pass


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
_LENGTH = {1: ">B", 2: ">H", 4: ">I"}


def _length(buf: memoryview, i: int, size: int) -> tuple[int, int]:
    return struct.unpack_from(_LENGTH[size], buf, i)[0], i + size


def _take(buf: memoryview, i: int, n: int) -> tuple[memoryview, int]:
    if i + n > len(buf):
        raise IndexError("the object runs past the end of the buffer")
    return buf[i : i + n], i + n


def decode(buf: memoryview, i: int = 0):
    """(object, offset after it) of the msgpack object at buf[i]. Raises IndexError when the buffer
    ends inside it, MsgpackError for a byte no msgpack object starts with."""
    b = buf[i]
    i += 1
    if b <= 0x7F:
        return b, i
    if b >= 0xE0:
        return b - 0x100, i
    if 0x80 <= b <= 0x9F or b in (0xDC, 0xDD, 0xDE, 0xDF):  # map or array
        is_map = b <= 0x8F or b in (0xDE, 0xDF)
        n, i = (b & 0x0F, i) if b <= 0x9F else _length(buf, i, 2 if b in (0xDC, 0xDE) else 4)
        items = []
        for _ in range(2 * n if is_map else n):
            item, i = decode(buf, i)
            items.append(item)
        return (dict(zip(items[::2], items[1::2])) if is_map else items), i
    if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):  # str
        n, i = (b & 0x1F, i) if b <= 0xBF else _length(buf, i, {0xD9: 1, 0xDA: 2, 0xDB: 4}[b])
        text, i = _take(buf, i, n)
        return bytes(text).decode("utf-8"), i
    if b in _FIXED:
        return _FIXED[b], i
    if b in _NUMBERS:
        return struct.unpack_from(_NUMBERS[b], buf, i)[0], i + struct.calcsize(_NUMBERS[b])
    if b in (0xC4, 0xC5, 0xC6):  # bin
        n, i = _length(buf, i, {0xC4: 1, 0xC5: 2, 0xC6: 4}[b])
        return _take(buf, i, n)
    if b in (0xC7, 0xC8, 0xC9) or 0xD4 <= b <= 0xD8:  # ext, fixext
        n, i = _length(buf, i, {0xC7: 1, 0xC8: 2, 0xC9: 4}[b]) if b <= 0xC9 else (1 << (b - 0xD4), i)
        code = struct.unpack_from(">b", buf, i)[0]
        data, i = _take(buf, i + 1, n)
        return Ext(code, data), i
    raise MsgpackError(f"byte 0x{b:02x} at offset {i - 1} starts no msgpack object")


class RecordReader:
    """The `[key, bin]` records of a file, one at a time: the key decoded, the bin read straight
    from the file into a buffer of its own (returned as a writable memoryview)."""

    def __init__(self, f: BinaryIO, head: int = 1 << 16):
        self.f, self.head, self.pending = f, head, b""

    def __iter__(self):
        return self

    def __next__(self) -> tuple[object, memoryview | object]:
        while True:  # the record's start (its key and the bin's header) must be in `pending`
            if not self.pending:
                self.pending = self.f.read(self.head)
                if not self.pending:
                    raise StopIteration
            view = memoryview(self.pending)
            try:
                if view[0] not in (0x92, 0xDC):
                    raise MsgpackError(f"a record starts with byte 0x{view[0]:02x}, not a 2-element array")
                i = 1 if view[0] == 0x92 else 3
                key, i = decode(view, i)
                kind = view[i]
                if kind not in (0xC4, 0xC5, 0xC6):  # not a bin: a small object, decoded in place
                    value, i = decode(view, i)
                    self.pending = self.pending[i:]
                    return key, value
                n, i = _length(view, i + 1, {0xC4: 1, 0xC5: 2, 0xC6: 4}[kind])
                break
            except (IndexError, struct.error):
                more = self.f.read(self.head)
                if not more:
                    raise MsgpackError("the file ends inside a record") from None
                self.pending += more
        payload = bytearray(n)
        have = min(n, len(self.pending) - i)
        payload[:have] = self.pending[i : i + have]
        rest = self.pending[i + have :]
        if have < n and self.f.readinto(memoryview(payload)[have:]) != n - have:
            raise MsgpackError("the file ends inside a record")
        self.pending = rest
        return key, memoryview(payload)

"""Webdataset tar shards (how LAION, COYO and DataComp ship image-text pairs) as a data source:

    shard-000000.tar:  000001.jpg 000001.txt 000001.json  000002.jpg 000002.txt ...

Consecutive members that share a key (the member's name up to the first dot of its file name) are one
sample: a record of {"__key__": key, <extension>: value}, a text member's value its UTF-8 text, a media
member's (an image, a video) the reference "<shard>::<member>" that lwm-tokenize reads it by (MEMBER_SEP), a
.json member's object also spread into the record (LAION's "caption" then names a column) where no member
has that name. The scan reads the members' headers only (member by member, skipping their bytes), so an
index keeps each sample's byte span and a sample is one seek; a header that does not parse (a corrupt or
cut-short shard) ends the scan, the rest of the file being one sample that is skipped naming it.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

from lwm.data.form import IMAGE_EXTENSIONS, MEDIA_EXTENSIONS
from lwm.data.spans import SourceError, SpanSource

TAR = (".tar",)
MEMBER_SEP = "::"  # "<shard path>::<member name>": a media member, as lwm-tokenize and the code store name it


def split_key(name: str) -> tuple[str, str]:
    """webdataset's rule: "dir/000001.seg.jpg" -> ("dir/000001", "seg.jpg")."""
    folder, _, base = name.rpartition("/")
    key, _, ext = base.partition(".")
    return (f"{folder}/{key}" if folder else key), ext


def member_ref(shard: str | Path, name: str) -> str:
    return f"{Path(shard).absolute()}{MEMBER_SEP}{name}"


def split_ref(ref: str) -> tuple[str, str] | None:
    """(the shard, the member) of a reference to a tar member; None for a plain path."""
    shard, sep, name = ref.partition(MEMBER_SEP)
    return (shard, name) if sep and shard.lower().endswith(TAR) else None


def read_member(ref: str) -> bytes:
    """The bytes of the tar member a reference names; FileNotFoundError naming it when it is not there."""
    shard, name = split_ref(ref)
    try:
        with tarfile.open(shard, "r:") as tar:
            member = tar.extractfile(name)
            if member is None:
                raise KeyError(name)
            return member.read()
    except (KeyError, tarfile.TarError, OSError) as e:
        raise FileNotFoundError(f"{ref}: no such member in the shard ({type(e).__name__}: {e})") from None


def image_members(shard: str | Path) -> tuple[list[str], str | None]:
    """(references to the shard's images, in order; what stopped the reading of its headers early, or None)."""
    names, problem = [], None
    try:
        with tarfile.open(shard, "r:") as tar:
            for m in tar:
                if m.isfile() and Path(m.name).suffix.lower() in IMAGE_EXTENSIONS:
                    names.append(m.name)
    except (tarfile.TarError, OSError) as e:
        problem = f"{shard}: its members after the {len(names)} images read cannot be read ({type(e).__name__}: {e})"
    return [member_ref(shard, name) for name in names], problem


def _zeros(f, start: int) -> bool:
    """Whether the file holds only zero bytes from start (a tar's end-of-archive blocks and padding)."""
    f.seek(start)
    while piece := f.read(1 << 16):
        if piece.count(0) != len(piece):
            return False
    return True


class TarSource(SpanSource):
    """A webdataset tar shard: sample i (its members) as example i (see the module's doc)."""

    format = "tar"
    KEPT = ("offsets", "sizes")

    def _spans(self) -> tuple[np.ndarray, ...]:
        spans: list[list[int]] = []  # [start, end] of each sample
        last = None
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            tar = tarfile.open(fileobj=f, mode="r:")
            while True:
                try:
                    member = tar.next()  # None at the end, and at a header that does not parse after the first
                except tarfile.TarError:  # one that does not parse where the file ends too soon
                    member = None
                if member is None:
                    break
                if not member.isfile():
                    continue
                end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                key = split_key(member.name)[0]
                if key == last:
                    spans[-1][1] = end
                else:
                    spans.append([member.offset, end])
                    last = key
            start = spans[-1][1] if spans else 0
            if start < size and not _zeros(f, start):  # not the end-of-archive blocks: one bad sample, named
                spans.append([start, size])
        starts = np.array([s for s, _ in spans], np.int64)
        ends = np.minimum(np.array([e for _, e in spans], np.int64), size)  # a cut-short shard: what is there
        return starts, ends - starts

    def where(self, i: int) -> str:
        return f"{self.path}:sample {i}"  # from 0, as parquet's rows

    def _parse(self, raw: bytes, i: int) -> dict:
        record, spread = {}, {}
        try:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    if member.offset_data + member.size > len(raw):
                        raise SourceError(
                            self.where(i), f"member {member.name} is cut short (the shard ends inside it)"
                        )
                    key, ext = split_key(member.name)
                    record.setdefault("__key__", key)
                    if Path(member.name).suffix.lower() in MEDIA_EXTENSIONS:
                        record[ext] = member_ref(self.path, member.name)
                        continue
                    text = tar.extractfile(member).read().decode("utf-8")
                    record[ext] = json.loads(text) if ext.lower() == "json" else text.strip()
                    if isinstance(record[ext], dict) and ext.lower() == "json":
                        spread.update(record[ext])
        except (tarfile.TarError, EOFError) as e:
            raise SourceError(self.where(i), f"a tar member that cannot be read ({type(e).__name__}: {e})") from None
        except UnicodeDecodeError as e:
            raise SourceError(self.where(i), f"a text member that is not UTF-8 ({e.reason})") from None
        except ValueError as e:
            raise SourceError(self.where(i), f"a .json member that is not JSON ({e})") from None
        if "__key__" not in record:
            raise SourceError(self.where(i), "holds no file member")
        return {**{k: v for k, v in spread.items() if k not in record}, **record}

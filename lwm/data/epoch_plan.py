"""Which pieces of which examples make each packed sequence of an epoch, from token counts alone.

The packing rule is lwm.data.packing's (examples placed whole and in order, one that does not fit
starting the next sequence; one packer per overflow policy; an example longer than a sequence dropped,
truncated or cut into windows). Run on the token counts of a source's index instead of on encoded
examples, it gives the same sequences without tokenizing anything, so a rank encodes only the examples
of its own sequences and a resumed run starts at its next sequence directly. A plan also knows, for each
sequence, how many examples of the epoch's order were read when it was complete and how many of those
were skipped: the stream state's counts (data/skipped) without reading the examples before it.

Planning is a loop over the epoch's examples (about a microsecond each), so a stream keeps each epoch's
plan in a file (EpochPlanFiles) that every later start, rank and loader worker maps instead of planning again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from filelock import FileLock

from lwm.data.packing import OVERFLOW, pieces
from lwm.disk.writes import atomic_file

log = logging.getLogger(__name__)

VERSION = 1
ARRAYS = ("src", "idx", "piece_pos", "piece_start", "piece_len", "seq_start", "read", "skipped")
STATS = ("sequences", "padding_tokens", "examples", "truncated", "windowed", "dropped_too_long")
EPOCHS_KEPT = 2  # plan files kept per stream: the epoch under way and the next


@dataclass
class EpochPlan:
    src: np.ndarray  # (M,) the source of each example of the order
    idx: np.ndarray  # (M,) its number in the source
    piece_pos: np.ndarray  # (P,) int64: the order position each piece comes from
    piece_start: np.ndarray  # (P,) int32: where in its example the piece starts
    piece_len: np.ndarray  # (P,) int32
    seq_start: np.ndarray  # (n + 1,) int64: sequence s is pieces [seq_start[s], seq_start[s + 1])
    read: np.ndarray  # (n,) int64: examples of the order read when sequence s was complete
    skipped: np.ndarray  # (n,) int64: how many of those were skipped
    stats: Counter  # the packers' counts: sequences, padding_tokens, examples, truncated, windowed, dropped_too_long
    total_skipped: int  # skipped examples in the whole order
    file: Path | None = None  # the file its arrays are mapped from, if it was read from one

    def __len__(self) -> int:
        return len(self.read)

    def sequence(self, s: int) -> list[tuple[int, int, int, int]]:
        """Sequence s as (source, example, start, length) pieces, in order."""
        a, b = int(self.seq_start[s]), int(self.seq_start[s + 1])
        pos = self.piece_pos[a:b]
        return list(
            zip(
                self.src[pos].tolist(),
                self.idx[pos].tolist(),
                self.piece_start[a:b].tolist(),
                self.piece_len[a:b].tolist(),
            )
        )


def plan_epoch(
    src: np.ndarray, idx: np.ndarray, lengths: list[np.ndarray], overflow: list[str], seq_len: int
) -> EpochPlan:
    """Pack the examples (src[k], idx[k]) in order, as packing.Packer does (one packer per overflow policy,
    flushed at the end in the order the policies first appear), from `lengths[source][example]` (negative:
    skipped) into sequences of seq_len + 1 tokens."""
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    bad = [p for p in overflow if p not in OVERFLOW]
    if bad:
        raise ValueError(f"overflow must be one of {OVERFLOW}, got {bad[0]!r}")
    length = seq_len + 1
    starts = np.concatenate([[0], np.cumsum([len(x) for x in lengths], dtype=np.int64)])
    flat = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    lens = flat[starts[src] + idx] if len(src) else np.zeros(0, np.int32)  # (M,) each example's tokens
    policy_of = np.asarray([OVERFLOW.index(p) for p in overflow], np.int64)[src] if len(src) else src
    piece_pos, piece_start, piece_len = array("q"), array("q"), array("q")
    seq_start, read, skipped = array("q", [0]), array("q"), array("q")
    stats: Counter = Counter()
    packers: dict[int, list] = {}  # policy -> [tokens used, [(pos, start, len), ...]], in order of first use
    nbad = 0

    def emit(packer: list, at: int) -> None:
        for pos, start, n in packer[1]:
            piece_pos.append(pos), piece_start.append(start), piece_len.append(n)
        seq_start.append(len(piece_pos)), read.append(at), skipped.append(nbad)
        stats["sequences"] += 1
        stats["padding_tokens"] += length - packer[0]
        packer[0], packer[1] = 0, []

    for k, (n, p) in enumerate(zip(lens.tolist(), policy_of.tolist())):
        if n < 0:
            nbad += 1
            continue
        packer = packers.setdefault(p, [0, []])
        stats["examples"] += 1
        cut, kind = pieces(n, length, OVERFLOW[p])
        if kind:
            stats[kind] += 1
        for start, size in cut:
            if packer[0] + size > length:
                emit(packer, k + 1)
            packer[1].append((k, start, size))
            packer[0] += size
            if packer[0] == length:
                emit(packer, k + 1)
    for packer in packers.values():
        if packer[1]:
            emit(packer, len(lens))
    as_np = lambda a: np.frombuffer(a, np.int64).copy() if len(a) else np.zeros(0, np.int64)  # noqa: E731
    return EpochPlan(
        src,
        idx,
        as_np(piece_pos),
        as_np(piece_start),
        as_np(piece_len),
        as_np(seq_start),
        as_np(read),
        as_np(skipped),
        stats,
        nbad,
    )


def write_plan(p: EpochPlan, path: Path) -> None:
    """Keep a plan as one int64 .npy file: its arrays' lengths, its stats and total_skipped, then the arrays."""
    parts = [np.asarray(getattr(p, name), np.int64) for name in ARRAYS]
    head = np.asarray([len(a) for a in parts] + [p.stats[k] for k in STATS] + [p.total_skipped], np.int64)
    with atomic_file(path) as f:
        np.save(f, np.concatenate([head, *parts]))


def read_plan(path: Path) -> EpochPlan:
    """A kept plan, its arrays mapped from the file (read as they are used); ValueError if it is damaged."""
    flat = np.load(path, mmap_mode="r", allow_pickle=False)
    first = len(ARRAYS) + len(STATS) + 1
    if flat.dtype != np.int64 or flat.ndim != 1 or len(flat) < first:
        raise ValueError(f"{path} is not a plan file")
    head = [int(x) for x in flat[:first]]
    sizes = head[: len(ARRAYS)]
    if min(sizes) < 0 or first + sum(sizes) != len(flat):
        raise ValueError(f"{path} holds {len(flat)} numbers, its header says {first + sum(sizes)}")
    ends = np.cumsum([first, *sizes])
    arrays = [flat[a:b] for a, b in zip(ends[:-1], ends[1:])]
    stats = Counter({k: v for k, v in zip(STATS, head[len(ARRAYS) : -1]) if v})
    return EpochPlan(*arrays, stats, head[-1], file=Path(path))


class EpochPlanFiles:
    """Where a stream keeps its epochs' plans: `<folder>/<name>.<key>.e<epoch>.lwm-plan.npy`, the key a hash
    of everything a plan depends on but the epoch (`identity`). A kept plan is read without a lock (it is
    written whole, then renamed); a missing one is made under a lock, so ranks starting together plan once.
    Writing epoch e's plan removes the stream's plans of epochs before e - 1. A folder that cannot be
    written to keeps nothing: each process plans in memory."""

    def __init__(self, folder: Path, name: str, identity: dict):
        key = hashlib.sha256(json.dumps({"version": VERSION, **identity}, sort_keys=True).encode()).hexdigest()[:16]
        self.folder, self.stem = Path(folder), f"{name}.{key}"
        self._told = False

    def path(self, epoch: int) -> Path:
        return self.folder / f"{self.stem}.e{epoch}.lwm-plan.npy"

    def get(self, epoch: int, make: Callable[[], EpochPlan]) -> EpochPlan:
        """Epoch `epoch`'s plan: read from its file, else made by `make` and kept."""
        kept = self._read(epoch)
        if kept is not None:
            return kept
        try:
            lock = FileLock(str(self.folder / f"{self.stem}.lwm-plan.lock"))
            lock.acquire()
        except OSError as e:
            if not self._told:
                log.info(
                    "cannot keep the data's plans in %s (%s): every process plans each epoch itself", self.folder, e
                )
                self._told = True
            return make()
        try:
            kept = self._read(epoch)  # another rank may have made it while this one waited
            if kept is not None:
                return kept
            made = make()
            write_plan(made, self.path(epoch))
            self._forget_before(epoch - EPOCHS_KEPT + 1)
            return made
        finally:
            lock.release()

    def _read(self, epoch: int) -> EpochPlan | None:
        path = self.path(epoch)
        if not path.is_file():
            return None
        try:
            return read_plan(path)
        except Exception as e:  # noqa: BLE001 (a damaged or partial file of any kind is planned again)
            log.warning("the data plan %s cannot be read (%s): planning the epoch again", path, e)
            return None

    def _forget_before(self, epoch: int) -> None:
        pattern = re.compile(re.escape(self.stem) + r"\.e(\d+)\.lwm-plan\.npy")
        for path in self.folder.glob(f"{self.stem}.e*.lwm-plan.npy"):
            m = pattern.fullmatch(path.name)
            if m and int(m.group(1)) < epoch:
                path.unlink(missing_ok=True)

"""A data source's index: each example's token count (or why it is skipped), and where it is in the file.

It is made once, by encoding every example, and kept beside the source (or in `data.index_dir`) as
`<source>.<key>.lwm-index.npz`; every later start of any run with the same encoding reads it instead of
the source. The key is a hash of what the token counts depend on (the tokenizer's bytes, the vocabulary,
the code store's manifests, frames and fps, the seed that picks among several field specs, the source's
default fields, max_line_bytes). The file records the source's size and modification time: an index
whose source changed since is remade, never trusted, and an unreadable index is remade too. Ranks that
start together make it once: the first takes a lock beside it, the others wait and read what it wrote.

A source of many examples is indexed by `workers` processes (PARALLEL_FROM examples or more), each
encoding a range of examples, with a progress bar. A skipped example (not JSON, a line over
max_line_bytes, an example that does not encode) is warned about once, naming its file and line or row,
when the index is made; the index keeps the reason, and a later start says how many there are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from lwm.data.example import Encoder, ExampleError
from lwm.data.form import Form
from lwm.data.sources import JsonlSource, ParquetSource, SourceError, open_source, source_format, source_kind
from lwm.disk.writes import atomic_file

log = logging.getLogger(__name__)

VERSION = 1
SKIPPED = -1  # the token count of an example that is skipped
PARALLEL_FROM = 20_000  # examples from which a source is indexed by several processes
CHUNK = 2_000  # examples one indexing task encodes


class IndexNotWritable(ValueError):
    """An index that cannot be kept where it should be: the message names the folder and data.index_dir."""


@dataclass
class SourceIndex:
    reader: JsonlSource | ParquetSource
    lengths: np.ndarray  # (N,) int32: each example's tokens, SKIPPED for one that is skipped
    reasons: dict[int, str]  # example -> "file:line: why" of each skipped one
    file: Path  # where the index is kept
    made: bool  # made by this call (False: read back)
    header: dict | None = None  # what it was made from: version, the source's size and mtime, the encoding

    def __len__(self) -> int:
        return len(self.lengths)


def example_key(path: str | Path, i: int) -> str:
    """The key of example i of a source for the seeded choice among field specs: the file's stem and the
    example's number, so the JSON-lines and parquet forms of a source choose alike."""
    return f"{Path(path).stem}:{i}"


def index_file(path: Path, signature: dict, index_dir: str | Path | None) -> Path:
    key = hashlib.sha256(json.dumps({"version": VERSION, **signature}, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(index_dir) if index_dir is not None else path.parent
    return folder / f"{path.name}.{key}.lwm-index.npz"


def source_index(
    path: str | Path,
    encoder: Encoder,
    fields=None,
    max_line_bytes: int | None = None,
    index_dir: str | Path | None = None,
    workers: int = 1,
) -> SourceIndex:
    """The index of the source at `path` for `encoder`, read when one is current, made (and kept) when not."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data source {path} does not exist")
    signature = {**encoder.signature(), **Form.of(fields).signature(), "max_line_bytes": max_line_bytes}
    if source_format(path) == "parquet":  # its rows are bounded by max_line_bytes since this key was added
        signature["rows_bounded"] = True
    if source_kind(path) == "array":  # its places are an array's, not lines'
        signature["layout"] = "array"
    file = index_file(path, signature, index_dir)
    stat = path.stat()
    header = {"version": VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "signature": signature}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(file) + ".lock")
        lock.acquire()
    except OSError as e:
        kept = _read(file, path, header, max_line_bytes)  # a read-only folder with a current index is fine
        if kept is not None:
            return _told(kept, path, header)
        raise IndexNotWritable(
            f"cannot keep the index of data source {path} in {file.parent} ({e}): name a writable folder "
            "in data.index_dir"
        ) from None
    try:
        kept = _read(file, path, header, max_line_bytes)
        if kept is not None:
            return _told(kept, path, header)
        made = _make(path, encoder, fields, max_line_bytes, workers, file)
        _write(file, header, made)
        made.header = header
        return made
    finally:
        lock.release()


def _told(kept: SourceIndex, path: Path, header: dict) -> SourceIndex:
    """A kept index, its skipped examples said once more (each was warned about when it was made)."""
    kept.header = header
    if kept.reasons:
        first = next(iter(kept.reasons.values()))
        log.warning(
            "data source %s: %d of its %d examples are skipped (its index %s found them); first: %s",
            *(path, len(kept.reasons), len(kept), kept.file.name, first),
        )
    return kept


def _read(file: Path, path: Path, header: dict, max_line_bytes) -> SourceIndex | None:
    """The kept index when it is current (same version, encoding and source size and time), else None."""
    if not file.is_file():
        return None
    try:
        with np.load(file, allow_pickle=False) as z:
            if json.loads(str(z["header"])) != json.loads(json.dumps(header)):
                log.info("data source %s changed since its index %s was made: making it again", path, file.name)
                return None
            places = {k[len("place_") :]: z[k] for k in z.files if k.startswith("place_")}
            lengths = z["lengths"]
            reasons = dict(zip(z["skipped"].tolist(), z["reasons"].tolist()))
    except Exception as e:  # noqa: BLE001 (a damaged or partial file of any kind is made again)
        log.warning("the index %s of data source %s cannot be read (%s): making it again", file, path, e)
        return None
    return SourceIndex(open_source(path, max_line_bytes, places), lengths, reasons, file, made=False)


def _write(file: Path, header: dict, index: SourceIndex) -> None:
    skipped = np.fromiter(index.reasons.keys(), np.int64, len(index.reasons))
    arrays = {f"place_{k}": v for k, v in index.reader.places().items()}
    with atomic_file(file) as f:
        np.savez(
            f,
            header=np.array(json.dumps(header)),
            lengths=index.lengths,
            skipped=skipped,
            reasons=np.array(list(index.reasons.values()), dtype=str),
            **arrays,
        )


_worker: tuple | None = None  # (reader, encoder, fields) in an indexing process


def _start_worker(path: Path, max_line_bytes, places, encoder: Encoder, fields) -> None:
    global _worker
    # Pool.terminate stops workers with SIGTERM, which train.py holds back in its children.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    _worker = (open_source(path, max_line_bytes, places), encoder, fields)


def _measure(span: tuple[int, int]) -> tuple[int, np.ndarray, list[tuple[int, str]]]:
    return _measure_with(*_worker, span)


def _measure_with(reader, encoder: Encoder, fields, span: tuple[int, int]):
    """Examples [start, stop) of a source -> (start, their token counts, [(example, "where: why")])."""
    start, stop = span
    lengths = np.empty(stop - start, np.int32)
    bad = []
    for i, example in reader.examples(start, stop):
        try:
            if isinstance(example, SourceError):
                raise example
            lengths[i - start] = len(encoder(example, fields, example_key(reader.path, i)))
        except (ExampleError, SourceError) as e:
            lengths[i - start] = SKIPPED
            bad.append((i, str(e) if isinstance(e, SourceError) else f"{reader.where(i)}: {e}"))
    return start, lengths, bad


def _make(path: Path, encoder: Encoder, fields, max_line_bytes, workers: int, file: Path) -> SourceIndex:
    reader = open_source(path, max_line_bytes)
    reader.scan()  # JSON lines: where each line starts (the one full read of the file)
    n = len(reader)
    spans = [(a, min(a + CHUNK, n)) for a in range(0, n, CHUNK)]
    lengths = np.empty(n, np.int32)
    reasons: dict[int, str] = {}
    bar = tqdm(total=n, desc=f"indexing {path.name}", unit=" examples", disable=None, leave=False)
    if workers > 1 and n >= PARALLEL_FROM:
        # spawn: the caller may hold CUDA or threads a fork would copy in a broken state
        context = multiprocessing.get_context("spawn")
        args = (path, max_line_bytes, reader.places(), encoder, fields)
        pool = context.Pool(min(workers, len(spans)), initializer=_start_worker, initargs=args)
        try:
            _gather(pool.imap(_measure, spans), lengths, reasons, bar)
            pool.close()  # the workers end by themselves once the tasks are done: no signal needed
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
    else:
        _gather((_measure_with(reader, encoder, fields, span) for span in spans), lengths, reasons, bar)
    bar.close()
    for why in reasons.values():
        log.warning("skipping example %s", why)
    log.info("indexed data source %s: %d examples, %d skipped -> %s", path, n, len(reasons), file)
    return SourceIndex(reader, lengths, reasons, file, made=True)


def _gather(results, lengths: np.ndarray, reasons: dict, bar) -> None:
    for start, part, bad in results:
        lengths[start : start + len(part)] = part
        reasons.update(bad)
        bar.update(len(part))

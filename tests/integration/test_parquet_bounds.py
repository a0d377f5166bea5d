"""Parquet sources are bounded like JSON lines: data.max_line_bytes bounds a row's cells and (16 times it)
a row group; a truncated or damaged parquet file is refused naming it, exit 2 before anything is written."""

from __future__ import annotations

import re
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from train_runs import composed, main_in_process

from lwm.data import DataConfig, PackedStream, Source

BOUND = 4096  # data.max_line_bytes of these tests


def text_rows(n: int, words: int = 3) -> list[dict]:
    return [{"text": " ".join(["the red circle"] * words) + f" {i}"} for i in range(n)]


def test_a_cell_over_max_line_bytes_is_skipped_never_decoded(tmp_path, tok, vocab):
    rows = text_rows(12)
    rows[5]["text"] = "x" * (4 * 2**20)  # 4 MiB in one cell, over a 1 MiB bound (its group, under 16 MiB, is read)
    path = tmp_path / "big_cell.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=6)
    tracemalloc.start()
    try:
        stream = PackedStream([Source(str(path), fields="text")], vocab, tok, 64, 1, max_line_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak  # the 4 MiB cell never became a Python string
    assert stream.skipped == 1 and int(stream.indexes[0].lengths[5]) < 0
    assert re.match(
        rf"{re.escape(str(path))}:row 5: a row of \d+ bytes, longer than max_line_bytes {2**20}", stream.errors[0]
    )
    assert all(int(n) > 0 for i, n in enumerate(stream.indexes[0].lengths) if i != 5)  # its neighbours train


def test_a_row_group_over_16_lines_is_skipped_unread(tmp_path, tok, vocab):
    small, wide = text_rows(10), text_rows(40, words=150)  # each wide row ~2 KB, under the bound; 40 of them ~80 KB
    path = tmp_path / "big_group.parquet"
    with pq.ParquetWriter(path, pa.Table.from_pylist(small).schema) as writer:
        writer.write_table(pa.Table.from_pylist(small))
        writer.write_table(pa.Table.from_pylist(wide))
    assert pq.ParquetFile(path).metadata.row_group(1).total_byte_size > 16 * BOUND
    stream = PackedStream(
        [Source(str(path), fields="text")], vocab, tok, 64, 1, max_line_bytes=BOUND, max_skipped_fraction=1
    )
    assert stream.skipped == 40 and (stream.indexes[0].lengths[:10] > 0).all()
    assert f"{path}:row 10: its row group 1 holds" in stream.errors[0] and "not read" in stream.errors[0]
    # the default bound (64 MiB a row, 1 GiB a group) reads it all
    assert PackedStream([Source(str(path), fields="text")], vocab, tok, 64, 1).skipped == 0


@pytest.mark.parametrize("damage", ["truncated", "not parquet"])
def test_a_damaged_parquet_file_is_refused_naming_it(tmp_path, damage):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(text_rows(50)), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"PAR1 not really")
    with pytest.raises(ValueError, match=rf"data source {re.escape(str(path))}: .* cannot be read as parquet"):
        DataConfig(sources=[Source(str(path), fields="text")])
    with pytest.raises(ValueError, match=rf"data\.sources\.docs: data source {re.escape(str(path))} cannot be read"):
        composed("model=debug", "schedule=debug", f"+data.sources.docs={{path: {path}, fields: text}}")


def test_train_refuses_a_truncated_parquet_source_with_exit_2(tmp_path, monkeypatch, capsys):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(text_rows(50)), path)
    path.write_bytes(path.read_bytes()[:-20])
    out = tmp_path / "run"
    code, _, err = main_in_process(monkeypatch, capsys, out, f"+data.sources.docs={{path: {path}, fields: text}}")
    assert code == 2 and f"data.sources.docs: data source {path} cannot be read as parquet" in err, err[-2000:]
    assert "Traceback" not in err and not out.exists()

"""lwm.io, the one JSON-lines reader and appender, and the readers that use it, on what a killed writer
leaves: a last line cut short, and that line closed by a later append."""

from __future__ import annotations

import errno
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from lwm.io import JsonlAppender, JsonlError, append_jsonl, lines, read_jsonl, read_lines, records
from lwm.paths import REPO

ROOT = REPO

RECORDS = [{"id": "a", "timestamps": [0.0, 0.5]}, {"id": "b", "text": 'caf\u00e9 "quoted"\nnew line'}]
CUT = '{"id": "c", "timestamps": [0.0, 0.'  # a record a kill cut short


def jsonl(path: Path, rows, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_partial_last_line_is_skipped(tmp_path):
    path = jsonl(tmp_path / "m.jsonl", RECORDS, CUT)
    assert read_jsonl(path) == RECORDS
    assert [n for n, _ in records(path)] == [1, 2]
    assert [line.number for line in read_lines(path)] == [1, 2]
    # An unterminated last line that is whole is a record like the others.
    path.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(RECORDS[1]))
    assert read_jsonl(path) == RECORDS and len(read_lines(path)) == 2


def test_bad_line_in_the_middle_names_file_and_line(tmp_path):
    path = jsonl(tmp_path / "m.jsonl", [RECORDS[0]], "\n{not json}\n" + json.dumps(RECORDS[1]) + "\n")
    with pytest.raises(JsonlError, match=r"m\.jsonl:3: not JSON") as e:
        read_jsonl(path)
    assert (e.value.path, e.value.line) == (path, 3) and isinstance(e.value, ValueError)
    # A bad last line is an error too when it has its newline: no kill leaves that ...
    jsonl(path, RECORDS, "}{\n")
    with pytest.raises(JsonlError, match=r"m\.jsonl:3"):
        read_jsonl(path)
    # ... and so is a line that is not UTF-8.
    path.write_bytes(b'{"id": "\xff"}\n' + json.dumps(RECORDS[0]).encode() + b"\n")
    with pytest.raises(JsonlError, match=r"m\.jsonl:1: not UTF-8"):
        read_jsonl(path)


def test_blank_lines_crlf_and_bom(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps(RECORDS[0]).encode() + b"\r\n\r\n  \n" + json.dumps(RECORDS[1]).encode() + b"\r\n"
    )
    assert [(n, r) for n, r in records(path)] == [(1, RECORDS[0]), (4, RECORDS[1])]
    assert [line.number for line in lines(path)] == [1, 4]


def test_append_after_a_partial_line_stays_parseable(tmp_path):
    path = jsonl(tmp_path / "m.jsonl", RECORDS, CUT)
    append_jsonl(path, {"id": "c", "timestamps": [0.0, 0.5]})
    text = path.read_text().split("\n")
    assert text[2] == CUT and json.loads(text[3])["id"] == "c" and text[4] == ""  # a fresh line; the leftover stays
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b", "c"]  # the leftover, now closed, is skipped
    # A whole unterminated last line gets its newline and is kept.
    path.write_text(json.dumps(RECORDS[0]))
    append_jsonl(path, RECORDS[1])
    assert read_jsonl(path) == RECORDS and path.read_text().count("\n") == 2


def test_appender(tmp_path):
    path = tmp_path / "r.jsonl"
    with JsonlAppender(path, default=str) as out:
        out.append({"path": Path("x/y")})
        assert path.read_text() == '{"path": "x/y"}\n'  # on disk as soon as it is appended
        out.append(RECORDS[1])
    assert read_jsonl(path) == [{"path": "x/y"}, RECORDS[1]]
    with JsonlAppender(path, truncate=True) as out:
        out.append(RECORDS[0])
    assert read_jsonl(path) == [RECORDS[0]]
    with pytest.raises(TypeError):  # a record JSON cannot hold writes nothing
        append_jsonl(path, {"x": object()})
    assert read_jsonl(path) == [RECORDS[0]]


def test_every_cut_of_a_record_is_a_leftover(tmp_path):
    """Wherever a kill cuts a line, the closed leftover is skipped; lines that are not cut records raise."""
    record = {
        "id": 'a\\b"c',
        "t": [0.0, -1.5e-05, 1e100],
        "ok": True,
        "no": False,
        "n": None,
        "u": "\u00e9\u4e2d",
        "nested": {"a": [[], {}, [1, {"b": "c"}]]},
        "e": "",
    }
    full = json.dumps(record)
    path = tmp_path / "m.jsonl"
    for k in range(1, len(full)):
        path.write_text(json.dumps(RECORDS[0]) + "\n" + full[:k] + "\n" + json.dumps(RECORDS[1]) + "\n")
        assert read_jsonl(path) == [RECORDS[0], RECORDS[1]], full[:k]
    for bad in [
        '{"a": 1,, "b": 2}',
        '{"a": 1}}',
        '{"a": 1} x',
        "not json",
        '{"a" 1',
        '{"a": tru e',
        "[1 2",
        '{"a": "x"]',
    ]:
        path.write_text(bad + "\n" + json.dumps(RECORDS[1]) + "\n")
        with pytest.raises(JsonlError, match=r"m\.jsonl:1"):
            read_jsonl(path)


def test_an_index_of_lines_costs_bytes_not_objects(tmp_path):
    """read_lines keeps byte offsets, not a Python object per line: 16 bytes a line (a list of Line took
    about 160 for these 30-byte lines, 5x the file), and reads a line from the file when asked."""
    n = 50_000
    path = jsonl(tmp_path / "big.jsonl", [{"text": f"a red circle {i}"} for i in range(n)], "\n  \n" + CUT)
    tracemalloc.start()
    try:
        index = read_lines(path)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert retained < 24 * n and peak < 48 * n, f"{retained / n:.0f} bytes a line retained, {peak / n:.0f} at peak"
    assert len(index) == n and index[n - 1].parse() == {"text": f"a red circle {n - 1}"}  # the cut line is not in it
    tail = index[-2:]  # a slice is an index too
    assert [line.number for line in tail] == [n - 1, n] and tail[0].parse() == {"text": f"a red circle {n - 2}"}


def test_a_line_over_the_limit_is_counted_never_held(tmp_path, monkeypatch):
    """read_lines(path, max_line_bytes): a longer line is indexed but never read whole (in READ_CHUNK
    pieces, dropped once over the limit), and its parse names file, line and size; a line of exactly
    the limit is read as usual, and so is everything after the long ones."""
    import lwm.io

    monkeypatch.setattr(lwm.io, "READ_CHUNK", 4096)
    limit = 64 * 2**10
    at_limit = json.dumps({"text": "a" * (limit - 12)})  # {"text": "..."}: 12 bytes around the text
    over, huge = at_limit[:-2] + 'a"}', json.dumps({"text": "b" * 4 * 2**20})  # limit + 1 bytes, 4 MiB
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join([at_limit, over, "", huge, json.dumps(RECORDS[0]), huge]))  # the last unterminated
    assert len(at_limit) == limit and len(over) == limit + 1
    tracemalloc.start()
    try:
        index = read_lines(path, limit)
        got = list(index) + [index[2], index[3]]  # one by one too
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * limit, f"{peak} bytes at peak for a {len(huge)}-byte line"  # the line is 64 limits long
    assert [line.number for line in got] == [1, 2, 4, 5, 6, 4, 5]
    sizes = [limit + 1, len(huge), len(huge), len(huge)]
    assert [line.oversize for line in got] == [0, limit + 1, len(huge), 0, len(huge), len(huge), 0]
    assert got[0].parse()["text"] == "a" * (limit - 12) and got[3].parse() == RECORDS[0]
    for line, size in zip([got[1], got[2], got[4], got[5]], sizes):
        message = rf"big\.jsonl:{line.number}: a line of {size} bytes, longer than max_line_bytes {limit}"
        with pytest.raises(JsonlError, match=message):
            line.parse()
    assert len(read_lines(path)) == 5 and list(read_lines(path))[1].parse()["text"] == "a" * (limit - 11)  # no limit


def test_a_full_disk_names_the_file_and_leaves_no_temp(tmp_path, monkeypatch):
    from lwm.disk.writes import NoSpaceLeft, write_atomic

    def fsync(fd, error=errno.ENOSPC):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(NoSpaceLeft, match=f"^no space left on {tmp_path / 'a.json'}$"):
        write_atomic(tmp_path / "a.json", "{}")
    assert list(tmp_path.iterdir()) == []  # no a.json.tmp
    with pytest.raises(NoSpaceLeft, match=f"^no space left on {tmp_path / 'm.jsonl'}$") as e:
        append_jsonl(tmp_path / "m.jsonl", RECORDS[0])
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    monkeypatch.setattr(os, "fsync", lambda fd: fsync(fd, errno.EDQUOT))
    with pytest.raises(NoSpaceLeft, match=r"m\.jsonl \(disk quota exceeded\)"):
        append_jsonl(tmp_path / "m.jsonl", RECORDS[0])
    monkeypatch.setattr(os, "fsync", lambda fd: fsync(fd, errno.EIO))
    with pytest.raises(OSError) as e:  # any other error is itself
        write_atomic(tmp_path / "a.json", "{}")
    assert not isinstance(e.value, NoSpaceLeft) and e.value.errno == errno.EIO


# ------------------------------------------------------------------------------------ the readers


def test_readers_on_a_partial_last_line(tmp_path):
    from lwm.vqgan_training.frames import read_index

    index = jsonl(tmp_path / "videos.jsonl", [{"path": "v/a.mp4"}, {"path": "v/b.mp4"}], '{"path": "v/c')
    assert read_index(index) == [tmp_path / "v/a.mp4", tmp_path / "v/b.mp4"]
    jsonl(index, [{"path": "v/a.mp4"}, ["v/b.mp4"]])
    with pytest.raises(ValueError, match=r"videos\.jsonl:2: a video record needs a 'path', got list"):
        read_index(index)

    from lwm.synth.needle_prompts import read_documents

    hay = jsonl(tmp_path / "hay.jsonl", [{"text": "One."}, {"text": "Two."}], '{"text": "Thr')
    assert list(read_documents(hay)) == ["One.", "Two."]
    jsonl(hay, [{"text": "One."}], "{oops\n")
    with pytest.raises(ValueError, match=r"hay\.jsonl line 2: expected a JSON object with a \"text\" field \(not JSON"):
        list(read_documents(hay))


def test_tokenize_output_dir_reads_and_appends_through_lwm_io(tmp_path):
    from lwm.video.tokenize import OutputDir

    out = OutputDir(tmp_path, (0, 1))
    codes = np.zeros((2, 256), np.uint16)
    out.write({"id": "a", "sampling": {}}, codes)
    out.manifest.write_text(out.manifest.read_text() + '{"id": "b", "sam')  # killed while appending b
    assert set(out.finished()) == {"a"}
    out.write({"id": "b", "sampling": {}}, codes)  # the resumed run
    assert set(out.finished()) == {"a", "b"}
    out.manifest.write_text(out.manifest.read_text() + "oops\n" + json.dumps({"id": "c"}) + "\n")
    with pytest.raises(JsonlError, match=r"manifest\.jsonl:4"):
        out.finished()


def test_video_qa_records_a_bad_last_line_and_goes_on(tmp_path):
    """video_qa keeps its behaviour: every bad line, the last one included, is an item recorded as malformed."""
    from lwm.eval.video_qa.files import read_items
    from lwm.eval.video_qa.report import RecordLog

    data = jsonl(
        tmp_path / "qa.jsonl", [{"video": "a.mp4", "question": "Q?", "answer": "A"}], '{"video": "b.mp4", "quest'
    )
    items = read_items(data)
    assert items[0].error is None
    assert (items[1].id, items[1].error_kind) == ("qa.jsonl:2", "malformed") and "line 2 is not JSON" in items[1].error

    log = RecordLog(tmp_path / "out" / "records.jsonl")
    log({"id": "x", "path": Path("p"), "score": np.float32(0.5)})
    log.close()
    assert read_jsonl(tmp_path / "out" / "records.jsonl") == [{"id": "x", "path": "p", "score": 0.5}]
    log = RecordLog(tmp_path / "out" / "records.jsonl")  # a new run starts the file again
    log.close()
    assert read_jsonl(tmp_path / "out" / "records.jsonl") == []

"""Caption tables as data sources (lwm.data.sources.TableSource): CSV and TSV files with a header row,
read as Python's csv module reads them, each row found by one scan and read by one seek, bad rows
skipped naming their line, a bad header refused before any work."""

from __future__ import annotations

import csv

import pytest

from lwm.data.sources import SourceError, check_readable, open_source

CELLS = [
    ["clip.mp4", 'a "quoted", caption'],
    ["two.mp4", "over\ntwo lines"],
    ["tab.mp4", "a\ttab and ünïcode"],
    ["empty.mp4", ""],  # an empty cell: a missing field
]


@pytest.mark.parametrize("kind,dialect,newline", [("csv", "excel", "\r\n"), ("tsv", "excel-tab", "\n")])
def test_rows_are_what_pythons_csv_module_reads(tmp_path, kind, dialect, newline):
    """Written by csv.writer (CRLF or LF, a UTF-8 BOM before the header, a blank line): each row as
    csv.DictReader gives it, empty cells left out, named by the line it starts on; an index's places
    give the same rows without a scan."""
    path = tmp_path / f"caps.{kind}"
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f, dialect=dialect, lineterminator=newline)
        writer.writerow(["video", "caption"])
        writer.writerows(CELLS[:2])
        f.write(newline)  # a blank line is no row
        writer.writerows(CELLS[2:])
    with open(path, newline="", encoding="utf-8-sig") as f:
        want = [{k: v for k, v in row.items() if v} for row in csv.DictReader(f, dialect=dialect)]
    reader = open_source(path)
    reader.scan()
    assert reader.format == "table" and reader.columns == ["video", "caption"]
    assert (
        [reader.example(i) for i in range(len(reader))]
        == want
        == [{"video": v, **({"caption": c} if c else {})} for v, c in CELLS]
    )
    assert [reader.where(i) for i in range(len(reader))] == [f"{path}:{n}" for n in (2, 3, 6, 7)]
    again = open_source(path, places=reader.places())
    assert [e for _, e in again.examples(0, len(again))] == want


def test_bad_rows_are_skipped_naming_their_line(tmp_path):
    """A row of the wrong width, one over max_line_bytes (never read), one not UTF-8, and a quote left
    open to the end of the file: each a SourceError naming file and line; the rows between are read."""
    path = tmp_path / "caps.csv"
    path.write_bytes(
        b"video,caption\n"
        b"a.mp4,fine\n"
        b"b.mp4,one,too many\n"
        b"c.mp4," + b"x" * 200 + b"\n"
        b"d.mp4,caf\xe9\n"
        b"e.mp4,also fine\n"
        b'f.mp4,"never closed\nstill open\n'
    )
    reader = open_source(path, max_line_bytes=100)
    reader.scan()
    got = dict(reader.examples(0, len(reader)))
    assert got[0] == {"video": "a.mp4", "caption": "fine"} and got[4] == {"video": "e.mp4", "caption": "also fine"}
    reasons = {i: str(e) for i, e in got.items() if isinstance(e, SourceError)}
    assert reasons == {
        1: f"{path}:3: has 3 cells; the header names 2 columns",
        2: f"{path}:4: a row of 207 bytes, longer than max_line_bytes 100: not read",
        3: f"{path}:5: not UTF-8 (invalid continuation byte at byte 9)",
        5: f"{path}:7: not a table row (unexpected end of data)",
    }


@pytest.mark.parametrize(
    "text,why",
    [("", "is empty"), ("video,video\na,b\n", "must name each column once"), ("video,\na,b\n", "name each column")],
)
def test_a_header_that_does_not_name_its_columns_is_refused(tmp_path, text, why):
    path = tmp_path / "caps.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"data source {path}.*{why}"):
        check_readable(path)
